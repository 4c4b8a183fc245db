"""Reading a spec file: JSON for a `.json` file, YAML otherwise. A syntax error becomes one line naming
the file, the line and the column and what was expected there (SpecFileError), never a parser's
traceback; so do a file that cannot be read and a document that is no mapping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


class SpecFileError(ValueError):
    """A spec file that is not a readable YAML or JSON mapping; the message is one line."""


def read_spec_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecFileError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise SpecFileError(f"{path}: is not UTF-8 text (byte {exc.start})") from None
    data = _json(path, text) if path.suffix.lower() == ".json" else _yaml(path, text)
    if not isinstance(data, dict):
        raise SpecFileError(f"{path}: a job spec must be a mapping of keys (name: ..., model: ...), "
                            f"got {'nothing' if data is None else type(data).__name__}")
    return data


def _json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        what = exc.msg[:1].lower() + exc.msg[1:]  # "Expecting ',' delimiter"
        raise SpecFileError(f"{path}, line {exc.lineno}, column {exc.colno}: invalid JSON: {what}") from None


def _yaml(path: Path, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        raise SpecFileError(_yaml_line(path, exc)) from None
    except yaml.YAMLError as exc:  # no position: still one line
        raise SpecFileError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None


def _yaml_line(path: Path, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    problem = exc.problem or "cannot be parsed"
    if "'\\t'" in problem:  # the scanner's "found character '\t' that cannot start any token"
        return f"{where}: invalid YAML: expected spaces, found a tab character (YAML takes no tabs here: use spaces)"
    what = problem
    if exc.context and exc.context_mark is not None and exc.context_mark is not mark:
        what += f" ({exc.context} at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
    if problem == "mapping values are not allowed here":  # `name: a: b`
        what += " (a value that holds ': ' needs quotes; or check the indentation)"
    if "<block" in problem:  # "expected <block end>, but found '<block mapping start>'": indentation
        what += "; check this line's indentation against the lines above"
    return f"{where}: invalid YAML: {what}"

"""A small Dockerfile reader: global ARG defaults and stages of (instruction, argument)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    base: str  # the FROM image, ARGs substituted
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args_of(self, keyword: str) -> list[str]:
        return [arg for kw, arg in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    path: Path
    args: dict[str, str]  # global ARGs (before the first FROM) with their defaults
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def _logical_lines(text: str) -> list[str]:
    """Instructions with backslash continuations joined, comments and blank lines dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current:
        lines.append(current)
    return lines


def parse(path: Path) -> Dockerfile:
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
            name = rest.split()[2] if " AS " in rest.upper() else None
            stages.append(Stage(base, name))
        elif not stages:
            assert keyword == "ARG", f"{path.name}: only ARG may precede FROM, got {keyword}"
            key, _, default = rest.partition("=")
            args[key] = default.strip('"')
        else:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(path, args, stages)

"""The README's quick start holds on a clean checkout, and every link in the project's own docs resolves.

The quick start's block is read from README.md itself: each `make` target it names exists, each
`trainyard` command it names is one the CLI has, each example spec it names passes `trainyard
validate`, and the places it sends the user (the results directory, the admin token, the port) are
where the code puts them. `trainyard run examples/gpt-ddp.yaml` itself is run, as written, by
tests/api/test_cli_run.py::test_run_shows_progress_and_summary (marker `slow`); `make demo` by
tests/api/test_demo.py (marker `exhaustive`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main

from api.cli.commands import app
from api.cli.local import results_location
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def quick_start_commands() -> list[list[str]]:
    """The commands of the first fenced block under `## Quick start`, comments and blank lines dropped."""
    text = README.read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\w*\n(.*?)```", section, re.S)
    assert block, "README.md: no fenced block under '## Quick start'"
    commands = []
    for line in block.group(1).splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands.append(shlex.split(line))
    return commands


def test_the_quick_start_is_short_and_in_order():
    commands = quick_start_commands()
    assert len(commands) <= 15, commands
    firsts = [" ".join(c[:2]) for c in commands]
    order = ["make demo", "trainyard run", "make serve", "trainyard submit", "trainyard get", "trainyard logs"]
    assert [f for f in firsts if f in order] == order, firsts


def test_every_make_target_in_the_quick_start_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", makefile, re.M)}
    for command in quick_start_commands():
        if command[0] == "make":
            assert command[1] in targets, f"README quick start: `make {command[1]}` is no Makefile target"


def test_every_trainyard_command_in_the_quick_start_exists():
    names = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    used = [c[1] for c in quick_start_commands() if c[0] == "trainyard"]
    assert used, "the quick start names no trainyard command"
    for name in used:
        assert name in names, f"README quick start: `trainyard {name}` is no CLI command ({sorted(names)})"


def test_every_spec_in_the_quick_start_validates(tmp_path):
    specs = sorted({arg for c in quick_start_commands() if c[0] == "trainyard" for arg in c[2:]
                    if arg.endswith((".yaml", ".yml", ".json"))})
    assert "examples/gpt-ddp.yaml" in specs
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env["TRAINYARD_HOME"] = str(tmp_path / "home")
    for spec in specs:
        out = subprocess.run([sys.executable, "-m", "api.cli", "validate", spec], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, (spec, out.stderr[-2000:])


def test_the_places_the_quick_start_names_are_where_the_code_puts_them(monkeypatch):
    """Results under ./.trainyard/storage/jobs/, the admin token in ./.trainyard/admin-token, port 8600."""
    for var in [v for v in os.environ if v.startswith("TRAINYARD_")]:
        monkeypatch.delenv(var)
    monkeypatch.chdir(ROOT)
    settings = Settings()
    readme = README.read_text()
    location = results_location(settings.job_storage("JOB"))
    assert location == "./.trainyard/storage/jobs/JOB/"
    assert "results: ./.trainyard/storage/jobs/<job-id>/" in readme
    assert "ls ./.trainyard/storage/jobs/" in readme
    assert settings.admin_token_file == ROOT / ".trainyard" / "admin-token"
    assert "./.trainyard/admin-token" in readme
    assert f"{settings.host}:{settings.port}" == "127.0.0.1:8600" and "127.0.0.1:8600" in readme


# --- links -------------------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def project_docs() -> list[Path]:
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    return docs + sorted((ROOT / "bench" / "notes").glob("*.md"))


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    anchors = set()
    for title in re.findall(r"^#+\s+(.*?)\s*$", text, re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("doc", project_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_a_file_in_the_repository_resolves(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # links, not code
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif not path.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif anchor and path.suffix == ".md" and anchor not in heading_anchors(path):
            broken.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_no_doc_points_outside_the_repository():
    for doc in project_docs():
        assert "../shared/" not in doc.read_text(), f"{doc.relative_to(ROOT)} points at ../shared/"


def test_every_setting_is_documented():
    """README promises every setting in docs/configuration.md: a new one without a line there fails here."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    missing = [name.upper() for name in Settings.model_fields if name.upper() not in text]
    assert not missing, f"docs/configuration.md names no {missing}"

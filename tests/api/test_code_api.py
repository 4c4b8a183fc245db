"""Shipping a program's code over real HTTP (scheduler paused, nothing trains), on SQLite and
PostgreSQL: POST /v1/code stores a zip by content hash under the storage root, refuses what it must
(413 over TRAINYARD_MAX_CODE_BYTES, 422 an unsafe or broken zip, 403 a tenant without
allow_user_code) and stores nothing then; a program's working_dir must be stored code or a confined
path; `trainyard submit` zips a local working_dir, uploads it and submits the reference."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.api.test_bad_input import _fails
from tests.db_fixtures import BACKENDS, make_db_url, row_counter
from tests.live import Server, drop_pg_schema

CODE_LIMIT = 300_000  # TRAINYARD_MAX_CODE_BYTES of this module's service
BODY_LIMIT = 20_000  # TRAINYARD_MAX_BODY_BYTES: smaller than the uploads below, which it must not refuse
ZIP = {"Content-Type": "application/zip"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=BACKENDS)
def code_server(request, tmp_path_factory, ray_address):
    home = tmp_path_factory.mktemp(f"code-{request.param}")
    url, schema = make_db_url(request.param, home)
    server = Server(home, url, ray_address, TRAINYARD_SCHEDULER_ENABLED="false", TRAINYARD_STANDBY_SUPERVISORS="0",
                    TRAINYARD_WARM_WORKERS="0", TRAINYARD_MAX_BODY_BYTES=str(BODY_LIMIT),
                    TRAINYARD_MAX_CODE_BYTES=str(CODE_LIMIT)).start()
    server.database_url = url
    yield server
    server.stop()
    if schema:
        drop_pg_schema(schema)


def new_tenant(server: Server, allow_user_code: bool) -> str:
    with server.client() as admin:
        resp = admin.post("/v1/tenants", json={"name": f"c-{uuid.uuid4().hex[:8]}", "allow_user_code": allow_user_code})
    assert resp.status_code == 201, resp.text
    return resp.json()["token"]


@pytest.fixture
def coder(code_server):
    """A client of a fresh tenant that may run user code."""
    with code_server.client(new_tenant(code_server, allow_user_code=True)) as client:
        yield client


@pytest.fixture
def counts(code_server):
    read, dispose = row_counter(code_server.database_url)
    yield read
    dispose()


def code_dir(server: Server) -> Path:
    return server.home / "storage" / "code"


def stored(server: Server) -> set[str]:
    """Every file in the code store, temporary ones included."""
    return {p.name for p in code_dir(server).iterdir()} if code_dir(server).is_dir() else set()


def make_zip(files: dict[str, bytes], symlinks: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for name, target in (symlinks or {}).items():
            info = zipfile.ZipInfo(name)
            info.create_system, info.external_attr = 3, (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return buf.getvalue()


def random_zip(size: int) -> bytes:
    """A valid zip of about `size` bytes (random content does not compress)."""
    return make_zip({"train.py": b"print('hello')\n", "blob.bin": os.urandom(size)})


def program_spec(working_dir: str | None, **program) -> dict:
    return {"name": "prog", "program": {"command": ["python", "train.py"], "working_dir": working_dir, **program},
            "resources": {"workers": 1}}


# --- POST /v1/code ------------------------------------------------------------

def test_an_upload_is_stored_under_the_storage_root_by_its_hash(code_server, coder):
    data = random_zip(60_000)  # over TRAINYARD_MAX_BODY_BYTES: the code route has its own limit
    assert len(data) > BODY_LIMIT
    resp = coder.post("/v1/code", content=data, headers=ZIP)
    assert resp.status_code == 201, resp.text
    sha = hashlib.sha256(data).hexdigest()
    assert resp.json() == {"ref": f"code:{sha}", "sha256": sha, "bytes": len(data), "created": True}
    path = code_dir(code_server) / f"{sha}.zip"
    assert path.read_bytes() == data
    assert not [n for n in stored(code_server) if not n.endswith(".zip")], "a temporary file was left behind"


def test_the_same_zip_twice_is_the_same_ref_and_one_file(code_server, coder):
    data = random_zip(5_000)
    first = coder.post("/v1/code", content=data, headers=ZIP)
    before = stored(code_server)
    again = coder.post("/v1/code", content=data, headers=ZIP)
    assert (first.status_code, again.status_code) == (201, 200), again.text
    assert again.json()["ref"] == first.json()["ref"] and again.json()["created"] is False
    assert stored(code_server) == before


def test_an_upload_is_audited_with_its_ref(code_server, coder):
    ref = coder.post("/v1/code", content=random_zip(100), headers=ZIP).json()["ref"]
    with code_server.client() as admin:
        entries = admin.get("/v1/audit", params={"action": "code.upload"}).json()["records"]
    assert any(e["target"] == ref and e["status"] == 201 for e in entries), entries


def test_over_the_code_limit_is_413_naming_the_limit_and_stores_nothing(code_server, coder):
    before = stored(code_server)
    big = random_zip(CODE_LIMIT + 1_000)
    _fails(coder.post("/v1/code", content=big, headers=ZIP), 413, "TRAINYARD_MAX_CODE_BYTES", str(CODE_LIMIT))

    def chunks():  # no Content-Length: refused as the body passes the limit
        for start in range(0, len(big), 16_384):
            yield big[start:start + 16_384]

    _fails(coder.post("/v1/code", content=chunks(), headers=ZIP), 413, "TRAINYARD_MAX_CODE_BYTES", str(CODE_LIMIT))
    assert stored(code_server) == before


@pytest.mark.parametrize("case, body, needles", [
    ("not a zip", b"PK\x03\x04 but then nothing a zip needs", ["body", "must be a zip archive"]),
    ("empty", b"", ["body", "must be a zip archive"]),
    ("truncated", random_zip(2_000)[:-40], ["body", "must be a zip archive"]),
    ("zip slip", make_zip({"ok.py": b"", "../../evil.py": b"x"}), ["'../../evil.py'", "'..' is refused"]),
    ("nested zip slip", make_zip({"pkg/../../evil.py": b"x"}), ["'..' is refused"]),
    ("absolute path", make_zip({"/etc/cron.d/evil": b"x"}), ["'/etc/cron.d/evil'", "absolute paths are refused"]),
    ("symlink", make_zip({"a.py": b""}, symlinks={"link": "/etc/passwd"}), ["'link'", "symlinks are refused"]),
])
def test_a_bad_or_unsafe_zip_is_422_naming_the_rule_and_stores_nothing(code_server, coder, case, body, needles):
    before = stored(code_server)
    _fails(coder.post("/v1/code", content=body, headers=ZIP), 422, *needles)
    assert stored(code_server) == before


def test_a_body_not_sent_as_a_zip_is_415(code_server, coder):
    _fails(coder.post("/v1/code", json={"not": "a zip"}), 415, "content-type", "application/zip")
    _fails(coder.post("/v1/code", content=random_zip(10)), 415, "content-type")


def test_a_tenant_without_user_code_gets_403_for_an_upload_and_a_program(code_server, coder, counts):
    ref = coder.post("/v1/code", content=random_zip(1_000), headers=ZIP).json()["ref"]  # stored by another tenant
    before_files, before_rows = stored(code_server), counts()
    with code_server.client(new_tenant(code_server, allow_user_code=False)) as plain:
        body = _fails(plain.post("/v1/code", content=random_zip(1_000), headers=ZIP), 403,
                      "may not upload user code", "allow_user_code is false")
        assert body["errors"][0]["field"] == "body"
        body = _fails(plain.post("/v1/jobs", json=program_spec(ref)), 403, "may not run user code",
                      "allow_user_code is false")
        assert body["errors"][0]["field"] == "program"
        _fails(plain.post("/v1/jobs", json=program_spec(None, command=None, function="pkg.mod:train")), 403,
               "program: tenant")
    assert stored(code_server) == before_files
    assert counts()["jobs"] == before_rows["jobs"]


# --- a program's working_dir at submit ------------------------------------------

def test_a_program_with_an_unknown_or_malformed_ref_is_422_and_writes_no_job(code_server, coder, counts):
    before = counts()["jobs"]
    body = _fails(coder.post("/v1/jobs", json=program_spec("code:" + "0" * 64)), 422,
                  "program.working_dir", "is not uploaded code")
    assert body["errors"][0]["field"] == "program.working_dir"
    _fails(coder.post("/v1/jobs", json=program_spec("code:not-a-hash")), 422, "program.working_dir",
           "is not a code reference")
    assert counts()["jobs"] == before


def test_a_program_with_a_stored_ref_is_queued_with_it(code_server, coder):
    ref = coder.post("/v1/code", content=random_zip(1_000), headers=ZIP).json()["ref"]
    resp = coder.post("/v1/jobs", json=program_spec(ref))
    assert resp.status_code == 201, resp.text
    job = coder.get(f"/v1/jobs/{resp.json()['id']}").json()
    assert job["state"] == "QUEUED" and job["spec"]["program"]["working_dir"] == ref


def test_a_program_working_dir_path_is_confined_to_the_storage_root(code_server, coder, counts):
    before = counts()["jobs"]
    _fails(coder.post("/v1/jobs", json=program_spec("../../etc")), 422, "program.working_dir", "'..'")
    _fails(coder.post("/v1/jobs", json=program_spec("/etc")), 422, "program.working_dir", "under the storage root")
    assert counts()["jobs"] == before
    resp = coder.post("/v1/jobs", json=program_spec("shared/my-code"))
    assert resp.status_code == 201, resp.text
    root = (code_server.home / "storage").resolve()
    assert resp.json()["spec"]["program"]["working_dir"] == str(root / "shared" / "my-code")


# --- trainyard submit -----------------------------------------------------------

def cli(server: Server, token: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    full |= {"TRAINYARD_HOME": str(server.home / "cli"), "TRAINYARD_URL": server.url, "TRAINYARD_TOKEN": token,
             "COLUMNS": "200", **env}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], env=full, capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def write_project(root: Path) -> Path:
    """A spec file and, beside it, the program's code with the files the zip leaves out."""
    src = root / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / ".git").mkdir()
    (src / "train.py").write_text("import pkg\nprint('training')\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    (src / "pkg" / "stale.pyc").write_bytes(b"\0")
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    spec = root / "job.yaml"
    spec.write_text(yaml.safe_dump(program_spec("src")))
    return spec


@pytest.mark.parametrize("code_server", ["sqlite"], indirect=True)  # the CLI does not see the database
def test_cli_submit_uploads_a_local_working_dir_and_submits_its_ref(code_server, tmp_path):
    token = new_tenant(code_server, allow_user_code=True)
    spec = write_project(tmp_path)
    out = cli(code_server, token, "submit", str(spec), "--json")  # run from the repository, not the spec's directory
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    ref = job["spec"]["program"]["working_dir"]
    assert ref.startswith("code:") and "uploaded" in out.stderr
    zipped = code_dir(code_server) / f"{ref.removeprefix('code:')}.zip"
    with zipfile.ZipFile(zipped) as zf:
        assert zf.namelist() == ["pkg/__init__.py", "train.py"]
    again = cli(code_server, token, "submit", str(spec), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["spec"]["program"]["working_dir"] == ref  # the same zip: the same ref
    assert "already uploaded" in again.stderr


@pytest.mark.parametrize("code_server", ["sqlite"], indirect=True)
def test_cli_submit_refuses_a_working_dir_over_the_limit_before_uploading(code_server, tmp_path, counts):
    token = new_tenant(code_server, allow_user_code=True)
    spec = write_project(tmp_path)
    (tmp_path / "src" / "data.bin").write_bytes(os.urandom(5_000))
    before_files, before_jobs = stored(code_server), counts()["jobs"]
    out = cli(code_server, token, "submit", str(spec), TRAINYARD_MAX_CODE_BYTES="2000")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "TRAINYARD_MAX_CODE_BYTES" in out.stderr and "2000" in out.stderr
    assert stored(code_server) == before_files and counts()["jobs"] == before_jobs
    missing = tmp_path / "missing.yaml"
    missing.write_text(yaml.safe_dump(program_spec("no-such-dir")))
    out = cli(code_server, token, "submit", str(missing))
    assert out.returncode == 2 and "is not a directory" in out.stderr

"""`make demo`: start the service with embedded defaults, submit the examples over REST,
follow them live, print a summary table and stop the service.

Two extra jobs show fault tolerance (the demo's own service allows fault injection): gpt-ddp
with a rank crash injected at step 30, and gpt-ddp with rank 1 made 3x slower from step 10,
which the supervisor rebalances live (policy `rebalance`). `examples/torchrun-script/` is an
unmodified torchrun script run as a program (its code uploaded with POST /v1/code first).
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml
from rich.console import Console

from api.cli.client import ApiFailure, Client
from api.cli.code_upload import local_working_dir, upload, with_working_dir
from api.cli.demo_table import summary_table
from api.cli.follow import follow_jobs
from service.process_tree import descendants, wait_gone
from service.settings import get_settings

ROOT = Path(__file__).resolve().parents[2]  # the repository (api/cli/demo.py)
console = Console()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _pick_port() -> int:
    port = int(os.environ.get("TRAINYARD_PORT", "8600"))
    if _port_free(port):
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(home: Path, port: int) -> tuple[subprocess.Popen, Path]:
    home.mkdir(parents=True, exist_ok=True)
    log = home / "demo-serve.log"
    env = {**os.environ, "TRAINYARD_HOME": str(home), "TRAINYARD_PORT": str(port), "TRAINYARD_HOST": "127.0.0.1",
           "TRAINYARD_ALLOW_FAULT_INJECTION": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "serve"], env=env, cwd=ROOT,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    with console.status(f"starting the service on {url} (SQLite + a local Ray under {home})"):
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the service exited ({proc.returncode}); see {log}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    return proc, log
            except httpx.TransportError:
                pass
            time.sleep(0.5)
    raise SystemExit(f"the service was not ready in 180 s; see {log}")


def stop_service(proc: subprocess.Popen) -> None:
    """SIGTERM (the service stops its local Ray and waits for it), then wait for every process the
    service started, so that nothing of the demo runs once it returns, even if the service had to
    be killed."""
    tree = descendants(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    wait_gone(tree, 30)


def demo_specs() -> list[dict]:
    """Every example: `examples/*.yaml`, and `examples/*/spec.yaml` with its program's working_dir
    made absolute (it is uploaded at submit, as `trainyard submit` does)."""
    specs = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "examples").glob("*.yaml"))]
    for path in sorted((ROOT / "examples").glob("*/spec.yaml")):
        data = yaml.safe_load(path.read_text())
        local = local_working_dir(data, path.parent)
        specs.append(with_working_dir(data, str(local)) if local is not None else data)
    gpt = next((s for s in specs if s.get("name") == "gpt-ddp"), None)
    if gpt is not None:
        crash = copy.deepcopy(gpt)
        crash["name"] = "gpt-ddp-crash"
        crash["fault_injection"] = [{"at_step": min(30, crash["train"]["steps"]), "rank": 1, "kind": "crash"}]
        slow = copy.deepcopy(gpt)
        slow["name"] = "gpt-ddp-straggler"
        slow["supervisor"] = {"straggler": {"policy": "rebalance", "window": 5}}
        slow["fault_injection"] = [{"at_step": min(10, slow["train"]["steps"]), "rank": 1, "kind": "slow",
                                    "factor": 3.0}]
        specs += [crash, slow]
    return specs


def straggler_story(client: Client, jobs: list[dict]) -> list[str]:
    """What the supervisor saw and did about slow ranks, one line per event, per job."""
    kinds = ("straggler", "rebalance", "straggler_recovered")
    return [f"{j['name']}: {e['message']}" for j in jobs
            for e in client.events(j["id"]) if e["kind"] in kinds]


def main() -> int:
    home = Path(os.environ.get("TRAINYARD_HOME", ROOT / ".trainyard")).resolve()
    os.environ["TRAINYARD_HOME"] = str(home)
    port = _pick_port()
    proc, log = start_service(home, port)
    try:
        token = (home / "admin-token").read_text().strip()
        client = Client(url=f"http://127.0.0.1:{port}", token=token)
        console.print(f"[green]service ready[/green] at {client.url} (log: {log})")
        # The web console while the demo runs (the token is in the URL fragment, never sent to the server).
        console.print(f"web console: {client.url}/ui#token={token}")
        ids = []
        for spec in demo_specs():
            if (local := local_working_dir(spec, ROOT)) is not None:  # a program: ship its code first
                spec = with_working_dir(spec, upload(client, local, get_settings().max_code_bytes)["ref"])
            job = client.submit(spec)
            ids.append(job["id"])
            console.print(f"POST /v1/jobs {spec['name']:<16} -> 201 {job['id']} {job['state']}")
        final = follow_jobs(client, ids, console, timeout_s=480)
        console.print(summary_table([final[i] for i in ids], console.width))
        for line in straggler_story(client, [final[i] for i in ids]):
            console.print(line)
        console.print(f"Try: TRAINYARD_HOME={home} trainyard events {ids[-1]}   (while `make serve` runs)")
        return 0 if all(final[i]["state"] == "SUCCEEDED" for i in ids) else 1
    except ApiFailure as exc:
        console.print(f"[red]error {exc.status}:[/red] {exc.message}")
        return 1
    finally:
        with console.status("stopping the service"):
            stop_service(proc)


if __name__ == "__main__":
    sys.exit(main())

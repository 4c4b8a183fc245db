"""One unmodified torchrun script (examples/torchrun-script/train.py), run four ways, one table.

    .venv/bin/python bench/programs.py [--steps 400 --reps 2 --sleep 0.02] [--quick]

1. torchrun:        `python -m torch.distributed.run --nproc-per-node 2 train.py ...`
2. trainyard run:   `trainyard run spec.yaml --json`, a spec with `program.command` (2 workers)
2b. trainyard service: the same spec POSTed to a running `trainyard serve` on the same Ray head
                    (started at its first run, kept for the others, as the head is), once its warm
                    worker pool and standby supervisor are ready: a service's steady state
3. Ray Train:       a driver (bench/raytrain_program.py) whose TorchTrainer (2 workers) calls the
                    script's own main() in each worker: Ray Train forms a process group first, and
                    the script forms its own, so the loop agrees a fresh port over Ray Train's
                    group, closes it, and main() runs unchanged from the torchrun variables Ray
                    Train set (RANK, WORLD_SIZE, MASTER_ADDR, ...); details in that file
4. Ray Jobs:        `python -m torch.distributed.run --nproc-per-node 2 train.py ...` submitted to the head's
                    job server by the REST call `ray job submit` makes (JobSubmissionClient.submit_job,
                    from this process, so that its clock starts as trainyard service's: at the call)

Every run is the same script with the same arguments (`--steps N --sleep S --batch B --log-rate`);
`--log-rate` only adds a line `rate STEP SAMPLES_PER_S UNIX_TIME` on rank 0 after each step (the
losses are unchanged). Runs are interleaved (rep 1 of each, then rep 2, the order rotated) and
each figure is the median over --reps.

What the columns measure:
- steady samples/s: wall clock from rank 0's own step timestamps, global batch x steps / elapsed
  over the steps after the first 20% (warm-up): everything between two steps counts (the
  runner's per-step work, e.g. trainyard.report over the rank's socket, and the script's own
  checkpoint every 10 steps), which is why the steps are kept short (--sleep, ~25 ms).
- first step s: from just before the bench starts the launcher process (the torchrun, trainyard
  run or Ray Train driver command), or makes the submitting REST call (trainyard service, Ray
  Jobs), to rank 0's timestamp of its first finished step, both time.time() on this host. It
  includes each launcher's interpreter start and imports, spawning the ranks and torch's import
  in them (Ray Train's workers import it before the loop, and main() then runs in them), the
  process group and step 1. It excludes Ray's start for all four Ray runners: one Ray head (`ray
  start --head`, with the dashboard for Ray Jobs, its own ports and temp dir) is started once
  before any run and used by trainyard (TRAINYARD_RAY_ADDRESS), Ray Train (RAY_ADDRESS) and Ray
  Jobs alike; torchrun needs no Ray. The services (trainyard's, Ray's job server) are already
  running. Under the table: Ray Train from its fit() call (the driver prints when it calls it),
  and trainyard's phases (the CLI's "Connected to Ray cluster" log line, the supervisor log's
  "state RUNNING" once the rank actors are up, then the first step). Once per rep, a Ray driver's
  floor: a new Python's `import ray; ray.init(address)` on the running head, the least any launcher
  that is a Ray driver (trainyard run, Ray Train's driver) spends before its ranks exist.

This machine is shared: before each run the bench waits (at most --quiet-wait-s) for the CPUs to
be mostly idle, and it prints the mean number of runnable tasks during each run (a 2-rank run alone
shows about 2-3; more means other work shared the CPUs) and the load average.

Every wait is bounded (--run-timeout-s per run, --budget-s for the whole bench); each launcher
runs in its own process group, killed when it ends or times out; the Ray head is always stopped
with its whole process group (never `ray stop`, which would stop every Ray on the machine).
Needs Ray's dashboard for Ray Jobs (`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.api_load import RAY_ENV, RayHead, _until, _wait_warm  # noqa: E402
from bench.ddp_overhead import RunnableSampler, wait_for_quiet  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402
from tests.live import Server, free_port  # noqa: E402

SCRIPT_DIR = ROOT / "examples" / "torchrun-script"
SCRIPT = SCRIPT_DIR / "train.py"
STEADY_SKIP = 0.2  # the first 20% of steps are warm-up, left out of throughput
WORLD = 2
RATE = re.compile(r"^rate (\d+) (\S+) (\S+)$", re.M)
WARM_POOL = 4  # the service's default warm_workers (service/settings.py)
RUNNERS = ("torchrun", "trainyard run", "trainyard service", "Ray Train", "Ray Jobs")


def script_args(args) -> list[str]:
    return ["--steps", str(args.steps), "--sleep", str(args.sleep), "--batch", str(args.batch), "--log-rate"]


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "RAY_ADDRESS"))}
    env.update(RAY_ENV, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore::FutureWarning",
               PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p))
    return env


def launch(cmd: list[str], log: Path, timeout_s: float, cwd: Path, **env: str) -> tuple[float, int]:
    """Run cmd in its own process group (stdout and stderr to log); (time.time() at its start, exit code).
    Whatever it leaves in its group (torchrun's ranks) is killed when it exits or runs past timeout_s."""
    with open(log, "w") as out:
        t0 = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, env={**base_env(), **env}, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{shlex.join(cmd[:4])} ... ran past {timeout_s:.0f} s; log:\n{_tail(log)}") from None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return t0, rc


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def rates(text: str, steps: int, where: str) -> list[tuple[int, float, float]]:
    """Rank 0's `rate` lines: (step, reported samples/s, unix time), exactly steps 1..N in order."""
    found = [(int(s), float(r), float(t)) for s, r, t in RATE.findall(text)]
    if [s for s, _, _ in found] != list(range(1, steps + 1)):
        raise RuntimeError(f"{where}: expected rate lines for steps 1..{steps}, got {len(found)} "
                           f"(steps {[s for s, _, _ in found][:5]}...)")
    return found


# --- the four runners: each returns {"t0": launch time, "rates": rank 0's rate lines} -----------------


def ray_driver_floor(work: Path, head: RayHead) -> float:
    """Seconds from starting a new Python to `import ray; ray.init(address)` returning on the running
    head: no launcher that is a Ray driver (trainyard run, Ray Train's) reaches its first step sooner."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "driver.log"
    t0, rc = launch([sys.executable, "-c", "import time, ray; ray.init(); print('connected', time.time())"],
                    log, 120, work, RAY_ADDRESS=head.address)
    found = re.search(r"^connected (\d+\.\d+)$", log.read_text(), re.M)
    if rc != 0 or found is None:
        raise RuntimeError(f"a Ray driver could not connect (exit {rc}):\n{_tail(log)}")
    return float(found.group(1)) - t0


def run_torchrun(work: Path, args, head: RayHead) -> dict:
    work.mkdir(parents=True)  # cwd: the script's ./checkpoints, fresh (it resumes from one it finds)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT), *script_args(args)]
    t0, rc = launch(cmd, work / "out.log", args.run_timeout_s, work)
    if rc:
        raise RuntimeError(f"torchrun exited {rc}:\n{_tail(work / 'out.log')}")
    return {"t0": t0, "rates": rates((work / "out.log").read_text(), args.steps, "torchrun")}


def run_trainyard(work: Path, args, head: RayHead) -> dict:
    work.mkdir(parents=True)
    spec = {"name": "bench-programs",
            "program": {"command": ["python", "train.py", *script_args(args)], "working_dir": str(SCRIPT_DIR)},
            "resources": {"workers": WORLD, "cpus_per_worker": 1},
            "checkpoint": {"keep": 2},
            "fault_tolerance": {"max_restarts": 0}}  # a failure fails the run, it is not retried unseen
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "api.cli", "run", str(work / "spec.yaml"), "--json"]
    t0, rc = launch(cmd, work / "out.log", args.run_timeout_s, work,
                    TRAINYARD_HOME=str(work / "home"), TRAINYARD_RAY_ADDRESS=head.address)
    lines = [line for line in (work / "out.log").read_text().splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    if rc or summary.get("state") != "SUCCEEDED":
        raise RuntimeError(f"trainyard run exited {rc} ({summary.get('state')}: {summary.get('error')}):\n"
                           f"{_tail(work / 'out.log')}")
    logs = work / "home" / "storage" / "jobs" / summary["job_id"] / "logs"
    found = rates((logs / "rank-0.log").read_text(), args.steps, f"trainyard run ({logs})")
    # Where its time to the first step goes: the CLI until it is connected to the running Ray, the
    # rank actors until the job is RUNNING, then the ranks' programs until step 1 is done.
    phases = {"connected": _log_time(work / "out.log", "Connected to Ray cluster"),
              "running": _log_time(logs / "supervisor.log", "state RUNNING")}
    return {"t0": t0, "rates": found, **{f"{k}_s": v - t0 for k, v in phases.items() if v is not None}}


class RunningService:
    """One `trainyard serve` on the bench's Ray head, started at its first run and kept for the others."""

    def __init__(self) -> None:
        self.server: Server | None = None

    def get(self, home: Path, head: RayHead) -> Server:
        if self.server is None:
            self.server = Server(home, f"sqlite:///{home}/trainyard.db", head.address, **RAY_ENV).start(timeout=180)
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


SERVICE = RunningService()


def run_trainyard_service(work: Path, args, head: RayHead) -> dict:
    work.mkdir(parents=True)
    server = SERVICE.get(work.parent / "service", head)
    code = server.home / "storage" / "code-src" / work.name  # a path under the storage root a tenant may name
    shutil.copytree(SCRIPT_DIR, code, ignore=shutil.ignore_patterns("__pycache__", "checkpoints"))
    spec = {"name": "bench-programs-service",
            "program": {"command": ["python", "train.py", *script_args(args)], "working_dir": str(code)},
            "resources": {"workers": WORLD, "cpus_per_worker": 1}, "checkpoint": {"keep": 2},
            "fault_tolerance": {"max_restarts": 0}}
    with server.client() as c:
        # The service's steady state: its whole warm pool and a standby supervisor ready, its refills done.
        _wait_warm(head.address, busy={j["supervisor"] for j in c.get("/v1/jobs").json()["jobs"]},
                   workers=WARM_POOL)
        wait_for_quiet(args.quiet_wait_s)
        t0 = time.time()
        r = c.post("/v1/jobs", json=spec)
        if r.status_code != 201:
            raise RuntimeError(f"POST /v1/jobs answered {r.status_code}: {r.text[:500]}")
        job_id = r.json()["id"]
        job = _until(lambda: (j := c.get(f"/v1/jobs/{job_id}").json())["state"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                     and j, args.run_timeout_s, "the service's job end", poll_s=0.5)
    logs = server.home / "storage" / "jobs" / job_id / "logs"
    if job["state"] != "SUCCEEDED":
        raise RuntimeError(f"the service's job ended {job['state']}: {job.get('error')}")
    rank0 = (logs / "rank-0.log").read_text()
    running = _log_time(logs / "supervisor.log", "state RUNNING")
    return {"t0": t0, "rates": rates(rank0, args.steps, f"trainyard service ({logs})"),
            "prestarted": "pre-started Python" in rank0, **({"running_s": running - t0} if running else {})}


def _log_time(path: Path, text: str) -> float | None:
    """The unix time of the first line of a Python log (`2026-01-01 12:00:00,123 ...`) that contains text."""
    import datetime

    for line in path.read_text(errors="replace").splitlines():
        if text in line:
            try:
                return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                return None
    return None


def run_raytrain(work: Path, args, head: RayHead) -> dict:
    (work / "cwd").mkdir(parents=True)
    cmd = [sys.executable, str(ROOT / "bench" / "raytrain_program.py"), "--script", str(SCRIPT),
           "--workdir", str(work / "cwd"), "--out", str(work), "--storage", str(work / "storage"),
           "--", *script_args(args)]
    t0, rc = launch(cmd, work / "driver.log", args.run_timeout_s, work, RAY_ADDRESS=head.address)
    if rc:
        raise RuntimeError(f"the Ray Train driver exited {rc}:\n{_tail(work / 'driver.log')}")
    fit = re.search(r"^fit_called (\S+)$", (work / "driver.log").read_text(), re.M)
    found = rates((work / "rank-0.out").read_text(), args.steps, "Ray Train")
    return {"t0": t0, "rates": found, **({"fit_to_first_step_s": found[0][2] - float(fit.group(1))} if fit else {})}


def run_ray_jobs(work: Path, args, head: RayHead) -> dict:
    from ray.job_submission import JobStatus, JobSubmissionClient

    (work / "cwd").mkdir(parents=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-addr",
                "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT), *script_args(args)]
    # `ray job submit -- A B` runs shlex.join([A, B]) in a shell: the cd needs a shell of its own.
    entrypoint = ["sh", "-c", f"cd {shlex.quote(str(work / 'cwd'))} && exec {shlex.join(torchrun)}"]
    # The job's environment as the other runners get theirs (this checkout on the path, 1 thread).
    runtime_env = {"env_vars": {k: base_env()[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS")}}
    submission_id = f"programs-{uuid.uuid4().hex[:8]}"
    client = JobSubmissionClient(head.dashboard)  # connected before the clock starts, as the service's client
    for _ in range(10):  # the head's job agent may not have registered yet on a busy host
        t0 = time.time()
        try:  # the REST call `ray job submit` makes, from this process: the same start as trainyard service's POST
            client.submit_job(entrypoint=shlex.join(entrypoint), runtime_env=runtime_env, submission_id=submission_id)
            break
        except RuntimeError as exc:
            if "No available agent" not in str(exc):
                raise
            time.sleep(5)
    else:
        raise RuntimeError("the Ray head's job agent did not register")
    try:
        status = _until(lambda: (s := client.get_job_status(submission_id)) not in
                        (JobStatus.PENDING, JobStatus.RUNNING) and s, args.run_timeout_s, "the Ray Jobs run's end",
                        poll_s=0.5)
    finally:
        if client.get_job_status(submission_id) in (JobStatus.PENDING, JobStatus.RUNNING):
            client.stop_job(submission_id)
    logs = client.get_job_logs(submission_id)
    (work / "job.log").write_text(logs)
    if status != JobStatus.SUCCEEDED:
        raise RuntimeError(f"the Ray Jobs run ended {status}:\n{logs[-3000:]}")
    return {"t0": t0, "rates": rates(logs, args.steps, "Ray Jobs")}


RUN = {"torchrun": run_torchrun, "trainyard run": run_trainyard, "trainyard service": run_trainyard_service,
       "Ray Train": run_raytrain, "Ray Jobs": run_ray_jobs}


def measure(run: dict, batch: int) -> dict:
    found = run.pop("rates")
    ts = [t for _, _, t in found]
    k0 = max(1, int(len(ts) * STEADY_SKIP))
    return {"sps": WORLD * batch * (len(ts) - k0) / (ts[-1] - ts[k0 - 1]),
            # the median time between two steps: the least moved by other work on a shared host
            "median_step_ms": 1000 * statistics.median(b - a for a, b in zip(ts[k0 - 1:], ts[k0:])),
            # the median time outside the script's own timed section (batch, forward, backward, step,
            # sleep): its trainyard.report and should_stop calls, the stop all-reduce, the prints
            "outside_ms": 1000 * statistics.median(b - a - WORLD * batch / r
                                                   for a, (_, r, b) in zip(ts[k0 - 1:], found[k0:])),
            # the script's own in-step figure (what it reports): compute and sleep only
            "reported_sps": statistics.fmean(r for _, r, _ in found[k0:]),
            "first_step_s": ts[0] - run.pop("t0"), **run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.02, help="the script's --sleep: seconds of work per step")
    parser.add_argument("--batch", type=int, default=16, help="the script's --batch (per rank)")
    parser.add_argument("--quick", action="store_true", help="150 steps, 1 rep (unless given)")
    parser.add_argument("--only", default="", help="only runners whose name contains this (torchrun always runs)")
    parser.add_argument("--run-timeout-s", type=float, default=300, help="bound on each run")
    parser.add_argument("--budget-s", type=int, default=1200, help="the whole bench; then clean up and exit")
    parser.add_argument("--quiet-wait-s", type=float, default=20,
                        help="before each run, wait up to this long for the CPUs to be mostly idle")
    parser.add_argument("--keep", action="store_true", help="keep the runs' logs and directories")
    args = parser.parse_args()
    if args.quick:
        args.steps = 150 if "--steps" not in sys.argv else args.steps
        args.reps = 1 if "--reps" not in sys.argv else args.reps
    runners = [r for r in RUNNERS if r == "torchrun" or args.only.lower() in r.lower()]

    def out_of_time(*_):
        raise TimeoutError(f"the benchmark ran past --budget-s {args.budget_s}")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the Ray head
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(args.budget_s)
    os.environ.update(RAY_ENV)
    work = Path(tempfile.mkdtemp(prefix="ty-bench-programs-"))
    results: dict[str, list[dict]] = {r: [] for r in runners}
    failures: dict[str, str] = {}
    floors: list[float] = []  # a bare Ray driver's start, once per rep
    started, load_before = time.time(), os.getloadavg()[0]
    try:
        with RayHead() as head:
            try:
                print(f"Ray head {head.address} up in {time.time() - started:.1f} s; {args.steps} steps x "
                      f"{args.reps} reps per runner; work in {work}", flush=True)
                for rep in range(args.reps):
                    order = runners[rep % len(runners):] + runners[:rep % len(runners)]
                    for name in order:
                        if name in failures:
                            continue
                        tag = f"{name.replace(' ', '-').lower()}-{rep + 1}"
                        wait_for_quiet(args.quiet_wait_s)
                        try:
                            with RunnableSampler() as sampler:
                                run = RUN[name](work / tag, args, head)
                            r = {**measure(run, args.batch), "runnable": sampler.mean}
                        except Exception as exc:  # the others still run; the reason goes under the table
                            failures[name] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
                            print(f"  {tag}: FAILED {failures[name][:300]}", flush=True)
                            continue
                        results[name].append(r)
                        print(f"  {tag}: {r['sps']:.0f} samples/s, first step {r['first_step_s']:.2f} s, "
                              f"{r['runnable']:.1f} runnable tasks on average", flush=True)
                    wait_for_quiet(args.quiet_wait_s)
                    floors.append(ray_driver_floor(work / f"ray-driver-{rep + 1}", head))
            finally:
                SERVICE.stop()  # before the head it runs on
    finally:
        signal.alarm(0)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(args, runners, results, failures, floors, time.time() - started, (load_before, os.getloadavg()[0]))


def report(args, runners: list[str], results: dict[str, list[dict]], failures: dict[str, str], floors: list[float],
           wall_s: float, load: tuple[float, float]) -> None:
    med = {name: {k: statistics.median(r[k] for r in runs) for k in ("sps", "first_step_s")}
           for name, runs in results.items() if runs}

    def ratio(name: str, key: str, base: str) -> float | None:
        return med[name][key] / med[base][key] if name in med and base in med else None

    def fmt(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    print(f"\n{args.steps} steps of {args.sleep * 1000:.0f} ms sleep + a {WORLD}x{args.batch} batch, 2 ranks on gloo "
          f"(CPU); median of {args.reps} rep(s); steady = after the first {STEADY_SKIP:.0%} of steps\n")
    head = ("runner", "steady samples/s", "vs torchrun", "first step s", "vs Ray Train", "vs Ray Jobs")
    body = [[name, fmt(med.get(name, {}).get("sps"), ".0f"), fmt(ratio(name, "sps", "torchrun"), ".3f"),
             fmt(med.get(name, {}).get("first_step_s"), ".2f"), fmt(ratio(name, "first_step_s", "Ray Train"), ".3f"),
             fmt(ratio(name, "first_step_s", "Ray Jobs"), ".3f")] for name in runners]
    print_markdown_table(head, body)
    print()
    for name in runners:
        runs = results[name]
        print(f"{name}: samples/s {[round(r['sps']) for r in runs]}, median step ms "
              f"{[round(r['median_step_ms'], 2) for r in runs]} (outside the timed section "
              f"{[round(r['outside_ms'], 2) for r in runs]}), in-step (as reported) "
              f"{[round(r['reported_sps']) for r in runs]}, first step s "
              f"{[round(r['first_step_s'], 2) for r in runs]}, mean runnable tasks "
              f"{[round(r['runnable'], 1) for r in runs]}")
    from_fit = [round(r["fit_to_first_step_s"], 2) for r in results.get("Ray Train", []) if "fit_to_first_step_s" in r]
    if from_fit:
        print(f"Ray Train from its fit() call (the driver's imports and Ray connection left out): "
              f"first step s {from_fit}")
    phases = [(r["connected_s"], r["running_s"], r["first_step_s"]) for r in results.get("trainyard run", [])
              if "connected_s" in r and "running_s" in r]
    if phases:
        print("trainyard run, seconds from launch: connected to Ray / job RUNNING (rank actors up) / first step: "
              + ", ".join(f"{c:.1f} / {u:.1f} / {f:.1f}" for c, u, f in phases))
    service = [(r.get("running_s"), r["first_step_s"], r["prestarted"]) for r in results.get("trainyard service", [])]
    if service:
        print("trainyard service, seconds from the POST: job RUNNING (rank actors up) / first step, and whether the "
              "ranks ran in their pre-started Python: " + ", ".join(
                  f"{u if u is None else round(u, 2)} / {f:.2f} ({'pre-started' if p else 'new process'})"
                  for u, f, p in service))
    if floors:
        floor = statistics.median(floors)
        print(f"a Ray driver's floor (a new Python's `import ray; ray.init(address)` on the running head), s: "
              f"{[round(f, 2) for f in floors]}, median {floor:.2f}: "
              + ", ".join(f"{floor / med[b]['first_step_s']:.3f} of {b}'s first step" for b in ("Ray Train", "Ray Jobs")
                          if b in med))
    for name, why in failures.items():
        print(f"{name} FAILED: {why}")
    print(f"bench wall time {wall_s:.0f} s; host load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} "
          f"at the end, on {os.cpu_count()} CPUs\n")

    def target(what: str, value: float | None, ok) -> None:
        verdict = "not measured" if value is None else ("met" if ok(value) else "not met")
        print(f"target {what}: {verdict}" + ("" if value is None else f" ({value:.3f})"))

    target("trainyard run steady samples/s >= 0.99 x torchrun's", ratio("trainyard run", "sps", "torchrun"),
           lambda v: v >= 0.99)
    for runner in ("trainyard run", "trainyard service"):
        for base in ("Ray Train", "Ray Jobs"):
            target(f"{runner} first step < 0.1 x {base}'s", ratio(runner, "first_step_s", base), lambda v: v < 0.1)


if __name__ == "__main__":
    main()

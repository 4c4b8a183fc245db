"""The device check of issue 21: Trainyard's worker side on one GPU, without Ray or the control plane.

    python bench/device_check.py              # on a CUDA machine (make device-check)
    python bench/device_check.py --dry-run    # anywhere: build and validate every configuration, then
                                              # train each for 2 steps on the CPU (gloo, world size 1)

It runs from the source tree (no `pip install` of the project). The trainer and the strategies
run in one process per rank (workers/runtime/local_ranks.py, torch.multiprocessing). JobSpec
needs pydantic; where it is missing, the wheels in bench/wheels/ (`make device-wheels`, cp312
x86_64; kept out of git) are unpacked into bench/.wheels/ and put on sys.path.

What it prints, one row per job: the strategy the registry selected, SUCCEEDED or FAILED, the
final loss, the fp32 loss of the same job on the CPU and their difference (GPU runs, target
1e-3), collective-rule violations (workers/parallel/collective_audit.py), and the crash-restart
pair's params_sha256 against its fault-free twin, how long an async DCP save blocks the loop
against a synchronous one (bench/device_checkpoint.py), and a 350M Llama's tokens/s and MFU under
Trainyard against a plain PyTorch loop of the same model (bench/device_throughput.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _use_bundled_wheels() -> None:
    try:
        import pydantic  # noqa: F401
        return
    except ImportError:
        pass
    target = ROOT / "bench" / ".wheels"
    for wheel in sorted((ROOT / "bench" / "wheels").glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)  # a wheel is a zip of what site-packages would hold
    sys.path.insert(0, str(target))


sys.path.insert(0, str(ROOT))
_use_bundled_wheels()

import torch  # noqa: E402

from bench.device_cases import build, matrix, restart_pair  # noqa: E402
from bench.device_checkpoint import checkpoint_row  # noqa: E402
from bench.device_throughput import throughput_row  # noqa: E402
from workers.parallel.layouts import strategy_name  # noqa: E402
from workers.runtime.local_ranks import run_jobs  # noqa: E402


def rows(specs, results, reference=None) -> list[list[str]]:
    table = []
    for name, spec in specs:
        r = results[name][0]
        loss = r.get("losses", [None])[-1] if r.get("losses") else None
        ref = (reference or {}).get(name, [{}])[0]
        ref_loss = ref.get("losses", [None])[-1] if ref.get("losses") else None
        diff = abs(loss - ref_loss) if loss is not None and ref_loss is not None else None
        table.append([name, strategy_name(spec), r.get("state", "?"), _f(loss), _f(ref_loss), _f(diff),
                      str(len(r.get("violations", []))), (r.get("error") or "")[:60]])
    return table


def _f(x) -> str:
    return "-" if x is None else f"{x:.6f}"


def show(header: list[str], table: list[list[str]]) -> None:
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def restart_check(steps: int, gpu: bool, device: str, workdir: str) -> list[str]:
    (twin_name, twin), (crash_name, crash) = build(restart_pair(steps, gpu))
    twin_run = run_jobs([(twin_name, twin)], 1, workdir, device)[twin_name][0]
    crashed = run_jobs([(crash_name, crash)], 1, workdir, device)[crash_name][0]  # exits at the fault
    resumed = run_jobs([(crash_name, crash)], 1, workdir, device)[crash_name][0]  # from its last checkpoint
    same = twin_run.get("params_sha256") is not None and twin_run.get("params_sha256") == resumed.get("params_sha256")
    return [f"crash-restart: first run {crashed.get('state')} ({crashed.get('error', '')}), resumed "
            f"{resumed.get('state')}, params_sha256 {'==' if same else '!='} fault-free twin "
            f"({str(twin_run.get('params_sha256'))[:12]} vs {str(resumed.get('params_sha256'))[:12]})", str(same)]


PARTS = ("throughput", "checkpoint", "matrix", "restart")


def matrix_check(steps: int, gpu: bool, device: str, workdir: str) -> list[str]:
    """The strategy table (printed); the names of the jobs that failed or broke the collective rule.
    On a GPU the fp32 jobs' CPU twins train at the same time, on the host's cores."""
    specs = build(matrix(steps, gpu))
    reference: dict = {}
    cpu_run = None
    if gpu:  # the same fp32 jobs on the CPU: the GPU's loss must match within 1e-3
        cpu_specs = build([(n, {**d, "resources": {**d["resources"], "gpus_per_worker": 0}})
                           for n, d in matrix(steps, False) if n.endswith("fp32")])
        cpu_run = threading.Thread(target=lambda: reference.update(
            run_jobs(cpu_specs, 1, str(Path(workdir) / "cpu"), "cpu", timeout_s=1800)))
        cpu_run.start()
    results = run_jobs(specs, 1, str(Path(workdir) / device), device, audit=True, timeout_s=1800)
    if cpu_run is not None:
        cpu_run.join()
    show(["job", "strategy", "state", "loss", "cpu loss", "|diff|", "rule violations", "error"],
         rows(specs, results, reference if gpu else None))
    for name, _ in specs:
        if results[name][0].get("trace"):
            print(f"--- {name}\n{results[name][0]['trace']}", flush=True)
    return [n for n, _ in specs if results[n][0].get("state") != "SUCCEEDED" or results[n][0].get("violations")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="validate every configuration, 2 CPU steps each")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, run in this order (default: all of {', '.join(PARTS)})")
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    gpu = torch.cuda.is_available() and not args.dry_run
    if not gpu and not args.dry_run:
        raise SystemExit("no CUDA device: run with --dry-run (CPU) or on a GPU machine")
    steps = 2 if args.dry_run else args.steps
    device = "cuda" if gpu else "cpu"
    workdir = args.workdir or tempfile.mkdtemp(prefix="device-check-")
    started = time.monotonic()
    build(matrix(steps, gpu))
    build(restart_pair(max(steps, 8), gpu))  # every configuration is validated before anything trains
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name(0) if gpu else 'cpu'}, parts "
          f"{', '.join(parts)}, {steps} steps, workdir {workdir}", flush=True)
    failed: list[str] = []
    for part in parts:
        part_started = time.monotonic()
        try:
            if part == "matrix":
                failed += matrix_check(steps, gpu, device, workdir)
            elif part == "restart":
                line, same = restart_check(max(steps, 8), gpu, device, str(Path(workdir) / "restart"))
                print(line)
                if same != "True":
                    failed.append("restart")
            elif part == "checkpoint":
                print(checkpoint_row(device, args.dry_run, workdir))
            else:
                print(throughput_row(device, args.dry_run, workdir))
        except Exception:  # one part's failure is reported; the parts after it still run
            traceback.print_exc()
            failed.append(part)
        print(f"[{part}: {time.monotonic() - part_started:.0f} s]", flush=True)
    print(f"device check: {'passed' if not failed else 'failed: ' + ', '.join(failed)} "
          f"in {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

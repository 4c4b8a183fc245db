"""The dashboards' picture from real data: PNG plots of the same PromQL the Grafana panels use.

    make dashboards-preview            # or: python bench/dashboards_preview.py --out docs/img

Starts a `trainyard serve` (SQLite, its own local Ray) and a real Prometheus scraping it every
second, trains a 2-stage 1F1B pipeline job with rank 1 slowed 4x from step 40 and a 2-rank DDP
job, then plots from Prometheus's query_range API:
  dashboard-throughput.png   samples/s per job       (Fleet overview: "Samples per second per job")
  dashboard-bubble.png       bubble per stage, measured vs the schedule's theory  (Job detail)
  dashboard-stragglers.png   straggler score per rank with the threshold drawn    (Job detail)
Everything it started is stopped at the end. Not a test: it prints where the files went.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers import tiny_spec  # noqa: E402
from tests.live import TERMINAL, Server, wait_for  # noqa: E402
from tests.observability.dashboards import dashboards, fill, panel_queries  # noqa: E402
from tests.observability.prometheus import Prometheus  # noqa: E402


def panel_expr(board: str, title: str) -> list[str]:
    """The queries of one dashboard panel, so the pictures show exactly what Grafana would."""
    exprs = [e for t, e in panel_queries(dashboards()[board]) if t == title]
    assert exprs, f"no panel {title!r} in {board}"
    return exprs


def series(prom: Prometheus, expr: str, start: float, end: float, label: str) -> dict[str, tuple[list, list]]:
    out = {}
    for s in prom.query_range(expr, start, end, 1.0):
        name = s["metric"].get(label, s["metric"].get("__name__", "value"))
        out[name] = ([float(t) - start for t, _ in s["values"]], [float(v) for _, v in s["values"]])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"))
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ty-preview-"))
    server = Server(work / "home", f"sqlite:///{work}/ty.db", "")  # its own local Ray
    server.start(timeout=180)
    prom = Prometheus(work, f"127.0.0.1:{server.port}").start()
    try:
        with server.client() as c:
            start = time.time()
            pp = c.post("/v1/jobs", json=tiny_spec(**{
                "name": "pp-1f1b", "model.n_layers": 4, "train.steps": args.steps, "train.global_batch_size": 16,
                "resources.workers": 2, "parallel.pp": 2,
                "parallel.pipeline": {"schedule": "1f1b", "microbatches": 4}, "checkpoint.every_steps": 20,
                "supervisor.straggler": {"policy": "report", "window": 5},
                "fault_injection": [{"at_step": 40, "rank": 1, "kind": "slow", "factor": 4.0}]})).json()
            ddp = c.post("/v1/jobs", json=tiny_spec(**{"name": "ddp", "resources.workers": 2,
                                                       "train.steps": args.steps * 2})).json()
            for job in (pp, ddp):
                wait_for(c, job["id"], TERMINAL, timeout=900)
            time.sleep(3)  # the last scrape
            end = time.time()
        job = pp["id"]
        plots = {
            "dashboard-throughput.png": ("Samples per second per job (Fleet overview)", "samples/s",
                                         [(e, "name") for e in panel_expr("trainyard-fleet.json",
                                                                          "Samples per second per job")]),
            "dashboard-bubble.png": ("Pipeline bubble per stage: measured vs 1F1B theory (Job detail)",
                                     "idle / step wall time",
                                     [(fill(e, job), "stage") for e in panel_expr(
                                         "trainyard-job.json", "Bubble per stage: measured vs theory")]),
            "dashboard-stragglers.png": ("Straggler score per rank, rank 1 slowed 4x from step 40 (Job detail)",
                                         "score", [(fill(e, job), "rank") for e in panel_expr(
                                             "trainyard-job.json", "Straggler score per rank")]),
        }
        written = {}
        for name, (title, ylabel, queries) in plots.items():
            fig, ax = plt.subplots(figsize=(9, 3.6), dpi=110)
            for i, (expr, label) in enumerate(queries):
                kind = ("theory" if "theoretical" in expr else "threshold" if "threshold" in expr else "")
                for key, (t, v) in sorted(series(prom, expr, start, end, label).items()):
                    dashed = kind in ("theory", "threshold")
                    ax.plot(t, v, linestyle="--" if dashed else "-", color="red" if kind == "threshold" else None,
                            label="threshold" if kind == "threshold" else
                            f"{'' if label == 'name' else label} {key} {kind}".strip())
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("seconds since submit")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="best")
            fig.tight_layout()
            fig.savefig(out / name)
            plt.close(fig)
            written[name] = str(out / name)
        print(json.dumps({"written": written, "pipeline_job": job, "seconds": round(end - start, 1)}, indent=1))
    finally:
        prom.stop()
        server.stop()


if __name__ == "__main__":
    main()

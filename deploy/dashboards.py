"""The Grafana dashboards, as code: writes deploy/grafana/*.json (then run deploy/sync_chart_assets.py).

    python deploy/dashboards.py          # regenerate; tests/observability checks the files match

Two dashboards with stable uids, the Prometheus datasource as a variable, and only metrics of
service/metric_catalogue.py in their queries:
- trainyard-fleet: jobs by state, queue, scheduler decisions, throughput per job, restarts and
  resizes over time, failing jobs, API latency;
- trainyard-job (templated by `job`): throughput, step time quantiles over the recent steps,
  compute vs communication across ranks, measured vs theoretical bubble per stage, activations in
  flight, straggler scores (the lowest over ranks, and the slowest ranks by rank, at most 8) with the
  threshold drawn, loss and grad norm, checkpoints, memory across ranks, world size, MFU; restarts,
  resizes and layout changes as annotations. No panel draws one line per rank: a job's series do not
  grow with its ranks (service/metric_catalogue.py). Learning rate, comm bytes, layout degrees, data
  share and memory by category are per-step detail: GET /v1/jobs/{id}/metrics.

Event counters (restarts, resizes, straggler actions, ...) exist from a job's first such event, not at
zero from its start (docs/observability.md, "Series budget"): their queries end in `or vector(0)`, so a
panel shows 0 rather than no data while nothing happened.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "grafana"
DS = {"type": "prometheus", "uid": "${datasource}"}
J = 'job="$job"'
NONE_YET = " or vector(0)"  # an event counter is absent until its first event
# MFU needs the hardware peak: a CPU worker has none, and a GPU outside the table needs the setting.
MFU_UNKNOWN = ("MFU unknown: no peak FLOP/s for these workers (CPU, or a GPU not in the table); "
               "set TRAINYARD_PEAK_FLOPS_PER_WORKER")


class Board:
    def __init__(self):
        self.panels: list[dict] = []
        self.x = self.y = 0
        self.row_h = 0

    def row(self, title: str) -> None:
        if self.x:
            self.y += self.row_h
            self.x = self.row_h = 0
        self.panels.append({"id": len(self.panels) + 1, "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def panel(self, title: str, targets: list[tuple[str, str]], unit: str, kind: str = "timeseries",
              w: int = 12, h: int = 8, description: str = "", overrides: list | None = None,
              thresholds: list | None = None, options: dict | None = None, custom: dict | None = None,
              no_value: str | None = None) -> None:
        if self.x + w > 24:
            self.y += self.row_h
            self.x = self.row_h = 0
        defaults = {"unit": unit}
        if thresholds:
            defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
        if custom:
            defaults["custom"] = custom
        if no_value:  # what the panel shows instead of an empty graph, and why
            defaults["noValue"] = no_value
        panel = {
            "id": len(self.panels) + 1, "type": kind, "title": title, "description": description,
            "datasource": DS, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
            "options": options or ({"legend": {"displayMode": "list", "placement": "bottom"},
                                    "tooltip": {"mode": "multi"}} if kind == "timeseries" else {}),
            "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": legend}
                        for i, (expr, legend) in enumerate(targets)],
        }
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)


def datasource_var() -> dict:
    return {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}


def dashboard(uid: str, title: str, board: Board, variables: list[dict], annotations: list[dict],
              description: str) -> dict:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["trainyard"],
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"}, "timezone": "",
        "templating": {"list": variables},
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}, *annotations]},
        "links": [{"title": "Trainyard", "type": "dashboards", "tags": ["trainyard"], "asDropdown": False}],
        "panels": board.panels,
    }


def fleet() -> dict:
    b = Board()
    b.row("Jobs")
    b.panel("Jobs by state", [("sum by (state) (trainyard_jobs)", "{{state}}")], "none", kind="bargauge", w=8,
            options={"orientation": "horizontal", "displayMode": "basic"})
    b.panel("Queue: jobs waiting", [('sum(trainyard_jobs{state="QUEUED"})', "queued")], "none", kind="stat", w=4)
    b.panel("Queue wait (p50, p90)", [
        ("histogram_quantile(0.5, sum by (le) (rate(trainyard_queue_wait_seconds_bucket[$__rate_interval])))", "p50"),
        ("histogram_quantile(0.9, sum by (le) (rate(trainyard_queue_wait_seconds_bucket[$__rate_interval])))", "p90"),
    ], "s", w=6)
    b.panel("Scheduler decisions", [
        ("sum by (decision) (rate(trainyard_scheduler_decisions_total[$__rate_interval]))", "{{decision}}")],
        "ops", w=6)
    b.panel("Control loop pass (p99)", [
        ("histogram_quantile(0.99, sum by (loop, le) (rate(trainyard_control_pass_seconds_bucket[$__rate_interval])))",
         "{{loop}}")], "s", w=6, description="The leader's reconcile and schedule passes; they tick every 0.5 s")
    b.row("Throughput")
    b.panel("Samples per second per job", [
        ("trainyard_job_samples_per_second * on (job, name) group_left () trainyard_job_active", "{{name}} {{job}}")],
        "none", w=12, description="Running jobs only")
    b.panel("Tokens per second per job", [("sum by (job) (trainyard_job_tokens_per_second)", "{{job}}")], "none",
            w=12)
    b.row("Faults and elasticity")
    b.panel("Restarts by cause", [
        ("sum by (cause) (increase(trainyard_restarts_total[$__rate_interval]))" + NONE_YET, "{{cause}}")], "none",
        w=8,
        custom={"drawStyle": "bars", "fillOpacity": 80})
    b.panel("Resizes by reason", [
        ("sum by (reason) (increase(trainyard_resizes_total[$__rate_interval]))" + NONE_YET, "{{reason}}")], "none",
        w=8,
        custom={"drawStyle": "bars", "fillOpacity": 80})
    b.panel("Straggler actions", [
        ("sum by (action) (increase(trainyard_straggler_actions_total[$__rate_interval]))" + NONE_YET,
         "{{action}}")], "none", w=8, custom={"drawStyle": "bars", "fillOpacity": 80})
    b.panel("Failing and recovering jobs", [
        ('trainyard_job_state{state=~"FAILED|RECOVERING"} == 1', "{{state}} {{name}} {{job}}")], "none",
        kind="table", w=12, options={"showHeader": True})
    b.panel("Restarts so far per job", [("trainyard_job_restarts > 0", "{{name}} {{job}}")], "none",
            kind="bargauge", w=12, options={"orientation": "horizontal", "displayMode": "basic"})
    b.row("Control plane")
    b.panel("API latency p95 by route", [
        ("histogram_quantile(0.95, sum by (route, le) "
         "(rate(trainyard_http_request_duration_seconds_bucket[$__rate_interval])))", "{{route}}")], "s", w=12)
    b.panel("API requests by status", [
        ("sum by (status) (rate(trainyard_http_request_duration_seconds_count[$__rate_interval]))", "{{status}}")],
        "reqps", w=12)
    return dashboard("trainyard-fleet", "Trainyard / Fleet overview", b, [datasource_var()], [],
                     "All jobs: states, queue, throughput, faults and the control plane.")


def job() -> dict:
    b = Board()
    b.row("Progress")
    b.panel("State", [(f"trainyard_job_state{{{J}}} == 1", "{{state}}")], "none", kind="stat", w=4,
            options={"textMode": "name", "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}})
    b.panel("Step", [(f"trainyard_job_step{{{J}}}", "step"), (f"trainyard_job_total_steps{{{J}}}", "of")], "none",
            kind="stat", w=4)
    b.panel("Throughput", [(f"trainyard_job_samples_per_second{{{J}}}", "samples/s"),
                           (f"trainyard_job_tokens_per_second{{{J}}}", "tokens/s")], "none", w=8,
            overrides=[{"matcher": {"id": "byName", "options": "tokens/s"},
                        "properties": [{"id": "custom.axisPlacement", "value": "right"}]}])
    b.panel("Model FLOPs utilisation", [(f"trainyard_job_mfu_ratio{{{J}}}", "MFU")], "percentunit", w=8,
            description="6 x parameters x tokens/s over the workers' peak FLOP/s: looked up from the GPU's name "
                        "(H100, H200, A100, L40S, A10G, B200; workers/peak_flops.py) or set by "
                        "TRAINYARD_PEAK_FLOPS_PER_WORKER. Built-in GPT only.",
            no_value=MFU_UNKNOWN)
    b.panel("Loss and grad norm", [(f"trainyard_job_loss{{{J}}}", "loss"),
                                   (f"trainyard_job_grad_norm{{{J}}}", "grad norm")], "none", w=12,
            overrides=[{"matcher": {"id": "byName", "options": "grad norm"},
                        "properties": [{"id": "custom.axisPlacement", "value": "right"}]}])
    b.row("Step time and stragglers")
    b.panel("Step time (p50, p90, p99 of the recent steps)", [
        (f"trainyard_job_step_seconds{{{J}}}", "p{{quantile}}")], "s", w=8,
        description="Quantiles of the wall time of the job's last 100 steps; every step's own time: "
                    "GET /v1/jobs/{id}/metrics")
    b.panel("Compute vs communication across ranks", [
        (f"trainyard_rank_compute_seconds{{{J}}}", "compute {{stat}}"),
        (f"trainyard_rank_comm_seconds{{{J}}}", "comm {{stat}}")], "s", w=8,
        description="compute: min, median and max over the job's ranks (a wide spread is a slow rank); comm: "
                    "median and max (the fast ranks waiting for a slow one, or a slow link)")
    b.panel("Straggler score", [
        (f"trainyard_slowest_rank_straggler_score{{{J}}}", "rank {{rank}}"),
        (f'trainyard_straggler_score{{{J},stat="min"}}', "lowest over ranks"),
        (f"trainyard_straggler_threshold{{{J}}}", "threshold")], "none", w=8,
        description="median compute time over ranks / the rank's; below the threshold the rank is a straggler. "
                    "By rank: the job's slowest ranks (at most 8, the lowest scores, re-chosen every step)",
        overrides=[{"matcher": {"id": "byName", "options": "threshold"},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                                   {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}])
    b.row("Pipeline bubble")
    b.panel("Bubble per stage: measured vs theory", [
        (f"trainyard_stage_bubble_fraction{{{J}}}", "stage {{stage}} measured"),
        (f"trainyard_stage_bubble_fraction_theoretical{{{J}}}", "stage {{stage}} theory")], "percentunit", w=12,
        overrides=[{"matcher": {"id": "byRegexp", "options": ".*theory"},
                    "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]}])
    b.panel("Stage busy vs idle", [
        (f"trainyard_stage_busy_seconds{{{J}}}", "stage {{stage}} busy"),
        (f"trainyard_stage_idle_seconds{{{J}}}", "stage {{stage}} idle")], "s", w=6)
    b.panel("Activations in flight per stage", [
        (f"trainyard_stage_activation_bytes_in_flight{{{J}}}", "stage {{stage}}")], "bytes", w=6)
    b.row("Memory and layout")
    b.panel("Memory (the highest rank)", [
        (f"trainyard_rank_peak_memory_bytes{{{J}}}", "peak"),
        (f"trainyard_rank_model_state_bytes{{{J}}}", "model state")], "bytes", w=12,
        description="The highest over the job's ranks; each rank's peak and its breakdown by category: "
                    "GET /v1/jobs/{id}/metrics")
    b.panel("World size", [(f"trainyard_job_world_size{{{J}}}", "world size")], "none", w=12,
            description="The layout's degrees (dp, tp, pp): GET /v1/jobs/{id}")
    b.row("Checkpoints and events")
    b.panel("Checkpoints", [
        (f"increase(trainyard_checkpoints_total{{{J}}}[$__rate_interval])" + NONE_YET, "written"),
        (f"trainyard_job_last_checkpoint_step{{{J}}}", "last step")], "none", w=8,
        overrides=[{"matcher": {"id": "byName", "options": "last step"},
                    "properties": [{"id": "custom.axisPlacement", "value": "right"}]}])
    b.panel("Checkpoint duration and size", [
        (f"trainyard_checkpoint_seconds{{{J}}}", "last duration"),
        (f"trainyard_checkpoint_bytes{{{J}}}", "bytes")], "s", w=8,
        overrides=[{"matcher": {"id": "byName", "options": "bytes"},
                    "properties": [{"id": "unit", "value": "bytes"},
                                   {"id": "custom.axisPlacement", "value": "right"}]}])
    b.panel("Restarts, rollbacks, straggler actions", [
        (f"sum by (cause) (increase(trainyard_restarts_total{{{J}}}[$__rate_interval]))" + NONE_YET,
         "restart {{cause}}"),
        (f"sum by (cause) (increase(trainyard_rollbacks_total{{{J}}}[$__rate_interval]))" + NONE_YET,
         "rollback {{cause}}"),
        (f"sum by (action) (increase(trainyard_straggler_actions_total{{{J}}}[$__rate_interval]))" + NONE_YET,
         "straggler {{action}}"),
        (f"increase(trainyard_skipped_steps_total{{{J}}}[$__rate_interval])" + NONE_YET, "skipped steps")], "none",
        w=8,
        custom={"drawStyle": "bars", "fillOpacity": 80})
    job_var = {"name": "job", "label": "Job", "type": "query", "datasource": DS,
               "query": {"query": "label_values(trainyard_job_step, job)", "refId": "jobs"},
               "definition": "label_values(trainyard_job_step, job)", "refresh": 2, "sort": 0,
               "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "regex": ""}
    annotations = [
        {"name": "Layout changes", "datasource": DS, "enable": True, "iconColor": "purple",
         "expr": f"changes(trainyard_job_world_size{{{J}}}[1m]) > 0", "step": "15s",
         "titleFormat": "world size changed", "textFormat": "layout change"},
        {"name": "Resizes", "datasource": DS, "enable": True, "iconColor": "orange",
         "expr": f"sum by (reason) (increase(trainyard_resizes_total{{{J}}}[1m])) > 0", "step": "15s",
         "titleFormat": "resize", "textFormat": "{{reason}}"},
        {"name": "Restarts", "datasource": DS, "enable": True, "iconColor": "red",
         "expr": f"sum by (cause) (increase(trainyard_restarts_total{{{J}}}[1m])) > 0", "step": "15s",
         "titleFormat": "restart", "textFormat": "{{cause}}"},
    ]
    return dashboard("trainyard-job", "Trainyard / Job detail", b, [datasource_var(), job_var], annotations,
                     "One job: throughput, step time quantiles, compute across ranks, the slowest ranks, pipeline "
                     "bubble, stragglers, memory, checkpoints.")


DASHBOARDS = {"trainyard-fleet.json": fleet, "trainyard-job.json": job}


def render(build) -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, build in DASHBOARDS.items():
        (OUT / name).write_text(render(build))
        print(f"wrote deploy/grafana/{name}")


if __name__ == "__main__":
    main()

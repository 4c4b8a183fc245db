"""After the run: each job's end state read back over REST, the rank faults' recovery times from
their marker files and the job's own records, and every chaos-hit job checked against a fault-free
job of its kind (same spec, same seed: the same final parameters, bit for bit)."""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime
from pathlib import Path

from bench.soak.ledger import FaultRecord, JobRecord, Ledger, TwinCheck
from bench.soak.replicas import Api
from workers.spec.job import StragglerSpec
from workers.storage import Storage
from workers.training.faults import SlowRun, slow_runs


def read_jobs(api: Api, ledger: Ledger, storage: Path) -> None:
    names = Counter(j["name"] for j in api.get_json("/v1/jobs", params={"limit": 1000})["jobs"])
    for record in ledger.jobs:
        job = api.get_json(f"/v1/jobs/{record.id}")
        events = api.get_json(f"/v1/jobs/{record.id}/events")["events"]
        summary = job.get("summary") or {}
        record.state, record.error, record.restarts = job["state"], job["error"], job["restarts"]
        record.stored = names[record.plan.name]
        record.admissions = sum(e["kind"] == "state" and e["state"] == "STARTING" and
                                (e["data"] or {}).get("from") == "QUEUED" for e in events)
        record.world_sizes = sorted({summary.get("world_size") or job["world_size"],
                                     *((e["data"] or {}).get("to", {}).get("world_size")
                                       for e in events if e["kind"] == "resize")} - {None})
        final = storage / "jobs" / record.id / "checkpoints" / "final.sha256"  # a program's own hash
        record.params_sha256 = summary.get("params_sha256") or (final.read_text().strip() if final.exists() else None)
        if record.plan.fault:
            ledger.add_fault(rank_fault_record(api, record, events, storage))


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def rank_fault_record(api: Api, record: JobRecord, events: list[dict], storage: Path) -> FaultRecord:
    """crash/hang: fault -> the step it struck trained again (after the restart); slow: -> the
    straggler event naming that rank (detection: a slow rank is not restarted under policy report)."""
    fault = record.plan.fault or {}
    kind, at_step, rank = fault["kind"], fault["at_step"], fault["rank"]
    markers = sorted((storage / "jobs" / record.id / "faults").glob("fired-*"))
    out = FaultRecord(kind, 0.0, None, [record.id], f"{record.plan.name} rank {rank} step {at_step}")
    if not markers:
        out.detail += f": never fired (job {record.state}, {record.error})"
        return out
    out.at = markers[0].stat().st_mtime
    if record.state == "FAILED":
        return out
    points = api.get_json(f"/v1/jobs/{record.id}/metrics")["points"]
    if kind == "slow":
        hits = [_ts(e["ts"]) for e in events if e["kind"] == "straggler" and (e["data"] or {}).get("rank") == rank]
        out.recovered_at = min((t for t in hits if t >= out.at - 1), default=None)
        runs = slow_runs(Storage.of(markers[0].parent), 0)  # the soak's jobs have one fault each
        cut = None if out.recovered_at is not None else window_cut_short(events, points, at_step, out.at, runs)
        if cut is not None:
            out.recovered_at = cut[0]
            out.detail += cut[1]
        elif out.recovered_at is None:
            out.detail += ": no straggler event for the slow rank"
        return out
    after = [p["ts"] for p in points if p["step"] >= at_step and p["ts"] >= out.at]
    # Steps trained past the fault whose records went down with a lost supervisor: the reconciler's
    # telemetry_gap event (written when it finds their checkpoint) is the latest they can have run.
    gaps = [_ts(e["ts"]) for e in events if e["kind"] == "telemetry_gap" and _ts(e["ts"]) >= out.at
            and (e["data"] or {}).get("to_step", 0) >= at_step]
    if record.restarts >= 1 and (after or gaps):
        out.recovered_at = min(after + gaps)
        if not after:
            out.detail += ": its steps after the fault were lost with its supervisor (telemetry_gap)"
    else:
        out.detail += f": restarts {record.restarts}, steps after the fault {len(after)}"
    return out


def window_cut_short(events: list[dict], points: list[dict], at_step: int, fired_at: float,
                     runs: list[SlowRun], window: int = StragglerSpec().window) -> tuple[float, str] | None:
    """(when, why) if a restart came after a slow fault and no attempt of the rank on the degraded
    node ran a straggler window of steps; None if one did (a straggler event is due) or none came.

    The detector scores a rank over `window` steps of one attempt, and a restart starts a new one on
    a placement Ray chooses anew: a rank moved off the degraded node runs at full speed again
    (workers/training/faults.py), so no event is due from that attempt. Where each attempt ran is in
    its `runs` record; the steps of an attempt are its records, and those a lost supervisor took with
    it (the telemetry_gap written with the restart that followed)."""
    restarts = sorted(_ts(e["ts"]) for e in events if e["kind"] == "restart" and _ts(e["ts"]) >= fired_at)
    if not restarts:
        return None
    gaps = [(_ts(e["ts"]), (e["data"] or {}).get("from_step", 0), (e["data"] or {}).get("to_step", -1))
            for e in events if e["kind"] == "telemetry_gap"]
    bounds = [fired_at - 1, *restarts, math.inf]
    attempts = []
    for start, end in zip(bounds, bounds[1:]):
        steps = {p["step"] for p in points if p["step"] >= at_step and start <= p["ts"] < end}
        steps |= {s for ts, lo, hi in gaps if start < ts <= end for s in range(max(lo, at_step), hi + 1)}
        run = next((r for r in runs if start <= r.at < end), None)
        degraded = start == bounds[0] or run is None or run.degraded  # no record: assume it stayed
        if degraded and len(steps) >= window:
            return None
        attempts.append(f"{len(steps)} steps {'on' if degraded else 'off'} the degraded node")
    return restarts[0], (f": cut short, the group restarted {restarts[0] - fired_at:.1f} s after the fault; "
                         f"no attempt ran the straggler window's {window} steps on the degraded node "
                         f"({', '.join(attempts)})")


def mark_hits(ledger: Ledger) -> None:
    by_id = {j.id: j for j in ledger.jobs}
    for index, fault in enumerate(ledger.faults):
        for job_id in fault.jobs:
            if job_id in by_id and fault.kind not in ("crash", "hang", "slow"):
                by_id[job_id].hit_by.append(index)


def twin_checks(ledger: Ledger) -> list[TwinCheck]:
    clean: dict[str, JobRecord] = {}
    for job in ledger.jobs:
        if not job.chaos_hit and job.state == "SUCCEEDED" and job.params_sha256:
            clean.setdefault(job.plan.kind, job)
    checks = []
    for job in ledger.jobs:
        if not job.chaos_hit or job.state != "SUCCEEDED":
            continue
        twin = clean.get(job.plan.kind)
        if twin is None:
            checks.append(TwinCheck(job.id, job.plan.kind, None, None, "no fault-free twin finished"))
            continue
        same = job.params_sha256 == twin.params_sha256 and job.params_sha256 is not None
        note = "" if same else (f"{job.params_sha256} vs {twin.params_sha256}; world sizes {job.world_sizes}, "
                                f"restarts {job.restarts}")
        checks.append(TwinCheck(job.id, job.plan.kind, twin.id, same, note))
    return checks


def kinds_without_twin(ledger: Ledger) -> list[str]:
    hit = {j.plan.kind for j in ledger.jobs if j.chaos_hit}
    have = {j.plan.kind for j in ledger.jobs if not j.chaos_hit and j.state == "SUCCEEDED"}
    return sorted(hit - have)

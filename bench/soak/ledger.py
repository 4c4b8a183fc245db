"""What the soak saw, as typed records, and the one table it prints (and the JSON the test reads)."""

from __future__ import annotations

import statistics
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field

from bench.soak.jobs import JobPlan
from bench.table import print_markdown_table

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@dataclass
class JobRecord:
    plan: JobPlan
    id: str
    submitted_at: float
    state: str = "QUEUED"
    step: int = 0  # the last step the service reported (the drain waits while jobs make progress)
    error: str | None = None
    restarts: int = 0
    params_sha256: str | None = None
    world_sizes: list[int] = field(default_factory=list)  # every world size it trained at (a resize adds one)
    admissions: int = 0  # QUEUED -> STARTING transitions: more than one is a job admitted twice
    stored: int = 1  # rows with this job's name: more than one is a submit stored twice
    hit_by: list[int] = field(default_factory=list)  # indexes of the faults that touched it

    @property
    def chaos_hit(self) -> bool:
        return self.plan.fault is not None or bool(self.hit_by)


@dataclass
class FaultRecord:
    kind: str
    at: float
    recovered_at: float | None = None
    jobs: list[str] = field(default_factory=list)  # jobs it touched
    detail: str = ""

    @property
    def ttr_s(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at


@dataclass
class TwinCheck:
    job: str
    kind: str
    twin: str | None
    identical: bool | None  # None: no fault-free twin finished
    note: str = ""


@dataclass
class Ledger:
    jobs: list[JobRecord] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    twins: list[TwinCheck] = field(default_factory=list)
    server_errors: dict[str, int] = field(default_factory=dict)
    server_error_examples: list[str] = field(default_factory=list)
    refused_submits: list[str] = field(default_factory=list)  # a stream submit answered other than 201
    soak_errors: list[str] = field(default_factory=list)  # the soak's own failures (none expected)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_job(self, record: JobRecord) -> None:
        with self.lock:
            self.jobs.append(record)

    def add_fault(self, record: FaultRecord) -> int:
        with self.lock:
            self.faults.append(record)
            return len(self.faults) - 1

    # --- the verdicts -----------------------------------------------------------------
    def lost(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.state not in TERMINAL]

    def duplicated(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.admissions > 1 or j.stored > 1]

    def failed(self) -> list[JobRecord]:
        return [j for j in self.jobs if j.state == "FAILED"]

    def unrecovered(self) -> list[FaultRecord]:
        return [f for f in self.faults if f.recovered_at is None]

    def twin_mismatches(self) -> list[TwinCheck]:
        return [t for t in self.twins if t.identical is not True]

    def problems(self) -> list[str]:
        """Every target missed (the soak's assertions): empty when all hold."""
        out = [f"lost: {j.plan.name} {j.id} {j.state}" for j in self.lost()]
        out += [f"duplicated: {j.plan.name} admissions {j.admissions}, stored {j.stored}" for j in self.duplicated()]
        out += [f"failed: {j.plan.name} {j.id}: {j.error}" for j in self.failed()]
        out += [f"refused submit: {r}" for r in self.refused_submits]
        out += [f"soak error: {e}" for e in self.soak_errors]
        out += [f"5xx: {e}" for e in self.server_error_examples] or \
            [f"5xx: {k} x{n}" for k, n in self.server_errors.items()]
        out += [f"not recovered: {f.kind} ({f.detail})" for f in self.unrecovered()]
        out += [f"twin: {t.job} ({t.kind}) vs {t.twin}: {t.note}" for t in self.twin_mismatches()]
        return out

    def as_json(self) -> dict:
        return {"jobs": [asdict(j) for j in self.jobs], "faults": [asdict(f) | {"ttr_s": f.ttr_s} for f in self.faults],
                "twins": [asdict(t) for t in self.twins], "server_errors": self.server_errors,
                "server_error_examples": self.server_error_examples, "refused_submits": self.refused_submits,
                "soak_errors": self.soak_errors,
                "problems": self.problems()}

    # --- the table ---------------------------------------------------------------------
    def rows(self) -> list[tuple[str, str]]:
        states = Counter(j.state for j in self.jobs)
        causes = Counter((j.error or "no error recorded")[:100] for j in self.failed())
        rows = [("jobs submitted (accepted)", str(len(self.jobs))), ("SUCCEEDED", str(states["SUCCEEDED"])),
                ("FAILED", str(states["FAILED"]))]
        rows += [(f"  FAILED: {cause}", str(n)) for cause, n in causes.most_common()]
        if states["CANCELLED"]:
            rows.append(("CANCELLED", str(states["CANCELLED"])))
        rows += [("lost (accepted, never finished)", _ids(self.lost())),
                 ("duplicated (admitted or stored twice)", _ids(self.duplicated())),
                 ("submits refused (not 201)", str(len(self.refused_submits))),
                 ("soak's own errors", str(len(self.soak_errors)))]
        for kind in sorted({f.kind for f in self.faults}):
            of_kind = [f for f in self.faults if f.kind == kind]
            ttrs = [f.ttr_s for f in of_kind if f.ttr_s is not None]
            ttr = f"median {statistics.median(ttrs):.1f} s, worst {max(ttrs):.1f} s" if ttrs else "-"
            rows.append((f"fault {kind}: injected / recovered", f"{len(of_kind)} / {len(ttrs)}; {ttr}"))
        rows.append(("5xx answers", str(sum(self.server_errors.values()))
                     + "".join(f"; {k}: {n}" for k, n in sorted(self.server_errors.items()))))
        checked = [t for t in self.twins if t.identical is not None]
        rows.append(("chaos-hit jobs with a fault-free twin: params_sha256 identical",
                     f"{sum(t.identical is True for t in checked)} / {len(checked)}"
                     + (f" ({len(self.twins) - len(checked)} without a finished twin)"
                        if len(checked) < len(self.twins) else "")))
        rows += [(f"  twin differs: {t.job} ({t.kind}) vs {t.twin}", t.note) for t in self.twin_mismatches()
                 if t.identical is False]
        return rows

    def print_table(self) -> None:
        print_markdown_table(("soak", "result"), self.rows())


def _ids(jobs: list[JobRecord]) -> str:
    return str(len(jobs)) + (": " + ", ".join(f"{j.id} {j.plan.name} {j.state}" for j in jobs[:8]) if jobs else "")

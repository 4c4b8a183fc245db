"""`parallel.parameter_server`: embedding tables row-sharded over parameter-server actors, and its rules.

Torch-free: the section and the rules a submitted spec is checked by (workers/spec/rules.py calls them).
The server itself is workers/parallel/parameter_server/."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from workers.spec.base import Strict
from workers.spec.errors import Violation
from workers.spec.model import DLRMModelSpec

if TYPE_CHECKING:
    from workers.spec.job import JobSpec

FIELD = "parallel.parameter_server"


class ParameterServerSpec(Strict):
    """Embedding rows live on `shards` actors; each trainer pulls the rows its batch touches and pushes their
    gradients (docs/parallel.md, "The parameter server"). Dense parameters stay all-reduced among trainers."""
    shards: int = Field(ge=1, le=1024, description="parameter-server actors; table rows are dealt to them "
                                                   "round-robin (row r of every table on shard r % shards)")
    mode: Literal["sync", "bounded", "async"] = Field(
        "sync", description="sync: every trainer's push of step t is applied before any pull of step t + 1 (the "
                            "same math as data parallelism); bounded: a trainer runs at most `staleness` steps "
                            "ahead of the slowest; async: pushes and pulls never wait")
    staleness: int | None = Field(None, ge=0, le=1_000_000, description="bounded: steps a trainer may run ahead "
                                  "of the slowest (0 is sync); only with mode 'bounded', which requires it")
    optimizer: Literal["adagrad", "sgd", "adamw"] = Field(
        "adagrad", description="the shards' update at the step's learning rate. adagrad, sgd: sparse, only the rows "
                               "a push touched change (as a dense update with zero gradients elsewhere would leave "
                               "them); adamw: the trainers' AdamW over every row of the shard each step (moments "
                               "move rows no batch touched: the same math as data parallelism, a dense update on "
                               "the shard while the wire stays sparse)")


def parameter_server_violations(spec: "JobSpec") -> Iterator[Violation]:
    ps, p = spec.parallel.parameter_server, spec.parallel
    if ps is None:
        return
    if ps.mode == "bounded" and ps.staleness is None:
        yield Violation(f"{FIELD}.staleness",
            f"{FIELD}.staleness is required with mode 'bounded': the steps a trainer may run ahead of the slowest")
    if ps.mode != "bounded" and ps.staleness is not None:
        yield Violation(f"{FIELD}.staleness",
            f"{FIELD}.staleness applies to mode 'bounded' only (mode={ps.mode!r}, staleness={ps.staleness})")
    if ps.mode == "async":  # the trainers never meet after their set-up (a lost one blocks none): no collective
        ft = spec.fault_tolerance
        if ft.loss_spike is not None:
            yield Violation("fault_tolerance.loss_spike",
                f"fault_tolerance.loss_spike needs every trainer to agree on each step (a collective), which "
                f"{FIELD} mode 'async' trainers never do")
        if ft.integrity_check_every:
            yield Violation("fault_tolerance.integrity_check_every",
                f"fault_tolerance.integrity_check_every compares replicas (a collective); {FIELD} mode 'async' "
                f"keeps none (the shards hold the dense part too) and its trainers never meet")
    if spec.program is not None:
        yield Violation(FIELD, f"{FIELD} needs Trainyard's own loop, not a program (it drives the shards per step)")
        return
    if not isinstance(spec.model, DLRMModelSpec):
        yield Violation(FIELD,
            f"{FIELD} needs a model with embedding tables to shard (model 'dlrm'), not "
            f"{getattr(spec.model, 'name', None) or 'a user model'!r}")
    # The trainers run plain DDP over the dense part (workers/parallel/parameter_server/strategy.py): any
    # other treatment of it would be ignored, so it is refused.
    others = {"tp": p.tp > 1, "pp": p.pp > 1, "cp": p.cp > 1, "ep": p.ep > 1, f"zero {p.zero}": p.zero > 0,
              "sdp": p.sdp is not None, "local_sgd": p.local_sgd is not None, "compression": p.compression is not None,
              f"mixed_precision {p.mixed_precision}": p.mixed_precision != "fp32"}
    clash = [name for name, on in others.items() if on]
    if clash:
        yield Violation(FIELD,
            f"{FIELD} combines only with plain data parallelism (dp, zero 0, fp32): the trainers all-reduce the dense "
            f"parameters and hold the embedding rows the shards send them whole; not with {', '.join(clash)}")

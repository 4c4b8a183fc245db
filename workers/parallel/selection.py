"""Which strategy runs a spec, by name, without importing the strategies (they import torch).

The supervisor and the API name a job's strategy (its summary's layout); the registry
(registry.py) maps the name to the strategy class. The order is the registry's: the first
layout that matches wins, so more specific layouts come first.
"""

from __future__ import annotations

from collections.abc import Callable

from workers.spec import JobSpec

SELECTION: tuple[tuple[str, Callable[[JobSpec], bool]], ...] = (
    ("pipeline", lambda spec: spec.parallel.pp > 1),  # pp > 1 (x dp, x tp)
    ("sdp", lambda spec: spec.parallel.sdp is not None),  # parallel.sdp, also with zero 3 per subnetwork
    ("fsdp", lambda spec: spec.parallel.zero == 3),  # zero 3, also FSDP x TP and HSDP
    ("zero", lambda spec: spec.parallel.zero in (1, 2)),  # zero 1/2 over dp
    ("tp", lambda spec: spec.parallel.tp > 1),  # tp > 1 with zero 0 (DP x TP)
    ("local_sgd", lambda spec: spec.parallel.local_sgd is not None),  # averaging every period steps
    ("ddp", lambda spec: True),  # the last resort: plain data parallelism
)


def strategy_name(spec: JobSpec) -> str:
    return next(name for name, selects in SELECTION if selects(spec))

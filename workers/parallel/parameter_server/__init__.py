"""A parameter server for embedding tables (issue 50, `parallel.parameter_server`).

sharding.py  which shard holds which row (row r of every table on shard r % shards)
clock.py     when a trainer may pull for a step: sync, bounded (stale-synchronous) or async
shard.py     one shard: its rows, the sparse SGD/Adagrad update, the clock, save/restore; ShardActor
client.py    a trainer's side: pull the rows a batch touches, push their gradients
server.py    the shards of a job: made (in or beside its placement group), checkpointed, killed
names.py     the shard actors' names, found and killed by them (torch-free: the supervisor's side)

Dense parameters (the MLPs): all-reduced by the trainers under sync and bounded, on the shards under async
(docs/parallel.md says why). Its names load on first use (workers/lazy.py): the supervisor imports names.py
without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.lazy import lazy_names

if TYPE_CHECKING:
    from workers.parallel.parameter_server.client import PulledRows, ShardClient
    from workers.parallel.parameter_server.clock import StepClock
    from workers.parallel.parameter_server.server import ParameterServer
    from workers.parallel.parameter_server.shard import Shard
    from workers.parallel.parameter_server.sharding import RowSharding

_HOME = {**dict.fromkeys(("PulledRows", "ShardClient"), "client"), "StepClock": "clock",
         "ParameterServer": "server", "Shard": "shard", "RowSharding": "sharding"}
__all__ = ["ParameterServer", "PulledRows", "RowSharding", "Shard", "ShardClient", "StepClock"]
__getattr__ = lazy_names(__name__, _HOME)

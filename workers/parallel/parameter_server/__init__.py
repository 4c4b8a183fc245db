"""A parameter server for embedding tables (issue 50, `parallel.parameter_server`).

sharding.py  which shard holds which row (row r of every table on shard r % shards)
clock.py     when a trainer may pull for a step: sync, bounded (stale-synchronous) or async
shard.py     one shard: its rows, the sparse SGD/Adagrad update, the clock, save/restore; ShardActor
client.py    a trainer's side: pull the rows a batch touches, push their gradients
server.py    the shards of a job: made (in or beside its placement group), checkpointed, killed

Dense parameters (the MLPs) are not here: the trainers all-reduce them (docs/parallel.md says why).
"""

from workers.parallel.parameter_server.client import PulledRows, ShardClient
from workers.parallel.parameter_server.clock import StepClock
from workers.parallel.parameter_server.server import ParameterServer
from workers.parallel.parameter_server.shard import Shard
from workers.parallel.parameter_server.sharding import RowSharding

__all__ = ["ParameterServer", "PulledRows", "RowSharding", "Shard", "ShardClient", "StepClock"]

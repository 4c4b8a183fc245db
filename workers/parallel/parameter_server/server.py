"""The shards of one job: started (inside the job's placement group when it has one, else beside the
trainers), reached by each trainer's client, saved and restored with the job's checkpoint, and killed
with the job.

Inside a job's placement group the shard actors are detached, so that they outlive the rank that started
them (a trainer lost under async leaves the shards running), and they end with the placement group: Ray
kills a placement group's actors when it is removed, which the job's worker group does at every attempt's
end (workers/runtime/group.py, which also kills them by name first: `kill_named`), and which Ray does itself
when the supervisor that made the group dies. Outside one (tests) they are owned by their starter. They ask
for no CPU of their own (num_cpus=0): sparse row updates are a small fraction of a step's work, and a
bundle of the job's placement group then fits them beside a rank. Their names: names.py."""

from __future__ import annotations

import io
from typing import Any

import torch

from workers.parallel.parameter_server.client import ShardClient
from workers.parallel.parameter_server.shard import Shard
from workers.parallel.parameter_server.sharding import RowSharding
from workers.spec.parameter_server import ParameterServerSpec


class ParameterServer:
    def __init__(self, handles: list[Any], sharding: RowSharding):
        self.handles, self.sharding = handles, sharding

    @classmethod
    def start(cls, tables: list[torch.Tensor], spec: ParameterServerSpec, trainers: int, *, name: str | None = None,
              placement_group: Any = None, weight_decay: float = 0.0) -> "ParameterServer":
        """Shards holding `tables` (whole, initial) row by row; the actors named `{name}-shard-{i}` when named,
        each in bundle i % bundles of `placement_group` when given (then detached: they end with the group)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = ray.remote(Shard)
        sharding = RowSharding(spec.shards)
        handles = []
        for i in range(spec.shards):
            options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1000}
            if name is not None:
                options["name"] = f"{name}-shard-{i}"
            if placement_group is not None:
                bundles = len(placement_group.bundle_specs)
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group, placement_group_bundle_index=i % bundles)
                options["lifetime"] = "detached"  # not the starting rank's: the placement group's
            parts = [sharding.local_part(t.detach().cpu(), i) for t in tables]
            handles.append(actor.options(**options).remote(i, parts, trainers, spec.mode, spec.staleness or 0,
                                                           spec.optimizer, weight_decay))
        return cls(handles, sharding)

    def client(self, trainer: int) -> ShardClient:
        return ShardClient(self.handles, self.sharding, trainer)

    def tables(self) -> list[torch.Tensor]:
        """The whole tables as the shards hold them now."""
        import ray

        states = ray.get([h.state_dict.remote() for h in self.handles])
        return [self.sharding.whole([s["rows"][t] for s in states]) for t in range(len(states[0]["rows"]))]

    def stats(self) -> list[dict]:
        import ray

        return ray.get([h.stats.remote() for h in self.handles])

    def save(self) -> bytes:
        """Every shard's rows, optimiser sums and clock, as one blob the job's checkpoint stores."""
        import ray

        buffer = io.BytesIO()
        torch.save({"shards": len(self.handles), "states": ray.get([h.state_dict.remote() for h in self.handles])},
                   buffer)
        return buffer.getvalue()

    def restore(self, blob: bytes) -> None:
        """A checkpoint's shard states, into shards started anew (after a shard crash) or still running."""
        import ray

        saved = torch.load(io.BytesIO(blob), weights_only=True)
        if saved["shards"] != len(self.handles):
            raise ValueError(f"parallel.parameter_server.shards: the checkpoint holds {saved['shards']} shards, "
                             f"the job runs {len(self.handles)}")
        ray.get([h.load_state_dict.remote(s) for h, s in zip(self.handles, saved["states"])])

    def leave(self, trainer: int) -> None:
        """Trainer `trainer` is lost for good: no shard's clock waits for it (async)."""
        import ray

        ray.get([h.leave.remote(trainer) for h in self.handles])

    def rejoin(self, trainer: int) -> int:
        """Trainer `trainer` joins the running shards (async): from the slowest live trainer's step, which
        it returns; the rows and dense parameters it pulls are the shards' current ones (nothing restored)."""
        import ray

        step = int(ray.get(self.handles[0].slowest.remote()))
        ray.get([h.rejoin.remote(trainer, step) for h in self.handles])
        return step

    def lead(self) -> int:
        import ray

        return int(ray.get(self.handles[0].lead.remote()))

    def finished(self, steps: int) -> int:
        """Wait until every live trainer has pushed its last step; the lead trainer then."""
        import ray

        return int(ray.get(self.handles[0].finished.remote(steps)))

    def shutdown(self) -> None:
        import ray

        for handle in self.handles:
            ray.kill(handle, no_restart=True)
        self.handles = []


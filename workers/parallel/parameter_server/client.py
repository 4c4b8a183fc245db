"""A trainer's side of the parameter server: pull the rows a step's batches touch, push their gradients.

A step pulls once for all of its micro-batches (each id once), so the rows are leaf tensors that every
micro-batch's backward accumulates into, and the push carries one gradient row per id the step touched:
only those rows travel, both ways."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from workers.parallel.base import clip_grads_
from workers.parallel.parameter_server.sharding import RowSharding


@dataclass
class PulledRows:
    """The rows of one step: per table, the sorted ids touched and their rows (leaves with a gradient)."""

    ids: list[torch.Tensor]
    rows: list[torch.Tensor]
    staleness: int  # the most steps of some trainer's updates these rows may lack (0 under sync)

    def lookup(self, sparse: torch.Tensor) -> list[torch.Tensor]:
        """The embedding rows of a (batch, tables) id tensor, one (batch, dim) tensor per table."""
        return [self.rows[t][torch.searchsorted(self.ids[t], sparse[:, t].contiguous())]
                for t in range(sparse.shape[1])]

    def clip_gradients(self, max_norm: float) -> float:
        """Scale the gradients the step left on these rows to a global norm of at most `max_norm`; their norm
        before. A non-finite norm zeroes them: the push then changes nothing (the step's update is skipped)
        but still advances this trainer's clock, so no other trainer waits for it."""
        norm = clip_grads_(self.rows, max_norm)
        if norm is None:
            return 0.0
        if not math.isfinite(norm):
            for r in self.rows:
                if r.grad is not None:
                    r.grad.zero_()
        return norm

    def whole(self, first: int) -> list[torch.Tensor]:
        """The tables from `first` on, pulled whole (pull's `whole`): one (1, numel) leaf each."""
        return self.rows[first:]


class ShardClient:
    def __init__(self, shards: list[Any], sharding: RowSharding, trainer: int, get=None):
        """`shards`: the shard actors' handles (Ray), in shard order; `get`: ray.get (a parameter for tests)."""
        import ray

        self.shards, self.sharding, self.trainer = shards, sharding, trainer
        self.get = get or ray.get

    def pull(self, step: int, sparse: list[torch.Tensor], whole: int = 0) -> PulledRows:
        """The rows every (batch, tables) id tensor in `sparse` touches, for `step` (waits as the mode says);
        `whole`: that many tables after the sparse ones are single-row tables pulled every step (async's dense
        parameters, flattened: they all live on shard 0)."""
        every = torch.cat([s.reshape(-1, s.shape[-1]) for s in sparse]).cpu()
        ids = [torch.unique(every[:, t]) for t in range(every.shape[1])]
        ids += [torch.zeros(1, dtype=ids[0].dtype if ids else torch.long) for _ in range(whole)]
        splits = [self.sharding.split(i) for i in ids]  # [table][shard] -> (positions, local ids)
        calls = [shard.pull.remote(self.trainer, step, [splits[t][s][1] for t in range(len(ids))])
                 for s, shard in enumerate(self.shards)]
        answers = self.get(calls)
        staleness = max((stale for _, stale in answers), default=0)
        rows = []
        for t, table_ids in enumerate(ids):
            dim = max(a[0][t].shape[1] for a in answers)
            table = torch.empty(len(table_ids), dim)
            for s, (shard_rows, _) in enumerate(answers):
                table[splits[t][s][0]] = shard_rows[t]
            rows.append(table.requires_grad_(True))
        return PulledRows(ids, rows, staleness)

    def push(self, step: int, pulled: PulledRows, lr: float) -> int:
        """The gradients the step's backward left on the pulled rows, each to its shard; the rows pushed."""
        per_shard: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.shards]
        for ids, rows in zip(pulled.ids, pulled.rows):
            grad = rows.grad if rows.grad is not None else torch.zeros_like(rows)
            for s, (positions, local) in enumerate(self.sharding.split(ids)):
                per_shard[s].append((local, grad[positions].detach()))
        calls = [shard.push.remote(self.trainer, step, grads, lr) for shard, grads in zip(self.shards, per_shard)]
        return sum(self.get(calls))

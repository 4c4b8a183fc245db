"""One parameter-server shard: its rows of every embedding table, their optimiser state, the step clock.

A plain class with async methods, run as a Ray async actor (server.py), so a pull that must wait for the
clock yields the event loop to the pushes it waits for. Updates are sparse: a push carries only the rows a
trainer's batch touched, and only those rows (and their Adagrad sums) change, as a dense update with zero
gradients elsewhere would leave them (torch.optim.Adagrad's rule, lr_decay 0, no weight decay).

Under sync the pushes of step t are summed and applied once every trainer's is in, divided by the number
of trainers: the mean gradient of the global batch, what data parallelism all-reduces. Under bounded and
async each push is applied when it arrives (its gradient / trainers, so a step's pushes still sum to that
mean's size).
"""

from __future__ import annotations

import asyncio

import torch

from workers.parallel.parameter_server.clock import StepClock

ADAGRAD_EPS = 1e-10  # torch.optim.Adagrad's default
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.999), 1e-8  # torch.optim.AdamW's defaults, as the trainers' (workers/parallel/base.py)


class Shard:
    def __init__(self, shard: int, tables: list[torch.Tensor], trainers: int, mode: str, staleness: int,
                 optimizer: str, weight_decay: float = 0.0):
        self.shard, self.trainers, self.optimizer, self.weight_decay = shard, trainers, optimizer, weight_decay
        self.rows = [t.detach().clone().float() for t in tables]
        self.sums = [torch.zeros_like(t) for t in self.rows]  # Adagrad's running sums of squared gradients
        self.avgs = [torch.zeros_like(t) for t in self.rows]  # AdamW's first moments (sums: its second)
        self.updates = 0  # AdamW's step count, for its bias corrections
        self.clock = StepClock(trainers, mode, staleness)
        self.pending: dict[int, list] = {}  # sync: step -> the pushes received for it
        self.rows_pulled = self.rows_pushed = 0
        self._changed: asyncio.Condition | None = None  # made on the actor's event loop

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def pull(self, trainer: int, step: int, ids: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
        """The rows at local indexes `ids` (one tensor per table) once the clock lets `trainer` read for
        `step`, and the staleness they have then."""
        changed = self._condition()
        async with changed:
            await changed.wait_for(lambda: self.clock.may_pull(step))
            self.rows_pulled += sum(int(i.numel()) for i in ids)
            return [rows[i].clone() for rows, i in zip(self.rows, ids)], self.clock.staleness_of(step)

    async def push(self, trainer: int, step: int, grads: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> int:
        """Trainer `trainer`'s gradients of step `step`: (local indexes, gradient rows) per table, no index
        twice. Returns the rows it carried."""
        changed = self._condition()
        async with changed:
            carried = sum(int(i.numel()) for i, _ in grads)
            self.rows_pushed += carried
            if self.clock.mode == "sync":
                received = self.pending.setdefault(step, [])
                received.append(grads)
                if len(received) == self.trainers:  # the whole global batch: one update, as all-reduce gives
                    del self.pending[step]
                    self._apply(_summed(received, len(self.rows)), lr)
                    for t in range(self.trainers):
                        self.clock.advance(t, step)
            else:
                self._apply(grads, lr)
                self.clock.advance(trainer, step)
            changed.notify_all()
            return carried

    def _apply(self, grads: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> None:
        if self.optimizer == "adamw":
            self._adamw(grads, lr)
            return
        for table, (ids, grad) in enumerate(grads):
            if ids.numel() == 0:
                continue
            g = grad.float() / self.trainers
            if self.optimizer == "adagrad":
                self.sums[table][ids] += g * g
                self.rows[table][ids] -= lr * g / (self.sums[table][ids].sqrt() + ADAGRAD_EPS)
            else:
                self.rows[table][ids] -= lr * g

    def _adamw(self, grads: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> None:
        """torch.optim.AdamW's single-tensor step over every row, the untouched ones with a zero gradient."""
        self.updates += 1
        beta1, beta2 = ADAMW_BETAS
        correction1, correction2 = 1 - beta1 ** self.updates, (1 - beta2 ** self.updates) ** 0.5
        for table, (ids, grad) in enumerate(grads):
            dense = torch.zeros_like(self.rows[table])
            dense[ids] = grad.float() / self.trainers
            rows, avg, sq = self.rows[table], self.avgs[table], self.sums[table]
            rows.mul_(1 - lr * self.weight_decay)
            avg.lerp_(dense, 1 - beta1)
            sq.mul_(beta2).addcmul_(dense, dense, value=1 - beta2)
            rows.addcdiv_(avg, (sq.sqrt() / correction2).add_(ADAMW_EPS), value=-lr / correction1)

    async def leave(self, trainer: int) -> None:
        """Trainer `trainer` is lost for good (async: the supervisor says so): no clock waits for it."""
        changed = self._condition()
        async with changed:
            self.clock.leave(trainer)
            changed.notify_all()

    async def slowest(self) -> int:
        """The slowest live trainer's clock: where a trainer that joins starts (async)."""
        return self.clock.slowest

    async def rejoin(self, trainer: int, step: int) -> None:
        """Trainer `trainer` (lost, or never started) trains again from step `step` (async: elastic join)."""
        changed = self._condition()
        async with changed:
            self.clock.left.discard(trainer)
            self.clock.clocks[trainer] = step
            changed.notify_all()

    async def lead(self) -> int:
        """The live trainer that writes what one trainer writes for all (checkpoints, the export): the lowest."""
        return min(self.clock.live, default=0)

    async def finished(self, steps: int) -> int:
        """Once every live trainer's push of its last step is in: the lead trainer then."""
        changed = self._condition()
        async with changed:
            await changed.wait_for(lambda: self.clock.finished(steps))
            return min(self.clock.live, default=0)

    def stats(self) -> dict:
        return {"shard": self.shard, "rows_pulled": self.rows_pulled, "rows_pushed": self.rows_pushed,
                "clocks": list(self.clock.clocks), "left": sorted(self.clock.left)}

    def state_dict(self) -> dict:
        return {"rows": [r.clone() for r in self.rows], "sums": [s.clone() for s in self.sums],
                "avgs": [a.clone() for a in self.avgs], "updates": self.updates, "clock": self.clock.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's state; pushes of steps after it that were pending are dropped (they are redone)."""
        self.rows = [r.clone() for r in state["rows"]]
        self.sums = [s.clone() for s in state["sums"]]
        self.avgs = [a.clone() for a in state["avgs"]]
        self.updates = int(state["updates"])
        # Saved when every trainer's push of the step was in (equal clocks): as many as the job has trainers now.
        self.clock.load_state_dict({"clocks": [min(state["clock"]["clocks"])] * self.trainers})
        self.pending.clear()


def _summed(pushes: list[list[tuple[torch.Tensor, torch.Tensor]]], tables: int) -> list[tuple[torch.Tensor,
                                                                                                torch.Tensor]]:
    """Every trainer's (ids, gradient rows) per table, rows of the same id added up (ids sorted)."""
    out = []
    for table in range(tables):
        ids = torch.cat([push[table][0] for push in pushes])
        grads = torch.cat([push[table][1] for push in pushes])
        unique, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros(len(unique), *grads.shape[1:], dtype=grads.dtype).index_add_(0, inverse, grads)
        out.append((unique, summed))
    return out

"""Chimera: two pipelines over the same ranks in opposite directions (schedule: chimera_schedule.py).

Rank r holds stage r of the "down" pipeline and stage P-1-r of the "up" one: one module with the
blocks of both (PipelineRank), so ranks r and P-1-r hold the same parameters, as do their
data-parallel replicas. Each micro-batch's loss is scaled by 2 / (the step's micro-batches): each
pipeline sees half of them, and averaging a stage's gradients over its two copies (and dp) then gives
the single-process sum, so the losses match the reference. The rank runs its operation list of the
plan in order, receiving activations and gradients by tagged point-to-point messages posted in
the order both ends of a pair agree on, and sending without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from workers.parallel.base import ForwardBackward, LossFn, StrategyContext
from workers.parallel.pipeline.chimera_schedule import ChimeraPlan, Message, Op, build, pair_order
from workers.parallel.pipeline.split import StagePlan
from workers.parallel.pipeline.stage_meter import StageTimes, saved_activation_bytes
from workers.parallel.pipeline.strategy import PipelineRank, PipelineStrategy
from workers.parallel.replicas import ReplicaGroup, local


class ChimeraStrategy(PipelineStrategy):
    stage_copies = 2

    def held_stages(self) -> list[StagePlan]:
        mirror = self.pp - 1 - self.pp_rank
        return [p for p in self.plans if p.stage in (self.pp_rank, mirror)]

    def build_schedule(self, wrapped: PipelineRank, mine: list[StagePlan], ctx: StrategyContext) -> None:
        self.wrapped_chunks = wrapped.chunks
        self.plan: ChimeraPlan = build(self.pp, self.microbatches)
        self.links = _Links(self.plan, self.pp_rank, lambda i: self.global_rank(i), self.pp_group)
        # A stage's two copies (ranks r and P-1-r) and their dp replicas: one gradient group per pair.
        coords = [ctx.spec.dims.coordinates(r) for r in range(dist.get_world_size())]
        for a in range(self.pp // 2):  # every rank creates every group, in the same order
            ranks = [r for r, c in enumerate(coords) if c["pp"] in (a, self.pp - 1 - a)]
            group = dist.new_group(ranks)
            if self.pp_rank in (a, self.pp - 1 - a):
                self.copies_group, self.copies_ranks = group, tuple(ranks)
        self.params = {local(p).untyped_storage().data_ptr() for p in wrapped.parameters()}

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        return [ReplicaGroup(self.copies_ranks, tuple(local(p.detach()) for p in wrapped.parameters()))]

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        self.check_flushes(micro)
        m = self.microbatches
        times = StageTimes()
        losses: list[float] = []
        entered = time.perf_counter()
        self.control.barrier("pp")  # the pipeline's ranks start together: a common clock
        started = time.perf_counter()
        for first in range(0, len(micro), m):
            flush = _Flush(self, micro[first:first + m], loss_fn, len(micro), times, ctx.device)
            losses += flush.run()
        times.wall_s = time.perf_counter() - started
        loss, makespan = self._pipeline_loss_and_makespan(losses, times.wall_s)
        stage = times.report(self.pp_rank, self.theoretical, makespan)
        ctx.comm.logical_bytes += self._p2p_bytes(len(micro))
        self.data_parallel.reduce(wrapped, ctx)  # over the stage's two copies and their replicas
        comm_s = max(0.0, time.perf_counter() - entered - stage["busy_s"])
        counts = self.pp_rank == 0  # rank 0 feeds the down pipeline and sees every micro-batch: count once
        samples = sum(x.shape[0] for x, _ in micro) if counts else 0
        tokens = sum(x.numel() for x, _ in micro if x.dtype == torch.long) if counts else 0
        return ForwardBackward(loss, samples, tokens, comm_time_s=comm_s, stage=stage)

    def _pipeline_loss_and_makespan(self, losses, wall_s: float) -> tuple[float, float]:
        """Both pipelines' last stages hold losses (down: rank P-1, up: rank 0): their sum over the pipeline."""
        mine = torch.tensor([wall_s, sum(losses)], dtype=torch.float64)
        every = [torch.zeros(2, dtype=torch.float64) for _ in range(self.pp)]
        self.control.all_gather(every, mine, dim="pp")
        return float(sum(float(t[1]) for t in every)), max(float(t[0]) for t in every)

    def gradient_group(self):
        return self.copies_group  # a stage's two copies (ranks r and P-1-r) and their dp replicas

    def _p2p_bytes(self, n_micro: int) -> int:
        sends = sum(self.plan.sends_after(op) is not None for op in self.plan.ops[self.pp_rank])
        return sends * (n_micro // self.microbatches) * self.hidden_bytes


class _Links:
    """This rank's point-to-point messages of a flush, issued per peer in the plan's agreed order."""

    def __init__(self, plan: ChimeraPlan, me: int, global_rank: Callable[[int], int], group):
        self.me, self.global_rank, self.group = me, global_rank, group
        self.order = {pair: msgs for pair, msgs in pair_order(plan).items() if me in pair}
        self.index = {(m.producer, m.dst): (pair, i) for pair, msgs in self.order.items() for i, m in enumerate(msgs)}

    def start(self) -> None:
        self.posted: dict[Op, tuple[dist.Work | None, torch.Tensor]] = {}
        self.next = dict.fromkeys(self.order, 0)  # per pair: the first message not yet issued here
        self.sends: list[tuple[dist.Work | None, torch.Tensor]] = []

    def _issue_up_to(self, pair: tuple[int, int], last: int, buffer_for: Callable[[Message], torch.Tensor]) -> None:
        """Post the receives of this pair before message `last` (exclusive), in the agreed order."""
        msgs = self.order[pair]
        while self.next[pair] < last:
            msg = msgs[self.next[pair]]
            if msg.dst == self.me:
                buf = buffer_for(msg)
                work = dist.irecv(buf, src=self.global_rank(msg.src), group=self.group, tag=msg.tag)
                self.posted[msg.producer] = (work, buf)
            # a send of ours earlier in the order was issued when its producer ran (it ran earlier)
            self.next[pair] += 1

    def send(self, msg: Message, tensor: torch.Tensor, buffer_for) -> None:
        pair, i = self.index[(msg.producer, msg.dst)]
        self._issue_up_to(pair, i, buffer_for)
        tensor = tensor.contiguous()
        self.sends.append((dist.isend(tensor, dst=self.global_rank(msg.dst), group=self.group, tag=msg.tag),
                           tensor))
        self.next[pair] = max(self.next[pair], i + 1)

    def receive(self, producer: Op | None, buffer_for, times: StageTimes) -> torch.Tensor:
        assert producer is not None, "chimera: every stage but the first receives from another rank"
        pair, i = self.index[(producer, self.me)]
        self._issue_up_to(pair, i + 1, buffer_for)
        work, buf = self.posted.pop(producer)
        t0 = time.perf_counter()
        if work is not None:  # None: this rank is not in the group (never here: the plan is the pp group's)
            work.wait()
        times.p2p_calls.append((time.perf_counter() - t0, True))
        return buf

    def finish(self, times: StageTimes) -> None:
        t0 = time.perf_counter()
        for work, _ in self.sends:
            if work is not None:
                work.wait()
        times.p2p_calls.append((time.perf_counter() - t0, False))


class _Flush:
    """One flush of the plan on this rank: its operations in order, activations kept for backward."""

    def __init__(self, strategy: ChimeraStrategy, micro: list, loss_fn: LossFn, step_micro: int,
                 times: StageTimes, device: torch.device):
        self.s, self.micro, self.loss_fn, self.times, self.device = strategy, micro, loss_fn, times, device
        self.scale = 2.0 / step_micro  # each pipeline sees half the micro-batches (module docstring)
        self.step_micro = step_micro
        self.saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor, int]] = {}
        self.losses: list[float] = []

    def _buffer(self, msg: Message) -> torch.Tensor:
        p = self.s.probe
        rows = self.micro[msg.producer.micro][0].shape[0]
        return torch.empty((rows, *p.hidden_shape[1:]), dtype=p.hidden_dtype, device=self.device)

    def run(self) -> list[float]:
        links = self.s.links
        links.start()
        for op in self.s.plan.ops[self.s.pp_rank]:
            (self._forward if op.kind == "F" else self._backward)(op)
        links.finish(self.times)
        return self.losses

    def _forward(self, op: Op) -> None:
        s, links = self.s, self.s.links
        chunk = s.wrapped_chunks[op.stage]
        x, target = self.micro[op.micro]
        if op.stage == 0:
            inp, held = x.to(self.device), None
        else:
            held = links.receive(self.s.plan.needs(op), self._buffer, self.times).requires_grad_()
            inp = held
        t0 = time.perf_counter()
        with saved_activation_bytes(s.params) as saved:
            out = chunk(inp)
            if op.stage == s.pp - 1:
                loss = self.loss_fn(out, target.to(self.device))
                self.losses.append(float(loss.detach()) / self.step_micro)
                out = loss * self.scale
        self.times.forward_s += time.perf_counter() - t0
        self.saved[(op.pipe, op.micro)] = (held, out, sum(saved.values()))
        self._note_peak()
        msg = s.plan.sends_after(op)
        if msg is not None:
            links.send(msg, out.detach(), self._buffer)

    def _backward(self, op: Op) -> None:
        s, links = self.s, self.s.links
        held, out, _ = self.saved.pop((op.pipe, op.micro))
        grad = None if op.stage == s.pp - 1 else links.receive(s.plan.needs(op), self._buffer, self.times)
        t0 = time.perf_counter()
        torch.autograd.backward(out, grad)
        self.times.backward_s += time.perf_counter() - t0
        msg = s.plan.sends_after(op)
        if msg is not None:
            assert held is not None and held.grad is not None
            links.send(msg, held.grad, self._buffer)

    def _note_peak(self) -> None:
        t = self.times
        t.activation_bytes_peak = max(t.activation_bytes_peak, sum(b for _, _, b in self.saved.values()))
        t.activation_microbatches_peak = max(t.activation_microbatches_peak, len(self.saved))

"""PipeDream and PipeDream-2BW: 1F1B without a flush between steps, each micro-batch's backward on the
weights its forward used.

Stage s (of P) keeps k = P-1-s micro-batches in flight across a step boundary: a step's call runs its m
new forwards and, 1F1B-style, a backward after each forward once k+1 are in flight, so it ends with the
step's last k micro-batches still in flight; their backwards run in the next call, after the optimizer
has updated the weights. Each call therefore forwards on a copy of the stage's weights taken when it
starts (`WeightVersion`); a micro-batch's backward runs on the version its forward used (weight
stashing), so at most two versions live at once (m >= P).

The two schedules differ in which gradients a step applies:
- `pipedream_2bw` (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML'21): the
  previous step's micro-batches, all computed on the previous version: W(t+1) = W(t) - lr grad(W(t-1)),
  the same one-step delay on every stage (staleness 1; the first step applies none).
- `pipedream` (Narayanan et al., "PipeDream", SOSP'19, a step's update in place of each micro-batch's):
  the micro-batches whose backward ran in this step, each computed on its own version: stage s applies
  k of them one version late (staleness k/m, 0 on the last stage).

Messages are tagged point-to-point ones, paired as Megatron's 1F1B pairs them (an activation sent with
the gradient received for the next backward, a gradient sent with the next activation received), so
both ends of a link issue them together. A drain (before a checkpoint, a validation or the export)
runs the backwards in flight; it changes no number, since every micro-batch keeps its version and the
step its gradient goes to. What it leaves owed to the next step is saved with the checkpoint, so a
resumed run continues bit-identically.
"""

from __future__ import annotations

import io
import time
from collections import deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from workers.checkpointing import checkpoint_root, step_name
from workers.parallel.base import ForwardBackward, LossFn, StrategyContext
from workers.parallel.pipeline.split import StagePlan
from workers.parallel.pipeline.stage_meter import StageTimes, saved_activation_bytes
from workers.parallel.pipeline.strategy import PipelineRank, PipelineStrategy
from workers.parallel.replicas import local

OWED = "pipeline-owed-rank{rank}.pt"  # in the checkpoint's directory: pruned with it
Posted = tuple["dist.Work | None", torch.Tensor]  # a receive in flight and its buffer


@dataclass
class WeightVersion:
    """The stage's weights as one step's forwards saw them, and the gradients computed on them."""

    params: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    backwards: int = 0  # micro-batches whose gradient is in `grads`

    @classmethod
    def of(cls, chunk: nn.Module) -> WeightVersion:
        return cls({n: p.detach().clone().requires_grad_(p.requires_grad) for n, p in chunk.named_parameters()})

    @property
    def storages(self) -> set[int]:
        """Its tensors' storages: weights autograd saves are not activations."""
        return {t.untyped_storage().data_ptr() for t in self.params.values()}

    def take_grads(self) -> None:
        """Move what backward left on the version's tensors into `grads` (summed)."""
        for n, t in self.params.items():
            if t.grad is not None:
                self.grads[n] = self.grads[n] + t.grad if n in self.grads else t.grad
                t.grad = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.params.values())


@dataclass
class InFlight:
    micro: int  # its index in the stream of micro-batches
    version: WeightVersion
    held: torch.Tensor | None  # the received activation (its .grad goes back); None on the first stage
    out: torch.Tensor  # the activation sent on, or the scaled loss on the last stage
    activation_bytes: int


class AsyncPipelineStrategy(PipelineStrategy):
    def build_schedule(self, wrapped: PipelineRank, mine: list[StagePlan], ctx: StrategyContext) -> None:
        assert len(mine) == 1, "pipedream schedules hold one stage per rank"
        self.chunk = wrapped.chunks[mine[0].stage]
        self.stage_index, self.last_stage = mine[0].stage, self.pp - 1
        self.depth = self.pp - 1 - self.stage_index  # micro-batches in flight across a step boundary
        self.flight: deque[InFlight] = deque()
        self.next_micro = 0
        self.older: WeightVersion | None = None  # the previous step's version, while it is owed backwards
        self.current: WeightVersion | None = None
        self.posted_input: Posted | None = None  # the next forward's activation, received with a send
        self.grad_in: Posted | None = None
        self.sends: list[tuple[dist.Work | None, torch.Tensor]] = []  # this step's, and the previous step's
        self.earlier_sends: list[tuple[dist.Work | None, torch.Tensor]] = []
        self.staleness = 0.0
        self.versions_held = self.stashed_bytes = 0
        self.times = StageTimes()
        self.params = {local(p).untyped_storage().data_ptr() for p in wrapped.parameters()}

    # --- the step ----------------------------------------------------------------------------------

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        if len(micro) < self.pp:
            raise ValueError(f"{self.schedule_name}: {len(micro)} micro-batches this step, fewer than the "
                             f"{self.pp} stages that keep them in flight")
        self.times = StageTimes()
        self.loss_fn, self.step_micro = loss_fn, len(micro)
        self.losses: list[float] = []
        self.older, self.current = self.current, WeightVersion.of(self.chunk)
        # The copies this step holds: its own, and the previous step's while its last backwards are owed.
        held = [self.current] + [self.older] if self.older is not None and self.flight else [self.current]
        self.versions_held, self.stashed_bytes = len(held), sum(v.nbytes for v in held)
        entered = time.perf_counter()
        self.control.barrier("pp")
        started = time.perf_counter()
        for i, (x, y) in enumerate(micro):
            self._forward(x, y)
            if len(self.flight) > self.depth:
                self._backward(more_forwards=i + 1 < len(micro))
        self.times.wall_s = time.perf_counter() - started
        self._apply_gradients()
        self._retire_sends()
        loss, makespan = self._loss_and_makespan()
        stage = self.times.report(self.pp_rank, self.theoretical, makespan)
        ctx.comm.logical_bytes += self._p2p_bytes(len(micro))
        self.data_parallel.reduce(wrapped, ctx)  # over the stage's replicas (none where dp x cp is 1)
        comm_s = max(0.0, time.perf_counter() - entered - stage["busy_s"])
        counts = self.pp_rank == 0 and self.tp_rank == 0
        samples = sum(x.shape[0] for x, _ in micro) if counts else 0
        tokens = sum(x.numel() for x, _ in micro if x.dtype == torch.long) if counts else 0
        return ForwardBackward(loss, samples, tokens, comm_time_s=comm_s, stage=stage)

    def _apply_gradients(self) -> None:
        """The step's update: 2BW the older version's whole gradient; PipeDream all that ran in this step."""
        older, current = self.older, self.current
        assert current is not None and not any(f.version is older for f in self.flight), \
            "a version two steps old is still owed backwards: microbatches must be >= pp"
        for version in (older, current):
            if version is not None:
                version.take_grads()
        if self.schedule_name == "pipedream_2bw":
            sources = [older] if older is not None else []
            self.staleness = 1.0
        else:
            sources = [v for v in (older, current) if v is not None]
            late = older.backwards if older is not None else 0
            self.staleness = late / self.step_micro
        applied: dict[str, torch.Tensor] = {}
        for version in sources:
            for n, g in version.grads.items():
                applied[n] = applied[n] + g if n in applied else g
            version.grads, version.backwards = {}, 0
        for n, p in self.chunk.named_parameters():
            if p.requires_grad:
                p.grad = applied[n].detach().clone() if n in applied else torch.zeros_like(p)
        self.older = None

    # --- one micro-batch ---------------------------------------------------------------------------

    def _forward(self, x: torch.Tensor, y: torch.Tensor) -> None:
        s, j, version = self.stage_index, self.next_micro, self.current
        assert version is not None
        self.next_micro += 1
        held = None
        if s == 0:
            inp = x.to(self.device)
        else:
            if self.posted_input is None:
                self.posted_input = self._post([], (s - 1, _tag(j, "F"), self._shape(x)))
            held = self._wait(self.posted_input).requires_grad_()
            self.posted_input = None
            inp = held
        t0 = time.perf_counter()
        with saved_activation_bytes(self.params | version.storages) as saved:
            out = functional_call(self.chunk, version.params, (inp,))
            if s == self.last_stage:
                loss = self.loss_fn(out, y.to(self.device))
                self.losses.append(float(loss.detach()) / self.step_micro)
                out = loss / self.step_micro
        self.times.forward_s += time.perf_counter() - t0
        self.flight.append(InFlight(j, version, held, out, sum(saved.values())))
        self.times.activation_microbatches_peak = max(self.times.activation_microbatches_peak, len(self.flight))
        self.times.activation_bytes_peak = max(self.times.activation_bytes_peak,
                                               sum(f.activation_bytes for f in self.flight))
        if s < self.last_stage:
            steady = len(self.flight) > self.depth  # a backward follows: receive its gradient with this send
            oldest = self.flight[0]
            wanted = (s + 1, _tag(oldest.micro, "B"), tuple(oldest.out.shape)) if steady else None
            posted = self._post([(s + 1, _tag(j, "F"), out.detach())], wanted)
            self.grad_in = posted if steady else None

    def _backward(self, more_forwards: bool) -> None:
        s, f = self.stage_index, self.flight.popleft()
        grad = None
        if s < self.last_stage:
            assert self.grad_in is not None
            grad, self.grad_in = self._wait(self.grad_in), None
        t0 = time.perf_counter()
        torch.autograd.backward(f.out, grad)
        self.times.backward_s += time.perf_counter() - t0
        f.version.backwards += 1
        if s > 0:
            assert f.held is not None and f.held.grad is not None
            wanted = (s - 1, _tag(self.next_micro, "F"), tuple(f.held.shape)) if more_forwards else None
            posted = self._post([(s - 1, _tag(f.micro, "B"), f.held.grad)], wanted)
            if more_forwards:
                self.posted_input = posted

    def drain(self) -> None:
        """Run the backwards in flight (every stage of the pipeline calls it at the same point)."""
        while self.flight:
            if self.stage_index < self.last_stage:
                oldest = self.flight[0]
                self.grad_in = self._post([], (self.stage_index + 1, _tag(oldest.micro, "B"),
                                               tuple(oldest.out.shape)))
            self._backward(more_forwards=False)
        for work, _ in self.earlier_sends + self.sends:
            if work is not None:
                work.wait()
        self.earlier_sends, self.sends = [], []
        if self.current is not None:
            self.current.take_grads()

    # --- point to point ----------------------------------------------------------------------------

    def _shape(self, x: torch.Tensor) -> tuple[int, ...]:
        return (x.shape[0], *self.probe.hidden_shape[1:])

    def _post(self, sends: list[tuple[int, int, torch.Tensor]], wanted: tuple[int, int, tuple[int, ...]] | None,
              ) -> Posted:
        """Issue these sends and this receive as one batch (NCCL pairs them); returns the receive."""
        ops, buf = [], torch.empty(0)
        kept = [t.contiguous() for _, _, t in sends]
        for (peer, tag, _), tensor in zip(sends, kept):
            ops.append(dist.P2POp(dist.isend, tensor, self.global_rank(peer), self.pp_group, tag))
        if wanted is not None:
            peer, tag, shape = wanted
            buf = torch.empty(shape, dtype=self.probe.hidden_dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, buf, self.global_rank(peer), self.pp_group, tag))
        works = dist.batch_isend_irecv(ops) if ops else []
        coalesced = len(works) != len(ops)  # NCCL may answer a batch with one work
        for i, tensor in enumerate(kept):
            self.sends.append((works[-1] if coalesced else works[i], tensor))
        return (works[-1] if wanted is not None and works else None), buf

    def _wait(self, posted: Posted) -> torch.Tensor:
        work, buf = posted
        t0 = time.perf_counter()
        if work is not None:
            work.wait()
        self.times.p2p_calls.append((time.perf_counter() - t0, True))
        return buf

    def _retire_sends(self) -> None:
        """The previous step's sends have all been received by now (a step's last gradient sent is
        received early in the next one); this step's may still wait for the next."""
        for work, _ in self.earlier_sends:
            if work is not None:
                work.wait()
        self.earlier_sends, self.sends = self.sends, []

    def _loss_and_makespan(self) -> tuple[float, float]:
        mine = torch.tensor([self.times.wall_s, sum(self.losses)], dtype=torch.float64)
        every = [torch.zeros(2, dtype=torch.float64) for _ in range(self.pp)]
        self.control.all_gather(every, mine, dim="pp")
        return float(every[self.last_stage][1]), max(float(t[0]) for t in every)

    def _p2p_bytes(self, n_micro: int) -> int:
        edges = (self.stage_index < self.last_stage) + (self.stage_index > 0)
        return edges * n_micro * self.hidden_bytes

    # --- the loop's fixed points: drained before a checkpoint, a validation, the export ----------------

    def before_save(self, wrapped: nn.Module, storage, step: int, rank: int, control) -> None:
        self.drain()
        owed = self.current.grads if self.current is not None else {}
        backwards = self.current.backwards if self.current is not None else 0
        data = io.BytesIO()
        torch.save({"backwards": backwards, "grads": {n: g.detach().cpu() for n, g in owed.items()}}, data)
        (checkpoint_root(storage) / step_name(step)).write_bytes(OWED.format(rank=rank), data.getvalue())

    def after_load(self, storage, step: int, rank: int, control) -> None:
        """The gradients the checkpointed run owed its next step (a version without weights: none in flight).
        A checkpoint of another schedule (or one `init_from` names) owes none: the next step applies none."""
        try:
            raw = (checkpoint_root(storage) / step_name(step)).read_bytes(OWED.format(rank=rank))
        except FileNotFoundError:
            return
        owed = torch.load(io.BytesIO(raw), map_location=next(self.chunk.parameters()).device)
        self.current = WeightVersion({}, dict(owed["grads"]), int(owed["backwards"]))

    def evaluation_model(self, wrapped: nn.Module) -> nn.Module:
        self.drain()
        return wrapped

    def full_model_state(self, wrapped: nn.Module) -> dict[str, torch.Tensor]:
        self.drain()
        return super().full_model_state(wrapped)

    def step_report(self) -> dict[str, object]:
        return {"pipeline_staleness": self.staleness, "pipeline_weight_versions": self.versions_held,
                "pipeline_stashed_weight_bytes": self.stashed_bytes}


def _tag(micro: int, kind: str) -> int:
    """A message's tag between two stages: its micro-batch and kind (0 is the evaluation forward's)."""
    return 1 + 2 * (micro % (1 << 20)) + (kind == "B")

"""Pipeline parallelism (x data parallelism) on torch.distributed.pipelining.

Each rank of a pipeline holds one stage (or several: interleaved and V-shaped
schedules) of any model with repeated blocks, split by `workers.parallel.pipeline.split` and cut by
`workers.parallel.pipeline.stage` (the model's own forward, restricted to the stage). A step runs the
rank's micro-batches through the schedule in flushes of `microbatches`,
has the replicate data-parallel step (workers/parallel/data_parallel/) average the gradients over the
data-parallel replicas of the same stage (its reducer only: the schedule drives forward and backward),
and broadcasts the last stage's loss so every rank reports the whole model's
loss. Per-loss scaling by the step's micro-batch count (scale_grads=False)
makes the arithmetic the same as the single-process reference's accumulation.

Under context parallelism (pp x cp) every stage runs ring attention over its cp
group: a rank feeds the pipeline its cp shard of each micro-batch, so the
activations it passes go to the next stage's rank of the same cp index (its peer
in the pp group), each cp rank's loss is the mean over its equal share of tokens
(the job's loss, the mean over ranks, is the mean over all tokens), and
gradients are averaged over dp x cp.

Under pp x FSDP2 (parallel.zero 3, schedules gpipe and 1f1b) the shard step shards each rank's stage over its
replicas instead (workers/parallel/data_parallel/shard.py): its held blocks each an FSDP unit, the stage their
root; torch's PipelineStage keeps FSDP from reducing until a flush's last backward, then reduce-scatters.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)
from torch.distributed.tensor import DTensor, Shard

from workers.models.description import ModelDescription, describe_spec_model
from workers.parallel.base import (
    ForwardBackward,
    LossFn,
    StrategyContext,
)
from workers.parallel.context import apply_context_parallel
from workers.parallel.context.ring import take_ring_bytes
from workers.parallel.data_parallel.replicate import ReplicateStep
from workers.parallel.data_parallel.shard import ShardStep
from workers.parallel.layouts.data_parallel_options import DataParallelOptions
from workers.parallel.loop_hooks import LoopHooks
from workers.parallel.mesh import group_mesh
from workers.parallel.metering import metered_calls
from workers.parallel.parallelize import data_parallel_mesh, sequence_shard
from workers.parallel.pipeline.bubble import theoretical_bubble
from workers.parallel.pipeline.probe import Probe
from workers.parallel.pipeline.probe import probe as probe_model
from workers.parallel.pipeline.sample import sample_input
from workers.parallel.pipeline.split import StagePlan, plan_stages, stage_to_rank
from workers.parallel.pipeline.stage import (
    FullNames,
    StageModule,
    pruned_copy,
    replacements_for,
)
from workers.parallel.pipeline.stage_meter import StageMeter
from workers.parallel.replicas import ReplicaGroup, replicated_over
from workers.parallel.tensor_parallel import apply_tensor_parallel
from workers.spec import (
    SINGLE_STAGE_SCHEDULES,
    V_SCHEDULES,
    PipelineSpec,
    pipeline_microbatches,
)
from workers.training.losses import LOSSES

SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
    "looped_bfs": ScheduleLoopedBFS,
    "zero_bubble": ScheduleInterleavedZeroBubble,
    "zbv_zero_bubble": ScheduleZBVZeroBubble,
    "dualpipe_v": ScheduleDualPipeV,
}


class PipelineRank(FullNames):
    """What this rank trains and checkpoints: its stages' parameters under the full model's FQNs.

    Calling it runs the whole model's forward across the pipeline (no grad; for evaluation)
    and returns the outputs on every rank of the pipeline.
    """

    chunks: dict[int, StageModule]  # a plain attribute, set in __init__

    def __init__(self, full: nn.Module, desc: ModelDescription, probe: Probe, mine: list[StagePlan],
                 all_plans: list[StagePlan], strategy: "PipelineStrategy"):
        super().__init__()
        blocks = tuple(i for p in mine for i in p.blocks)
        first, last = any(p.has_embedding for p in mine), any(p.has_head for p in mine)
        # The union of this rank's stages; never run itself (the chunks are), so nothing stands in.
        self.adopt(pruned_copy(full, replacements_for(full, desc, probe, blocks, first, last, runnable=False)))
        # Plain attributes, not submodules: the chunks share this rank's modules under other copies.
        object.__setattr__(self, "chunks", {p.stage: StageModule(full, desc, probe, p.blocks, p.has_embedding,
                                                                 p.has_head) for p in mine})
        self._all_plans = all_plans
        self._probe = probe
        self._strategy = strategy

    def train(self, mode: bool = True):
        super().train(mode)
        for chunk in self.chunks.values():
            chunk.train(mode)
        return self

    @torch.no_grad()
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        s, p = self._strategy, self._probe
        x = idx
        for plan in self._all_plans:
            owner = s.owner(plan.stage)
            if owner != s.pp_rank:
                continue
            if plan.stage > 0 and s.owner(plan.stage - 1) != s.pp_rank:
                x = torch.empty((idx.shape[0], *p.hidden_shape[1:]), dtype=p.hidden_dtype, device=idx.device)
                dist.recv(x, src=s.global_rank(s.owner(plan.stage - 1)), group=s.pp_group)
            x = self.chunks[plan.stage](x)
            if plan.stage < len(self._all_plans) - 1 and s.owner(plan.stage + 1) != s.pp_rank:
                dist.send(x.contiguous(), dst=s.global_rank(s.owner(plan.stage + 1)), group=s.pp_group)
        last = s.owner(len(self._all_plans) - 1)
        out = x if last == s.pp_rank else torch.empty(p.output.shape_for(idx), dtype=p.output.dtype,
                                                      device=idx.device)
        dist.broadcast(out, src=s.global_rank(last), group=s.pp_group)
        return out


class PipelineStrategy(LoopHooks):
    name = "pipeline"
    stage_copies = 1  # pipeline ranks holding each stage (chimera: 2, one per direction)

    @property
    def hooks(self) -> LoopHooks:
        return self  # full_model_state: the export gathers the stages

    # --- setup -------------------------------------------------------------

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        spec = ctx.spec
        pipe = spec.parallel.pipeline or PipelineSpec()
        self.schedule_name, self.pp = pipe.schedule, spec.parallel.pp
        self.virtual_stages, self.microbatches = pipe.stages_per_rank, pipeline_microbatches(spec)
        self.n_stages = self.pp * self.virtual_stages
        self.v_shape = pipe.schedule in V_SCHEDULES
        coords = spec.dims.coordinates(ctx.rank)
        self.pp_rank, self.dp, self.dp_rank = coords["pp"], spec.dp, coords["dp"]
        self.shard = sequence_shard(spec.dims, ctx.rank)  # pp x cp: this rank's chunks of every sequence
        self.tp, self.tp_rank, self.cp = spec.parallel.tp, coords["tp"], spec.dims.cp
        self.tp_group = ctx.mesh["tp"].get_group()
        self.pp_group = ctx.mesh["pp"].get_group()
        self.control, self.device = ctx.control, ctx.device
        ctx.control.mirror(spec.dims, "pp")  # makespans, reported losses, the gathered state: host values
        self.plans = plan_stages(spec, self.n_stages, pipe.split)
        mine = self.held_stages()
        model = model.to(ctx.device)
        desc = describe_spec_model(model, spec.model)
        if self.tp > 1:  # PP x TP: shard every block by the model's plan first; stages pass replicated activations
            apply_tensor_parallel(model, ctx.mesh["tp"], sequence_parallel=False, desc=desc)
        cp_mesh = group_mesh(ctx.mesh, spec.dims, "cp")
        if cp_mesh is not None:  # before the probe and the stages' copies: they share the ring and position hooks
            apply_context_parallel(model, desc, cp_mesh.get_group())
        sample = sample_input(spec)  # a dict of inputs: probe_model says a pipeline takes one tensor
        if self.shard is not None and isinstance(sample, torch.Tensor):  # stages see cp shards: probe one
            sample = self.shard(sample, None)[0]  # (every cp rank probes together: the ring is collective)
        probe = probe_model(model, desc, sample.to(ctx.device) if isinstance(sample, torch.Tensor) else sample)
        take_ring_bytes()  # the probe's ring traffic is no step's

        options = DataParallelOptions.of(spec)
        self.sharded = options.kind == "fsdp"  # pp x FSDP2: the shard step shards each stage over its replicas
        self.data_parallel: ReplicateStep | ShardStep
        if self.sharded:  # the held blocks first: FSDP's forward hooks run before the stage's own (stage.py)
            self.data_parallel = ShardStep(options)
            blocks = desc.blocks(model)
            self.data_parallel.shard_stage_blocks([blocks[i] for p in mine for i in p.blocks], ctx)
        wrapped = PipelineRank(model, desc, probe, mine, self.plans, self)
        if self.sharded:
            for chunk in wrapped.chunks.values():  # each stage the root of its blocks (PipelineStage drives it)
                self.data_parallel.shard_stage(chunk)
        self.has_first = any(p.stage == 0 for p in mine)
        self.has_last = any(p.stage == self.n_stages - 1 for p in mine)
        # The step's loss function (the trainer's, e.g. poisoned by a nan fault) and micro-batch count.
        self._step_loss, self._step_micro = LOSSES[spec.train.loss], spec.grad_accum_steps
        self.probe = probe
        self.build_schedule(wrapped, mine, ctx)
        if not self.sharded:  # the stages' replicas reduce through the replicate step, after the schedule's backward
            self.data_parallel = ReplicateStep(options, self.gradient_group())
            self.data_parallel.apply(wrapped, ctx)  # its reducer wraps nothing (StageAllReduce)
        self.theoretical = theoretical_bubble(self.schedule_name, self.pp, self.microbatches, self.virtual_stages)
        hidden = torch.empty(probe.hidden_shape, dtype=probe.hidden_dtype)  # one sample micro-batch's
        self.hidden_bytes = hidden.numel() * hidden.element_size()
        return wrapped

    def held_stages(self) -> list[StagePlan]:
        """The stages this rank runs."""
        return [p for p in self.plans if self.owner(p.stage) == self.pp_rank]

    def build_schedule(self, wrapped: PipelineRank, mine: list[StagePlan], ctx: StrategyContext) -> None:
        """torch's PipelineStages and schedule over the rank's stages, metered."""
        self.stages = [PipelineStage(wrapped.chunks[plan.stage], plan.stage, self.n_stages, ctx.device,
                                     group=self.pp_group) for plan in mine]

        def scaled_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return self._step_loss(outputs, targets) / self._step_micro

        stages = self.stages[0] if self.schedule_name in SINGLE_STAGE_SCHEDULES else self.stages
        self.schedule = SCHEDULES[self.schedule_name](stages, n_microbatches=self.microbatches,
                                                      loss_fn=scaled_loss, scale_grads=False)
        params = {_local(p).untyped_storage().data_ptr() for p in wrapped.parameters()}
        self.meter = StageMeter(self.stages, self.schedule, params)

    def owner(self, stage: int) -> int:
        """The pipeline rank (index in the pp group) that holds `stage`."""
        return stage_to_rank(stage, self.pp, self.v_shape)

    def global_rank(self, pp_index: int) -> int:
        return dist.get_global_rank(self.pp_group, pp_index)

    def gradient_group(self):
        """The group a stage's gradients are averaged over: None, the data-parallel step's own (dp x cp)."""
        return None

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return self.data_parallel.build_optimizer(wrapped, ctx)

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        if self.sharded:
            return []  # every shard of a stage lives on one rank
        return replicated_over(data_parallel_mesh(ctx), wrapped.parameters())  # its stages (tp shards), dp x cp

    def describe_split(self) -> list[dict]:
        return [{**p.to_dict(), "rank": self.owner(p.stage)} for p in self.plans]

    # --- one step ----------------------------------------------------------

    def check_flushes(self, micro: list) -> None:
        """A step runs whole flushes of `microbatches`."""
        if len(micro) % self.microbatches:
            raise ValueError(f"pipeline: {len(micro)} micro-batches this step is not a multiple of "
                             f"parallel.pipeline.microbatches={self.microbatches} (uneven data shares are not "
                             f"supported)")

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        self.check_flushes(micro)
        m = self.microbatches
        self._step_loss, self._step_micro = loss_fn, len(micro)
        self.meter.reset()
        losses: list[torch.Tensor] = []
        entered = time.perf_counter()
        self.control.barrier("pp")  # the pipeline's ranks start the flush together: a common clock
        # pp x FSDP2: the shard step's gathers and reduce-scatters, counted as under FSDP alone
        with self.meter.measuring(), metered_calls(ctx.comm) if self.sharded else contextlib.nullcontext():
            for start in range(0, len(micro), m):  # one pipeline flush per `microbatches` micro-batches
                flush = micro[start:start + m]
                if self.shard is not None:
                    flush = [self.shard(x, y) for x, y in flush]
                inputs = torch.cat([x for x, _ in flush]).to(ctx.device)
                targets = torch.cat([y for _, y in flush]).to(ctx.device)
                args = (inputs,) if self.has_first else ()
                self.schedule.step(*args, target=targets, losses=losses, return_outputs=False)
        loss, makespan = self._pipeline_loss_and_makespan(losses, self.meter.times.wall_s)
        stage = self.meter.times.report(self.pp_rank, self.theoretical, makespan)
        ctx.comm.logical_bytes += self._p2p_bytes(len(micro)) + (take_ring_bytes() if self.shard else 0)
        self.data_parallel.reduce(wrapped, ctx)  # over the stage's replicas (none where dp x cp is 1)
        # Everything here but the stage's own compute was spent blocked on peers (start barrier, p2p
        # transfers and waits, the makespan all-gather, the dp all-reduce): like a DDP rank's comm time,
        # so that compute time (step - comm) blames a slow stage and not the stages waiting for it.
        comm_s = max(0.0, time.perf_counter() - entered - stage["busy_s"])
        first_replica_stage = self.pp_rank == 0 and self.tp_rank == 0  # count data once per pipeline
        samples = sum(x.shape[0] for x, _ in micro) if first_replica_stage else 0
        # cp ranks each count their share of the tokens (the whole sequence divided by cp)
        tokens = sum(x.numel() for x, _ in micro if x.dtype == torch.long) if first_replica_stage else 0
        tokens //= self.cp
        return ForwardBackward(loss, samples, tokens, comm_time_s=comm_s, stage=stage)

    def _pipeline_loss_and_makespan(self, losses: list[torch.Tensor], wall_s: float) -> tuple[float, float]:
        """The whole model's loss (from the rank holding the last stage) and the slowest rank's schedule
        time, on every rank of the pipeline: one small all-gather."""
        mine = torch.tensor([wall_s, sum(float(loss.detach()) for loss in losses) if self.has_last else 0.0],
                            dtype=torch.float64)
        every = [torch.zeros(2, dtype=torch.float64) for _ in range(self.pp)]
        self.control.all_gather(every, mine, dim="pp")
        loss = float(every[self.owner(self.n_stages - 1)][1])
        return loss, max(float(t[0]) for t in every)

    def _p2p_bytes(self, n_micro: int) -> int:
        """Logical bytes this rank sends per step: activations forward and their gradients backward."""
        sends = 0
        for stage in self.stages:
            s = stage.stage_index
            if s < self.n_stages - 1 and self.owner(s + 1) != self.pp_rank:
                sends += 1
            if s > 0 and self.owner(s - 1) != self.pp_rank:
                sends += 1
        return sends * n_micro * self.hidden_bytes

    # --- clipping and evaluation ---------------------------------------------

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        """Clip by the norm over the whole model: squared norms summed over the pipeline's stages (and,
        with TP, over the tensor-parallel shards, counting a replicated parameter once)."""
        grads = [p.grad for p in wrapped.parameters() if p.grad is not None]
        # One fused norm per tensor, on the device; a replicated tensor's square counts 1/tp per shard.
        weights = torch.tensor([1.0 if _sharded(g) or self.tp == 1 else 1.0 / self.tp for g in grads] or [0.0],
                               device=self.device)
        norms = torch._foreach_norm([_local(g) for g in grads]) if grads else [torch.zeros((), device=self.device)]
        local = (torch.stack(norms).square() * weights).sum().reshape(1) / self.stage_copies
        dist.all_reduce(local, group=self.pp_group)
        if self.sharded:  # FSDP: each replica holds a shard of every gradient of its stage
            assert isinstance(self.data_parallel, ShardStep) and self.data_parallel.dp_mesh is not None
            dist.all_reduce(local, group=self.data_parallel.dp_mesh.get_group())
        if self.tp > 1:
            dist.all_reduce(local, group=self.tp_group)
        total = local.sqrt()
        if math.isfinite(max_norm):
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # as clip_grad_norm_ does, in float32
            if grads:
                torch._foreach_mul_([_local(g) for g in grads], coef.reshape(()))
        return float(total)

    def full_model_state(self, wrapped: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model on every rank (collective): the stages' states gathered over the pipeline."""
        local = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
                 for k, v in wrapped.state_dict().items()}  # full_tensor: a collective over tp, same order
        gathered: list[dict] = [None] * self.pp  # type: ignore[list-item]
        self.control.all_gather_object(gathered, local, dim="pp")
        state: dict[str, torch.Tensor] = {}
        for part in gathered:
            state.update(part)
        return state


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def _sharded(t: torch.Tensor) -> bool:
    return isinstance(t, DTensor) and any(isinstance(pl, Shard) for pl in t.placements)

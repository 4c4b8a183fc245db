"""Subnetwork data parallelism (parallel.sdp): each worker trains its own subnetwork of the model.

wrap: assign masks (workers/parallel/sdp/masks.py), cut this worker's subnetwork
(workers/parallel/sdp/subnetwork.py), optionally FSDP-shard it over the worker's
dp_shard ranks (zero 3), and create the holder-set process groups.
Synchronisation (workers/parallel/sdp/sync.py): sync every_step averages gradients
among each piece's holders before the update; sync {period: H} lets workers
step on their own gradients and averages parameters among holders every H
updates (and after the last). Backward masking then has each piece's lowest
holder broadcast the new values to the workers that use it frozen.

Checkpoints: the module a rank trains is named after its worker
("worker2.blocks.0..."), so DCP saves every worker's subnetwork side by side
with its optimiser state and its mask (buffer "mask_worker2", checked on
load); they resume SDP -> SDP at the same world size and masks. The exported
model (model.safetensors) is the full model assembled from all workers, which
any layout loads (train.init_from).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn

from workers.models import build_model
from workers.models.description import blocks_at
from workers.parallel.base import (
    ForwardBackward,
    LossFn,
    StrategyContext,
    accumulate,
    adamw,
    local_clip_grad_norm,
)
from workers.parallel.common import apply_activation_checkpointing, precision
from workers.parallel.data_parallel.shard import sharded_forward_backward
from workers.parallel.data_parallel.shard_root import root_reshard_after_forward
from workers.parallel.loop_hooks import LoopHooks
from workers.parallel.mesh import group_mesh
from workers.parallel.replicas import ReplicaGroup
from workers.parallel.sdp.assignment import assignment_of, blocks_of
from workers.parallel.sdp.subnetwork import build_subnetwork, mask_tensor
from workers.parallel.sdp.sync import HolderSync
from workers.spec import (
    SDPPeriodSpec,
)


class SDPModel(nn.Module):
    """This worker's subnetwork under a per-worker name, plus the mask it was cut with."""

    def __init__(self, subnet: nn.Module, worker: int, mask: torch.Tensor):
        super().__init__()
        self.worker = worker
        self.add_module(f"worker{worker}", subnet)
        self.register_buffer(f"mask_worker{worker}", mask.clone())
        self.register_load_state_dict_post_hook(_check_mask(mask))

    @property
    def subnet(self) -> nn.Module:
        return getattr(self, f"worker{self.worker}")

    def forward(self, *args, **kwargs):
        return self.subnet(*args, **kwargs)  # any model's call convention (workers/model_io.py)


def load_full_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load the assembled parameters; names a tied weight also goes by (lm_head = embed_tokens) are
    left out of `state` (named_parameters lists a shared tensor once) and are filled by the tie."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    loaded = {id(q) for n, q in model.named_parameters() if n in state}
    aliases = {n for n, q in model.named_parameters(remove_duplicate=False) if id(q) in loaded}
    buffers = {n for n, _ in model.named_buffers()}  # the full model's own, as built
    left = set(missing) - aliases - buffers
    if left or unexpected:
        raise RuntimeError(f"SDP: the assembled state does not fit the model (missing {sorted(left)}, "
                           f"unexpected {sorted(unexpected)})")


def _check_mask(expected: torch.Tensor):
    def hook(module, incompatible_keys):
        got = getattr(module, f"mask_worker{module.worker}")
        if got.shape != expected.shape or not torch.equal(got.cpu(), expected):
            raise ValueError(f"SDP checkpoint: worker {module.worker}'s mask in the checkpoint {got.tolist()} differs "
                             f"from this layout's {expected.tolist()} "
                             f"(parallel.sdp seed/coverage/mode or workers changed)")
    return hook


class SDPStrategy(LoopHooks):
    name = "sdp"

    @property
    def hooks(self) -> LoopHooks:
        return self  # validation and the export assemble the whole model; the final result reports the masks

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        spec = ctx.spec
        sdp, p = spec.parallel.sdp, spec.parallel
        assert sdp is not None  # selects(): only for a spec with parallel.sdp
        shards = p.dp_shard if p.zero == 3 else 1
        assert shards is not None, "the spec rules require parallel.dp_shard with parallel.sdp and zero 3"
        self.spec, self.comm, self.every_step = spec, ctx.comm, sdp.sync == "every_step"
        self.control = ctx.control
        self.period = sdp.sync.period if isinstance(sdp.sync, SDPPeriodSpec) else None  # None: every step
        self.backward_masking = sdp.masking == "backward"
        self.shards = shards
        self.worker, shard = divmod(ctx.rank, self.shards)
        self.blocks_path = blocks_of(model, spec)
        self.assignment = assignment_of(spec, len(blocks_at(model, self.blocks_path)))
        self.shapes = {n: t.shape for n, t in model.named_parameters()}
        subnet, pieces = build_subnetwork(model, self.assignment, self.worker, sdp.masking, self.blocks_path)
        subnet = subnet.to(ctx.device)
        apply_activation_checkpointing(subnet, ctx)
        sdp_model = SDPModel(subnet, self.worker, mask_tensor(self.assignment, self.worker)).to(ctx.device)
        if self.shards > 1:
            from torch.distributed.fsdp import fully_shard

            mesh = group_mesh(ctx.mesh, spec.dims, "dp_shard")  # a subnetwork's shards: dp_replicate = workers
            for block in blocks_at(subnet, self.blocks_path):
                fully_shard(block, mesh=mesh, reshard_after_forward=p.reshard_after_forward)
            # in place: fully_shard returns the module it was given, its class swapped for an FSDP subclass
            fully_shard(sdp_model, mesh=mesh, reshard_after_forward=root_reshard_after_forward(p.reshard_after_forward))
        params = dict(sdp_model.subnet.named_parameters())
        self.sync = HolderSync(self.assignment, self.worker, shard, self.shards, pieces, params, ctx.comm)
        self.in_sync = True  # whether each piece's holders hold it identically (always, with every_step)
        return sdp_model

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        optimizer = adamw([q for q in wrapped.parameters() if q.requires_grad], ctx.spec)
        optimizer.register_step_post_hook(lambda opt, args, kwargs: self._after_update(opt))
        return optimizer

    def _after_update(self, optimizer: torch.optim.Optimizer) -> None:
        if self.period is not None:  # not every_step
            # AdamW's own step count survives checkpoints, so the averaging schedule does too.
            first = next((q for g in optimizer.param_groups for q in g["params"] if q in optimizer.state), None)
            done = int(optimizer.state[first]["step"]) if first is not None else 0
            self.in_sync = not (done % self.period and done != self.spec.train.steps)
            if not self.in_sync:
                return
            self.sync.average(grad=False)
        if self.backward_masking:
            self.sync.refresh_unheld()

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        if self.shards > 1:
            fb = sharded_forward_backward(wrapped, micro, loss_fn, ctx)
        else:
            with precision(ctx):
                fb = accumulate(wrapped, micro, loss_fn, ctx, contextlib.nullcontext)
        if self.every_step:
            self.sync.average(grad=True)
        return fb

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        if self.every_step:
            return self.sync.grad_norm_clip(max_norm)
        norm = local_clip_grad_norm(wrapped, max_norm)
        # Workers step on their own gradients; all skip a non-finite update together, or one would
        # miss the parameter average its peers enter.
        bad = torch.tensor([0.0 if norm is None or math.isfinite(norm) else 1.0])  # a host flag: the CPU group
        return float("nan") if self.control.all_reduce(bad, op=dist.ReduceOp.MAX).item() else norm

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        # With sync {period: H}, holders drift between averages (a skipped step shifts the schedule):
        # the check waits for a step that averaged.
        return self.sync.replica_groups() if self.in_sync else []

    # --- its hooks (loop_hooks.py): the whole model, for evaluation and export; its report -------------

    def full_model_state(self, wrapped: nn.Module) -> dict[str, torch.Tensor]:
        assert isinstance(wrapped, SDPModel)  # what wrap() returned (FSDP's class is a subclass of it)
        gathered = {n: (q.full_tensor() if hasattr(q, "full_tensor") else q)
                    for n, q in wrapped.subnet.named_parameters()}
        return self.sync.full_state(self.shapes, gathered)

    def evaluation_model(self, wrapped: nn.Module) -> nn.Module:
        """The full model assembled from every worker's held pieces (collective)."""
        model = build_model(self.spec)
        load_full_state(model, self.full_model_state(wrapped))
        return model.to(next(wrapped.parameters()).device)

    def final_report(self) -> dict[str, object]:
        return {"sdp": self.report()}  # masks, spectral gap, held fractions

    def report(self) -> dict:
        sdp = self.spec.parallel.sdp
        assert sdp is not None  # selects(): only for a spec with parallel.sdp
        return {"mode": sdp.mode, "masking": sdp.masking, "coverage": sdp.coverage,
                "sync": sdp.sync if isinstance(sdp.sync, str) else sdp.sync.model_dump(),
                "seed": sdp.seed, **self.assignment.report()}

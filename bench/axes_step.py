"""One training step the way the job runs it, on a spawned gloo rank, for bench/long_context.py and
bench/moe.py: the spec through `parse_spec`, the model from `build_model`, the one mesh (`build_mesh`),
`ReplicateStep.wrap` (which applies `parallelize`: tp -> cp -> ep -> activation checkpointing),
`forward_backward` (sequence sharding under cp, the expert all-reduce under ep), `clip_grad_norm`, the AdamW
update, and the per-rank step peak measured by the product's own `StepMemory` (workers/step_memory.py,
the same StorageTracker the job's step records carry on CPU), with the update inside `updating()` as
workers/training/train_step.py does.

Batches are random token ids (the data pipeline is not what is measured): every rank draws the same global
batch from the same seed and takes its data-parallel slice, as the job's GlobalBatches does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

VOCAB = 256  # the byte-level vocabulary of the built-in GPT


def init_rank(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)  # the ranks share the host's cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def gpt_spec(seq_len: int, workers: int, parallel: dict, global_batch: int, micro_batch: int,
             d_model: int = 64, n_layers: int = 2, n_heads: int = 4, moe: dict | None = None) -> dict:
    model: dict[str, Any] = {"name": "gpt", "n_layers": n_layers, "d_model": d_model, "n_heads": n_heads,
                             "seq_len": seq_len, "dropout": 0.0}
    if moe is not None:
        model["moe"] = moe
    return {"name": "bench-axes", "model": model,
            "data": {"name": "text:pystdlib", "max_bytes": 200_000},  # parsed, never opened here
            "train": {"steps": 1000, "global_batch_size": global_batch, "micro_batch_size": micro_batch,
                      "lr": 1e-3, "warmup_steps": 0, "grad_clip": 1.0},
            "checkpoint": {"every_steps": 0},
            "parallel": parallel, "resources": {"workers": workers}}


@dataclass
class StepResult:
    wall_s: float
    peak_bytes: int | None  # None: a step StepMemory's schedule does not measure
    peak_activation_bytes: int | None
    model_state_bytes: int
    tokens: int  # this rank's tokens (its cp shard of its dp slice)


class RankJob:
    """What the trainer holds for one spec on this rank: wrapped model, optimiser, StepMemory."""

    def __init__(self, spec_data: dict, rank: int, world: int,
                 loss_hook: Callable[[torch.nn.Module], None] | None = None) -> None:
        from workers.models import build_model
        from workers.models.moe_loss import with_aux_loss
        from workers.parallel import StrategyContext
        from workers.parallel.control_group import ControlGroups
        from workers.parallel.data_parallel.replicate import ReplicateStep
        from workers.parallel.mesh import build_mesh
        from workers.spec_loading import parse_spec
        from workers.step_memory import StepMemory
        from workers.telemetry import CommMeter
        from workers.training.losses import cross_entropy

        self.spec = spec = parse_spec(spec_data)
        self.rank, self.world = rank, world
        self.device = torch.device("cpu")
        self.mesh = build_mesh(spec.dims, "cpu")
        self.strategy = ReplicateStep()
        self.ctx = StrategyContext(spec, rank, world, self.mesh, self.device, CommMeter(), ControlGroups())
        self.model = self.strategy.wrap(build_model(spec), self.ctx)
        base = with_aux_loss(cross_entropy, self.model)  # + the MoE load-balancing loss, as the trainer

        def loss_fn(outputs, targets):  # called right after each micro-batch's forward
            if loss_hook is not None:
                loss_hook(self.model)
            return base(outputs, targets)

        self.loss_fn = loss_fn
        self.optimizer = self.strategy.build_optimizer(self.model, self.ctx)
        self.memory = StepMemory(self.model, self.optimizer, self.device)
        self.dp_rank, self.dp = spec.dims.coordinates(rank)["dp"], spec.dims.dp
        self.steps = 0
        self.seq_len: int = spec_data["model"]["seq_len"]
        self.max_norm = math.inf if spec.train.grad_clip is None else spec.train.grad_clip

    def micro_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of step `self.steps`: its dp slice of one global batch, targets shifted
        before any cp sharding (as the data pipeline does)."""
        spec = self.spec
        g = torch.Generator().manual_seed(1_000 + self.steps)
        tokens = torch.randint(0, VOCAB, (spec.train.global_batch_size, self.seq_len + 1), generator=g)
        per_rank = spec.train.global_batch_size // self.dp
        mine = tokens[self.dp_rank * per_rank:(self.dp_rank + 1) * per_rank]
        mb = spec.train.micro_batch_size
        return [(mine[i:i + mb, :-1].clone(), mine[i:i + mb, 1:].clone()) for i in range(0, per_rank, mb)]

    def step(self) -> StepResult:
        """One optimiser step; measured by StepMemory on its schedule (the first 3 steps of the process)."""
        from workers.telemetry import model_state_bytes

        micro = self.micro_batches()
        self.model.train()
        dist.barrier()  # every rank starts the step together: the wall time is the step's
        t0 = time.perf_counter()
        with self.memory.measuring(self.steps + 1) as memory:
            fb = self.strategy.forward_backward(self.model, micro, self.loss_fn, self.ctx)
            self.strategy.clip_grad_norm(self.model, self.max_norm)  # as the trainer's _clip_gradients
            with memory.updating():
                self.optimizer.step()
        state = model_state_bytes(self.model, self.optimizer)["total"]  # grads and AdamW state held
        self.optimizer.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0
        self.steps += 1
        peak = memory.peak
        return StepResult(wall, peak.peak_bytes if peak else None,
                          peak.category_peaks["activations"] if peak else None, state, fb.tokens)


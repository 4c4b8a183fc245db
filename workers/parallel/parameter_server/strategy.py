"""Training model 'dlrm' with its embedding tables on parameter-server shards (`parallel.parameter_server`).

sync and bounded: each trainer rank keeps the dense part (bottom and top MLPs) under DDP, all-reduced as in
plain data parallelism, and pulls from the shards only the embedding rows its step's micro-batches touch;
the gradients the backward leaves on those rows are pushed back, and the shards update them. Why the dense
part stays all-reduced there: it is small and every sample touches all of it, so a server would receive
the whole of it from every trainer every step (the all-reduce moves about the same bytes without a hot
spot), while an embedding table is large and a batch touches few of its rows.

async: the trainers never meet after their set-up, so that a lost trainer cannot block the others: the
dense parameters live on the server too (each flattened into a one-row table, all on shard 0, updated by
the shards' optimiser), pulled whole and pushed every step like rows, and nothing is all-reduced. One live
trainer (the lowest the shards know: `lead`) writes what one writes for all: checkpoints (alone, no
collective), the final validation and the export, once every live trainer's last push is in
(`trains_alone`: the loop's collective-free path, workers/training/).

Rank 0 starts the shards, named after the job's placement group (the supervisor kills them by that name
and they end with the group), detached from rank 0 so they outlive it; the other ranks look them up by
name. A checkpoint holds the shards' state beside the model's, and a restart restores it."""

from __future__ import annotations

import contextlib
import math
import uuid
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers.model_io import samples_in, to_device
from workers.models.dlrm import DLRM
from workers.parallel.base import ForwardBackward, LossFn, StrategyContext, adamw, local_clip_grad_norm
from workers.parallel.compression import register_comm_hook
from workers.parallel.control_group import ControlGroups
from workers.parallel.loop_hooks import LoopHooks
from workers.parallel.parallelize import data_parallel_mesh
from workers.parallel.parameter_server.names import shard_prefix
from workers.parallel.parameter_server.server import ParameterServer
from workers.parallel.parameter_server.sharding import RowSharding
from workers.parallel.replicas import ReplicaGroup, replicated_over
from workers.storage import Storage
from workers.training.lr_schedule import lr_at

SAVED = "parameter_server/step-{step:08d}.pt"  # in the job's storage, beside checkpoints/


class ParameterServerStrategy(LoopHooks):
    name = "parameter_server"

    def __init__(self) -> None:
        self.server: ParameterServer | None = None
        self.step = 0  # the next step this trainer pulls for
        self.staleness: int | None = None
        self.rows_moved = 0
        self.alone = False  # async: the trainers never meet after the set-up (the module's docstring)
        self.dense: list[tuple[str, torch.Size]] = []  # async: the dense parameters the shards hold, in order
        self.tables = 0  # embedding tables (the dense parameters' tables come after them)
        self.pushed_norm: float | None = None  # async: the norm of the gradients the last step pushed (unclipped)

    @property
    def trains_alone(self) -> bool:
        return self.alone

    @property
    def hooks(self) -> LoopHooks:
        return self  # the shards' state with checkpoints, validation and export; staleness in step records

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        if not isinstance(model, DLRM):
            raise TypeError("parallel.parameter_server trains model 'dlrm' (the spec rules allow no other)")
        ps = ctx.spec.parallel.parameter_server
        assert ps is not None
        import ray

        self.alone = ps.mode == "async"
        for table in model.embedding_tables():  # the shards train the rows; this copy is the checkpoint's view
            table.weight.requires_grad_(False)
        tables = [t.weight.detach() for t in model.embedding_tables()]
        self.tables = len(tables)
        if self.alone:  # the dense parameters too, one single-row table each (all on shard 0)
            dense = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            self.dense = [(n, p.shape) for n, p in dense]
            tables += [p.detach().reshape(1, -1) for _, p in dense]
        # In the job's placement group (the rank actors' own), dealt over its bundles: on the job's nodes,
        # named after it (the supervisor's group kills them by that name). Without one: a token agreed on.
        group = ray.util.get_current_placement_group()
        if group is not None:
            name = shard_prefix(group.id.hex())
        else:
            tokens: list = [None] * ctx.world_size
            ctx.control.all_gather_object(tokens, uuid.uuid4().hex)
            name = shard_prefix(tokens[0])
        if ctx.rank == 0 and not ctx.joining:
            self.server = ParameterServer.start(tables, ps, ctx.spec.dp, name=name,
                                                weight_decay=ctx.spec.train.weight_decay, placement_group=group)
        if not ctx.joining:
            ctx.control.barrier()
        if ctx.rank != 0 or ctx.joining:
            handles = [ray.get_actor(f"{name}-shard-{i}") for i in range(ps.shards)]
            self.server = ParameterServer(handles, RowSharding(ps.shards))
        # The trainer index is the rank's dp coordinate (dp is the only degree beside it), its rank when joining.
        trainer = ctx.rank if ctx.joining else ctx.spec.dims.coordinates(ctx.rank)["dp"]
        self.client = self.server.client(trainer)  # type: ignore[union-attr]
        if ctx.joining:  # an elastic join (async): from the slowest live trainer's step, the shards' state as is
            self.step = self.server.rejoin(trainer)  # type: ignore[union-attr]
        if self.alone:  # no DDP: nothing is all-reduced, the shards hold the dense part
            return model
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, broadcast_buffers=False)
        register_comm_hook(ddp, ctx)  # the dense all-reduce metered as DDP's (comm_bytes_per_step counts it)
        return ddp

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw([p for p in wrapped.parameters() if p.requires_grad], ctx.spec)

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        rows = self.client.pull(self.step, [inputs["sparse"] for inputs, _ in micro], whole=len(self.dense))
        self.staleness = rows.staleness
        # async: the model runs with the dense parameters just pulled (leaves whose gradients are pushed)
        pulled = {name: t.to(ctx.device).view(shape)
                  for (name, shape), t in zip(self.dense, rows.whole(self.tables))}
        loss_sum, samples = 0.0, 0
        for i, batch in enumerate(micro):
            inputs, targets = to_device(batch, ctx.device)
            assert isinstance(inputs, dict)
            looked_up = [r.to(ctx.device) for r in rows.lookup(inputs["sparse"].cpu())]
            last = i == len(micro) - 1
            with contextlib.nullcontext() if last or self.alone else wrapped.no_sync():  # type: ignore[operator]
                args: dict[str, Any] = {"dense": inputs["dense"], "sparse": inputs["sparse"], "rows": looked_up}
                outputs = (torch.func.functional_call(wrapped, pulled, kwargs=args) if self.alone
                           else wrapped(**args))
                loss = loss_fn(outputs, targets) / len(micro)
                loss.backward()
            loss_sum += loss.item()
            samples += samples_in(inputs)
        if self.alone:  # async: the gradients leave with this push, so train.grad_clip applies here, per trainer
            clip = ctx.spec.train.grad_clip
            self.pushed_norm = rows.clip_gradients(clip if clip is not None else math.inf)
        pushed = self.client.push(self.step, rows, lr_at(ctx.spec.train, self.step))
        self.rows_moved = 2 * pushed  # each row pulled once and its gradient pushed once
        # fp32 both ways, each row its own width (async's dense rows are whole parameters)
        ctx.comm.logical_bytes += 2 * 4 * sum(int(r.shape[0]) * int(r.shape[1]) for r in rows.rows)
        self.step += 1
        return ForwardBackward(loss_sum, samples, 0)

    def step_report(self) -> dict[str, object]:
        """What a step record adds: the staleness its rows had when pulled, and the rows that travelled."""
        return {"ps_staleness": self.staleness, "ps_rows": self.rows_moved}

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        if self.alone:  # async: clipped as they were pushed (forward_backward); their norm, for the step record
            return self.pushed_norm  # and the non-finite skip (a non-finite push was zeroed)
        return local_clip_grad_norm(wrapped, max_norm)  # the dense part's: the shards clip nothing

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        if self.alone:  # async: no replicas, every trainer reads the shards' current values
            return []
        dense = [p for p in wrapped.parameters() if p.requires_grad]
        return replicated_over(data_parallel_mesh(ctx), dense)

    # --- its hooks (loop_hooks.py): the shards' state with the job's checkpoints, validation and export ---

    def _copy_tables_into(self, wrapped: nn.Module) -> None:
        assert self.server is not None
        model = wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped
        assert isinstance(model, DLRM)
        tables = self.server.tables()
        params = dict(model.named_parameters())
        with torch.no_grad():
            for table, rows in zip(model.embedding_tables(), tables):
                table.weight.copy_(rows)
            for (name, shape), flat in zip(self.dense, tables[self.tables:]):  # async: the dense part too
                params[name].copy_(flat.view(shape))

    def before_save(self, wrapped: nn.Module, storage: Storage, step: int, rank: int,
                    control: ControlGroups) -> None:
        """Every trainer's push of `step` is in (a barrier); rank 0 writes the shards' state; every rank's
        model gets the current tables, so the checkpoint's model is whole too. async: no barrier, the lead
        trainer alone (the loop saves only there), with whatever the shards hold as it gets there."""
        if self.alone:
            self._copy_tables_into(wrapped)
            assert self.server is not None
            storage.write_bytes(SAVED.format(step=step), self.server.save())
            return
        control.barrier()
        self._copy_tables_into(wrapped)
        if rank == 0:
            assert self.server is not None
            storage.write_bytes(SAVED.format(step=step), self.server.save())
        control.barrier()

    def after_load(self, storage: Storage, step: int, rank: int, control: ControlGroups) -> None:
        """Resumed from the checkpoint of `step`: the shards get the state saved with it."""
        if rank == 0:
            assert self.server is not None
            self.server.restore(storage.read_bytes(SAVED.format(step=step)))
        self.step = step
        control.barrier()

    def join_step(self) -> int:
        return self.step

    def writes_for_all(self, rank: int) -> bool:
        """Whether this rank writes what one rank writes for the job (checkpoints, validation, export):
        rank 0, or under async the lead trainer the shards know (a lost rank 0 is replaced)."""
        if not self.alone:
            return rank == 0
        assert self.server is not None
        return self.server.lead() == self.client.trainer

    def wait_for_peers(self, steps: int) -> bool:
        """async: wait until every live trainer's last push is in; whether this rank is the lead then."""
        assert self.server is not None
        return self.server.finished(steps) == self.client.trainer

    def evaluation_model(self, wrapped: nn.Module) -> nn.Module:
        """Validation looks rows up in the model's own tables: they get the shards' rows first."""
        self._copy_tables_into(wrapped)
        return wrapped

    def full_model_state(self, wrapped: nn.Module) -> dict[str, torch.Tensor]:
        from workers.checkpointing import full_model_state

        self._copy_tables_into(wrapped)
        return full_model_state(wrapped)

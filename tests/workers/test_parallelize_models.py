"""The parallelisms applied to models Trainyard has never seen, on two real gloo processes
(no Ray): the tensor-parallel plan of HF Llama (GQA), of the built-in GPT and of a user's plan,
with and without sequence parallelism, gives the single-process loss and gradients; each rank
holds 1/tp of q_proj's rows; FSDP makes every repeated block its own unit; DDP broadcasts trained
buffers, not those each rank derives from the config."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.user_models import GPT_SPEC, LLAMA_SPEC, TOKEN_MLP_SPEC
from tests.workers.gloo_ranks import spawn_ranks

CASES = {
    "llama": (LLAMA_SPEC, False), "llama_sp": (LLAMA_SPEC, True),
    "gpt_sp": (GPT_SPEC, True), "token_mlp_plan": (TOKEN_MLP_SPEC, False),
}


def _spawn(fn, *args):
    """Rank 0's result of `fn` on two ranks."""
    return spawn_ranks(fn, 2, *args, results=1)[0]


def _init(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _tensor_parallel_case(rank, world, port, queue, spec_data, sequence_parallel):
    from workers.model_io import call_model
    from workers.models import build_model
    from workers.models.description import describe_spec_model
    from workers.parallel.common import reduce_partial_grads
    from workers.parallel.mesh import build_mesh
    from workers.parallel.tensor_parallel import apply_tensor_parallel
    from workers.spec.dims import ParallelDims
    from workers.spec_loading import parse_spec
    from workers.training.losses import cross_entropy

    _init(rank, world, port)
    spec = parse_spec(spec_data)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 256, (2, 16), generator=g), torch.randint(0, 256, (2, 16), generator=g)
    ref = build_model(spec)
    ref_loss = cross_entropy(call_model(ref, x), y)
    ref_loss.backward()
    model = build_model(spec)
    mesh = build_mesh(ParallelDims(tp=world), "cpu")
    apply_tensor_parallel(model, mesh["tp"], sequence_parallel, describe_spec_model(model, spec.model))
    loss = cross_entropy(call_model(model, x), y)
    loss.backward()
    reduce_partial_grads(model)
    worst, local_rows = 0.0, {}
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        worst = max(worst, float((grad - r.grad).abs().max()))
        local_rows[name] = (p.to_local().shape[0] if hasattr(p, "to_local") else p.shape[0], r.shape[0])
    if rank == 0:
        queue.put({"loss": float(loss), "ref_loss": float(ref_loss), "worst_grad_diff": worst, "rows": local_rows})
    dist.destroy_process_group()


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_parallel_plan_matches_single_process(case):
    spec_data, sp = CASES[case]
    out = _spawn(_tensor_parallel_case, spec_data, sp)
    assert out["loss"] == pytest.approx(out["ref_loss"], rel=1e-5)
    assert out["worst_grad_diff"] < 1e-5, out["worst_grad_diff"]
    if case.startswith("llama"):  # GQA: q has 4 heads, k/v 2; each rank holds half of each
        for proj in ("q_proj", "k_proj", "v_proj"):
            local, full = out["rows"][f"model.layers.0.self_attn.{proj}.weight"]
            assert local * 2 == full, (proj, local, full)
        assert out["rows"]["model.layers.0.self_attn.o_proj.weight"] == (64, 64)  # rowwise: columns split


def _fsdp_case(rank, world, port, queue, spec_data):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard

    from workers.models import build_model
    from workers.models.description import describe_spec_model
    from workers.parallel import StrategyContext
    from workers.parallel.control_group import ControlGroups
    from workers.parallel.data_parallel.shard import ShardStep
    from workers.parallel.mesh import build_mesh
    from workers.spec_loading import parse_spec
    from workers.telemetry import CommMeter

    _init(rank, world, port)
    spec = parse_spec({**spec_data, "parallel": {"zero": 3}, "resources": {"workers": 2}})
    mesh = build_mesh(spec.dims, "cpu")
    model = build_model(spec)
    desc = describe_spec_model(model, spec.model)
    ctx = StrategyContext(spec, rank, world, mesh, torch.device("cpu"), CommMeter(), ControlGroups())
    wrapped = ShardStep().wrap(model, ctx)
    blocks = desc.blocks(wrapped)
    units = [m for m in wrapped.modules() if isinstance(m, FSDPModule)]
    sharded = all(isinstance(p, DTensor) and p.placements == (Shard(0),) and p.device_mesh.size() == 2
                  for b in blocks for p in b.parameters())
    if rank == 0:
        queue.put({"units": len(units), "blocks": len(blocks),
                   "all_blocks_units": all(isinstance(b, FSDPModule) for b in blocks),
                   "block_params_sharded_on_dp": sharded})
    dist.destroy_process_group()


@pytest.mark.parametrize("spec_data", [LLAMA_SPEC, TOKEN_MLP_SPEC], ids=["llama", "token_mlp"])
def test_fsdp_shards_each_block_as_its_own_unit(spec_data):
    out = _spawn(_fsdp_case, spec_data)
    assert out["all_blocks_units"] and out["block_params_sharded_on_dp"], out
    assert out["units"] == out["blocks"] + 1  # every block, plus the root (embeddings, norm, head)


def _ddp_buffers_case(rank, world, port, queue, spec_data):
    from torch import nn

    from workers.models import build_model
    from workers.parallel import StrategyContext
    from workers.parallel.control_group import ControlGroups
    from workers.parallel.data_parallel.replicate import ReplicateStep
    from workers.parallel.mesh import build_mesh
    from workers.spec_loading import parse_spec
    from workers.telemetry import CommMeter

    _init(rank, world, port)
    spec = parse_spec({**spec_data, "resources": {"workers": 2}})
    mesh = build_mesh(spec.dims, "cpu")
    ctx = StrategyContext(spec, rank, world, mesh, torch.device("cpu"), CommMeter(), ControlGroups())
    llama = ReplicateStep().wrap(build_model(spec), ctx)
    normed = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    # A model whose state-dict hook renames its keys: its running statistics are still trained buffers.
    normed._register_state_dict_hook(lambda module, state, prefix, local: {f"renamed.{k}": v for k, v in state.items()})
    normed = ReplicateStep().wrap(normed, ctx)
    if rank == 0:
        queue.put({"llama_buffers": sorted(n for n, _ in llama.module.named_buffers()),
                   "llama_syncs": llama.will_sync_module_buffers(),
                   "normed_syncs": normed.will_sync_module_buffers(), "normed_synced": len(normed.modules_buffers)})
    dist.destroy_process_group()


def test_ddp_broadcasts_trained_buffers_but_not_those_each_rank_derives():
    out = _spawn(_ddp_buffers_case, LLAMA_SPEC)
    assert out["llama_buffers"] == ["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"], out
    assert out["llama_syncs"] is False, out  # rotary frequencies: no broadcast before every forward
    assert out["normed_syncs"] is True and out["normed_synced"] == 3, out  # BatchNorm's running stats still are


def _replicate_reducer_case(rank, world, port, queue, spec_data):
    from workers.models import build_model
    from workers.parallel import StrategyContext
    from workers.parallel.control_group import ControlGroups
    from workers.parallel.data_parallel.replicate import ReplicateStep
    from workers.parallel.mesh import build_mesh
    from workers.spec_loading import parse_spec
    from workers.telemetry import CommMeter

    _init(rank, world, port)
    out = {}
    for name, parallel in (("dp2", {}), ("tp2", {"tp": 2}), ("zero2", {"zero": 2}),
                           ("local_sgd", {"local_sgd": {"period": 2}})):
        spec = parse_spec({**spec_data, "resources": {"workers": 2}, "parallel": parallel})
        ctx = StrategyContext(spec, rank, world, build_mesh(spec.dims, "cpu"), torch.device("cpu"), CommMeter(),
                              ControlGroups())
        step = ReplicateStep()
        wrapped = step.wrap(build_model(spec), ctx)
        out[name] = (type(step.reducer).__name__, type(wrapped).__name__)
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def test_the_replicate_step_picks_its_reducer_by_the_parameters_type():
    out = _spawn(_replicate_reducer_case, GPT_SPEC)
    assert out["dp2"] == ("DDPReducer", "DistributedDataParallel"), out  # plain tensors: DDP with its hook
    assert out["tp2"][0] == "LocalGradientAllReduce" and out["tp2"][1] != "DistributedDataParallel", out  # DTensors
    assert out["zero2"][0] == "ShardedOptimizerReduce" and out["local_sgd"][0] == "PeriodicAverage", out  # by kind

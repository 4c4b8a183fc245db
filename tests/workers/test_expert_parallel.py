"""Expert parallelism on real gloo ranks against one process that runs every micro-batch with all experts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn import functional as F

from tests.workers.expert_ranks import one_thread, train_shared_averaged  # noqa: F401 - autouse fixture
from tests.workers.gloo_ranks import spawn_ranks
from workers.models.gpt import GPT
from workers.models.moe import MoEConfig
from workers.models.moe_loss import moe_layers, with_aux_loss
from workers.parallel.expert_parallel import all_to_all_bytes, apply_expert_parallel

VOCAB, SEQ = 64, 8


EXPERT = (".w1", ".b1", ".w2", ".b2")


def build(d_model, experts, top_k, capacity_factor=None, dtype=torch.float64) -> GPT:
    torch.manual_seed(0)
    moe = MoEConfig(experts, top_k, capacity_factor, aux_loss_weight=0.1)
    return GPT(VOCAB, SEQ, 2, d_model, 2, moe=moe).to(dtype)


def micro_batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(100 * step + rank))


def ce(out, batch):
    return F.cross_entropy(out.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def forward_backward(model: GPT, batch: torch.Tensor, scale: float = 1.0):
    out = model(batch[:, :-1])
    loss = with_aux_loss(ce, model)(out, batch)
    (loss * scale).backward()
    return out.detach(), loss.detach()


def hand_over(queue, rank, out_dir, results) -> None:
    """Results through a file: spawn_ranks joins the ranks before it reads the queue, so a payload larger than
    the pipe's buffer would block the rank forever; a queued tensor would be shared by a file descriptor of a
    rank that has exited by the time the test reads it."""
    path = f"{out_dir}/rank{rank}.pt"
    torch.save(results, path)
    queue.put((rank, path))


def taken(ranks) -> list:
    return [torch.load(path) for _, path in ranks]


def init(rank, world, port):
    # one intra-op thread: ranks sharing 2 cores otherwise spin against each other inside every
    # collective (12 training steps took 5.6 s instead of 0.17 s)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def ep_mesh(world: int):
    """The ep dimension of the job mesh of `world` data-parallel ranks, all in one expert group."""
    from workers.parallel.mesh import build_mesh
    from workers.spec.dims import ParallelDims

    return build_mesh(ParallelDims(dp_replicate=world, ep=world), "cpu")["ep"]


def local_grads(model) -> dict:
    """Each parameter's gradient as this rank holds it (an expert shard's DTensor gradient: its slice)."""
    from torch.distributed.tensor import DTensor

    return {n: p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for n, p in model.named_parameters()}


def parity_rank(rank, world, port, queue, out_dir, configs):
    init(rank, world, port)
    results = []
    for config in configs:
        model = apply_expert_parallel(build(*config), ep_mesh(world))
        out, loss = forward_backward(model, micro_batch(0, rank))
        grads = local_grads(model)
        offsets = [m.expert_offset for m in moe_layers(model)]
        routed = [m.tokens_per_expert for m in moe_layers(model)]
        results.append((out, loss, grads, offsets, routed, all_to_all_bytes(model)))
    try:
        apply_expert_parallel(build(8, 3, 1), ep_mesh(world))
        refused = None
    except ValueError as e:
        refused = str(e)
    hand_over(queue, rank, out_dir, (results, refused))


def full_reference(config, ranks: int):
    """One process, all experts: each rank's micro-batch through its own forward, the gradients summed."""
    model = build(*config)
    runs = [forward_backward(model, micro_batch(0, r)) for r in range(ranks)]
    return runs, {n: p.grad for n, p in model.named_parameters()}


def check_parity(config, per_rank, world):
    runs, grads = full_reference(config, world)
    for r in range(world):
        out, loss = per_rank[r][:2]
        torch.testing.assert_close(out, runs[r][0], rtol=0, atol=1e-10)
        torch.testing.assert_close(loss, runs[r][1], rtol=0, atol=1e-10)
    local = config[1] // world
    for name, want in grads.items():
        if name.endswith(EXPERT):  # each owner holds its slice, gathered in rank order
            layer = int(name.split(".")[1])
            assert [per_rank[r][3][layer] for r in range(world)] == [r * local for r in range(world)]
            got = torch.cat([per_rank[r][2][name] for r in range(world)])
        else:  # replicated: the caller sums (or averages) them over the group
            got = sum(per_rank[r][2][name] for r in range(world))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10, msg=name)


EP2_CONFIGS = [(16, 4, 2, None), (16, 4, 2, 1.0)]


def test_ep2_matches_one_process_with_all_experts(tmp_path):
    ranks = taken(spawn_ranks(parity_rank, 2, str(tmp_path), EP2_CONFIGS))
    for i, config in enumerate(EP2_CONFIGS):
        per_rank = [ranks[r][0][i] for r in range(2)]
        check_parity(config, per_rank, 2)
        assert per_rank[0][2]["blocks.0.mlp.w1"].shape == (2, 16, 64)  # each rank keeps half the experts
    for r in range(2):
        refused = ranks[r][1]
        assert "model.moe.experts" in refused and "parallel.ep" in refused and "experts=3" in refused \
            and "ep=2" in refused
    # bytes: per layer, the 2 remote experts' counts (int64) and the float64 rows of width 16 sent across and
    # returned; without capacity a rank sends what it routed to the other rank's experts
    routed = [ranks[r][0][0][4] for r in range(2)]
    for r, other in ((0, 1), (1, 0)):
        mine, theirs = slice(2 * r, 2 * r + 2), slice(2 * other, 2 * other + 2)
        rows = sum(int(routed[r][layer][theirs].sum() + routed[other][layer][mine].sum()) for layer in range(2))
        assert ranks[r][0][0][5] == 2 * 2 * 8 + rows * 16 * 8


def ep4_rank(rank, world, port, queue, out_dir, config):
    init(rank, world, port)
    model = apply_expert_parallel(build(*config), ep_mesh(world))
    out, loss = forward_backward(model, micro_batch(0, rank))
    grads = local_grads(model)
    hand_over(queue, rank, out_dir, (out, loss, grads, [m.expert_offset for m in moe_layers(model)]))


def test_ep4_matches_one_process(tmp_path):
    config = (8, 8, 2, None)
    check_parity(config, taken(spawn_ranks(ep4_rank, 4, str(tmp_path), config)), 4)


def train_rank(rank, world, port, queue, config, steps):
    init(rank, world, port)
    model = apply_expert_parallel(build(*config, dtype=torch.float32), ep_mesh(world))
    queue.put((rank, train_shared_averaged(model, steps, rank, world, forward_backward, micro_batch)))


def test_ep2_training_follows_one_process():
    config, steps = (32, 4, 2, None), 12
    ranks = spawn_ranks(train_rank, 2, config, steps)
    model = build(*config, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps):
        opt.zero_grad()
        want = sum(forward_backward(model, micro_batch(step, r), scale=0.5)[1].item() for r in range(2)) / 2
        got = (ranks[0][1][step] + ranks[1][1][step]) / 2
        assert got == pytest.approx(want, abs=1e-4), f"step {step}"
        opt.step()
    assert ranks[0][1][-1] < ranks[0][1][0]  # it learns

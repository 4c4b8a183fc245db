"""What the expert-parallel tests share: one intra-op thread in the test process (its references run beside
spawned gloo ranks, which use one too: ranks sharing 2 cores otherwise spin against each other in every
collective), and the data-parallel sum of the replicated parameters' gradients."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sum_shared_grads(model, experts: set[int]) -> None:
    """All-reduce the gradients of the parameters not in `experts` (ids), in one flat buffer: gloo calls
    are slow on this host (the losses were scaled by 1/world, so the sum is the mean)."""
    shared = [p.grad for p in model.parameters() if id(p) not in experts]
    flat = torch.cat([g.reshape(-1) for g in shared])
    dist.all_reduce(flat)
    for g, part in zip(shared, flat.split([g.numel() for g in shared])):
        g.copy_(part.view_as(g))


def train_shared_averaged(model, steps: int, rank: int, world: int, forward_backward, micro_batch) -> list[float]:
    """AdamW steps of an expert-parallel rank: its loss scaled by 1/world, the replicated parameters' gradients
    summed over the ranks (their mean), each expert's kept by its owner; this rank's losses."""
    from workers.parallel.expert_parallel import expert_parameters

    experts = {id(p) for p in expert_parameters(model)}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        losses.append(forward_backward(model, micro_batch(step, rank), scale=1 / world)[1].item())
        sum_shared_grads(model, experts)
        opt.step()
    return losses

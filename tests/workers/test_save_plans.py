"""Save plans cached while the layout is unchanged (workers/checkpointing/save_plans.py): the second save
of a Checkpointer sends no local plan and builds no global plan, yet writes the new values; a new
Checkpointer (a restart or a reshard) plans afresh. One gloo rank in this process, a local directory."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.planner import SavePlanner

from tests.live import free_port
from workers.checkpointing import Checkpointer, load_checkpoint


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def trained(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_the_second_save_reuses_the_plan_and_a_new_checkpointer_plans_again(one_rank, tmp_path):
    checkpointer = Checkpointer(tmp_path, keep=5, rank=0)
    model, optimizer = trained(0)
    checkpointer.save(model, optimizer, step=1)
    checkpointer.wait()
    with torch.no_grad():
        model.weight.add_(1.0)  # new values, same layout
    checkpointer.save(model, optimizer, step=2)
    checkpointer.wait()
    assert (checkpointer.plans.counts.local_plans_sent, checkpointer.plans.counts.global_plans) == (1, 1)

    other, other_opt = trained(1)
    assert load_checkpoint(tmp_path / "checkpoints" / "step-00000002", other, other_opt) == 2
    assert torch.equal(other.weight, model.weight)  # the cached plan wrote the second save's values

    assert checkpointer.plans.key in SavePlanner._cached_global_plan
    resharded = Checkpointer(tmp_path, keep=5, rank=0)  # a new layout gets a new cache
    assert checkpointer.plans.key not in SavePlanner._cached_global_plan
    resharded.save(model, optimizer, step=3)
    resharded.wait()
    assert (resharded.plans.counts.local_plans_sent, resharded.plans.counts.global_plans) == (1, 1)

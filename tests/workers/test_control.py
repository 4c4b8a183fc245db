"""Agreement on supervisor requests between two real gloo ranks: act only when every rank can."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers import spec_of
from workers.parallel.control_group import ControlGroups
from workers.training.control import RankControl, UnevenShares, agreement_due


def _rank(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    groups, control, seen = ControlGroups(), RankControl(), []
    # 1. Only rank 0 holds the request: nobody switches (a lone switch would break the global batch).
    if rank == 0:
        control.request_shares(1, [24, 8])
    seen.append(control.agree(groups, may_stop=True))
    # 2. Both hold it: both switch, once.
    control.request_shares(1, [24, 8])
    seen.append(control.agree(groups, may_stop=True))
    seen.append(control.agree(groups, may_stop=True))
    # 3. Different versions in flight (rank 1 has the newer one): wait until both hold the newer.
    control.request_shares(2 + rank, [20 + rank, 12 - rank])
    seen.append(control.agree(groups, may_stop=True))
    control.request_shares(3, [21, 11])
    seen.append(control.agree(groups, may_stop=True))
    # 4. A stop asked of rank 1 alone stops both, but only at a step where stopping is allowed.
    if rank == 1:
        control.request_stop()
    seen.append(control.agree(groups, may_stop=False))
    seen.append(control.agree(groups, may_stop=True))
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


def test_ranks_act_on_a_request_together_or_not_at_all(tmp_path):
    out = str(tmp_path / "seen")
    mp.spawn(_rank, args=(f"file://{tmp_path}/rendezvous", out), nprocs=2, join=True)
    seen = [json.loads((tmp_path / f"seen.{r}").read_text()) for r in (0, 1)]
    assert seen[0] == seen[1] == [
        [False, None],
        [False, [24, 8]], [False, None],
        [False, None], [False, [21, 11]],
        [False, None], [True, None],
    ]


@pytest.mark.parametrize("uneven,every,step,checkpointed,due", [
    (UnevenShares(8), 0, 8, False, True),  # the supervisor may re-split the data: every 8 steps
    (UnevenShares(8), 0, 9, False, False),
    (None, 0, 8, False, False),  # nothing to agree on but stops, at checkpoints
    (None, 5, 10, True, True),
    (UnevenShares(8), 5, 40, True, False),  # the last step: the loop ends anyway
])
def test_agreement_steps_are_known_alike_to_every_rank(uneven, every, step, checkpointed, due):
    spec = spec_of(**{"train.steps": 40, "checkpoint.every_steps": every})
    assert agreement_due(spec, step, checkpointed, uneven) is due

"""parallel.collectives 'hierarchical' (workers/parallel/hierarchical.py) on real gloo groups: four processes
playing 2 nodes x 2 ranks (and the other shapes a placement can give: uneven nodes, one node, one rank per
node, nodes interleaved in rank order). DDP with the hierarchical hook reduces to the flat hook's gradients
within 1e-6; fp16 on the cross-node stage within fp16's rounding, with half the cross-node bytes; the meter
counts the bytes crossing nodes, less than flat's."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.workers.gloo_ranks import spawn_ranks
from workers.parallel.hierarchical import NodeMap

SHAPES = {
    "2x2": ("a", "a", "b", "b"),
    "uneven 3+1": ("a", "a", "a", "b"),
    "one node": ("a", "a", "a", "a"),
    "one rank per node": ("a", "b", "c", "d"),
    "interleaved": ("a", "b", "a", "b"),
}


def _model() -> nn.Module:
    torch.manual_seed(0)  # odd sizes: chunks need padding; small buckets: several per backward
    return nn.Sequential(nn.Linear(37, 29), nn.Tanh(), nn.Linear(29, 13), nn.Tanh(), nn.Linear(13, 3))


def _grads(rank: int, world: int, nodes: tuple[str, ...], collectives: str, kind: str | None) -> tuple[list, int, int]:
    from workers.parallel.compression import register_comm_hook
    from workers.telemetry import CommMeter

    compression = SimpleNamespace(kind=kind) if kind else None
    spec = SimpleNamespace(parallel=SimpleNamespace(compression=compression, collectives=collectives))
    meter = CommMeter()
    ctx = SimpleNamespace(spec=spec, rank=rank, world_size=world, nodes=nodes, comm=meter)
    ddp = DistributedDataParallel(copy.deepcopy(_model()), bucket_cap_mb=0.001)
    register_comm_hook(ddp, ctx)
    torch.manual_seed(100 + rank)  # every rank its own samples
    for _ in range(2):  # two steps: the buckets DDP rebuilds after the first see the hook too
        ddp.zero_grad(set_to_none=True)
        meter.reset()
        ddp(torch.randn(8, 37)).square().mean().backward()
    return [p.grad.clone() for p in ddp.parameters()], meter.logical_bytes, meter.cross_node_bytes


def _compare(rank, world, port, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = {}
    for name, nodes in SHAPES.items():
        flat, _, flat_cross = _grads(rank, world, nodes, "flat", None)
        for kind in (None, "fp16"):
            hier, sent, cross = _grads(rank, world, nodes, "hierarchical", kind)
            diff = max(float((a - b).abs().max()) for a, b in zip(flat, hier))
            rows[(name, kind)] = (diff, sent, cross, flat_cross)
    queue.put((rank, rows))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def compared():
    return dict(spawn_ranks(_compare, 4))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_hierarchical_reduces_to_the_flat_gradients(compared, shape):
    for rank, rows in compared.items():
        diff, _, _, _ = rows[(shape, None)]
        assert diff <= 1e-6, (shape, rank, diff)


@pytest.mark.parametrize("shape", ["2x2", "uneven 3+1", "one rank per node"])
def test_fp16_on_the_cross_node_stage_is_within_fp16_rounding_and_halves_what_crosses(compared, shape):
    for rank, rows in compared.items():
        diff, _, cross16, _ = rows[(shape, "fp16")]
        _, _, cross32, _ = rows[(shape, None)]
        assert diff <= 1e-3, (shape, rank, diff)
        assert cross16 * 2 == pytest.approx(cross32, rel=0.01), (shape, rank)


def test_less_crosses_nodes_than_flat_and_nothing_on_one_node(compared):
    def job(shape, kind, column):
        return sum(rows[(shape, kind)][column] for rows in compared.values())

    # 2 x 2: flat's ring crosses twice (ranks 1 and 3 send to the other node): 2 x 1.5 B; hierarchical:
    # each node's half of the bucket over 2 nodes, from 2 ranks: 4 x 0.5 x 1.0 x B / 2 = B.
    assert job("2x2", None, 2) == pytest.approx(job("2x2", None, 3) * 2 / 3, rel=0.02)
    assert job("interleaved", None, 2) < job("interleaved", None, 3) / 2  # every flat hop crosses there
    assert job("one node", None, 2) == job("one node", None, 3) == 0
    assert job("uneven 3+1", None, 2) < job("uneven 3+1", None, 3)


def test_the_node_map_of_a_placement():
    m = NodeMap.of(["n2", "n2", "n1", "n1", "n1", "n3"])
    assert m.node_of == (0, 0, 1, 1, 1, 2) and m.nodes == 3 and not m.even
    assert m.members(1) == [2, 3, 4] and m.local_index(4) == 2
    assert NodeMap.of(["x", "y", "x", "y"]).even


# --- a job's ranks: the Trainer as the Ray actor runs it, given the placement's node map ---------------

NODES = ("a", "a", "b", "b")
JOBS = {"flat": {}, "hierarchical": {"parallel.collectives": "hierarchical"},
        "hierarchical_fp16": {"parallel.collectives": "hierarchical", "parallel.compression": {"kind": "fp16"}}}


def _train(rank, world, port, queue, tmp):
    from pathlib import Path

    from tests.helpers import spec_of
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = {}
    for name, keys in JOBS.items():
        spec = spec_of(**{"resources.workers": world, "train.steps": 4, "data.max_bytes": 20_000}, **keys)
        trainer = Trainer(spec, rank, world, torch.device("cpu"), Path(tmp) / name, nodes=NODES)
        records = [trainer.train_step() for _ in range(4)]
        params = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
        out[name] = ([r.loss for r in records], [r.cross_node_bytes for r in records], params)
    flat_params = out["flat"][2]  # compared here: tensors on the queue would outlive their process
    out = {name: (losses, crossed, float((params - flat_params).abs().max()))
           for name, (losses, crossed, params) in out.items()}
    queue.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.exhaustive  # three jobs on four ranks: ~80 s on the shared host (make test-all)
def test_a_job_on_two_nodes_trains_as_flat_and_sends_less_across(tmp_path):
    ranks = dict(spawn_ranks(_train, 4, str(tmp_path)))
    for rank, out in ranks.items():
        flat_losses, _, _ = out["flat"]
        losses, _, params_diff = out["hierarchical"]
        assert max(abs(a - b) for a, b in zip(flat_losses, losses)) <= 1e-6, (rank, flat_losses, losses)
        assert params_diff <= 1e-5, (rank, params_diff)
        fp16_losses, _, _ = out["hierarchical_fp16"]
        assert max(abs(a - b) for a, b in zip(flat_losses, fp16_losses)) <= 1e-3, (rank, fp16_losses)
    crossing = {name: sum(out[name][1][-1] for out in ranks.values()) for name in JOBS}
    assert crossing["hierarchical"] == pytest.approx(crossing["flat"] * 2 / 3, rel=0.02), crossing
    assert crossing["hierarchical_fp16"] == pytest.approx(crossing["hierarchical"] / 2, rel=0.02), crossing

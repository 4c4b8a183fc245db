"""Replica integrity and ZeRO with a 0-dim parameter, on real gloo processes (no Ray): the trainer's
digest check compares each strategy's replica groups, catches one flipped bit (faults.flip_a_bit)
and names the odd ranks; ZeRO-1/2 train a model with a scalar parameter as DDP does, and its
optimiser state reloads under DDP."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.helpers import tiny_spec
from tests.workers.gloo_ranks import spawn_ranks

TEMPERED = {"model": {"entrypoint": "tests.fixtures.user_code:make_tempered_model"},
            "data": {"entrypoint": "tests.fixtures.user_code:make_dataset"}, "train.loss": "mse",
            "train.steps": 3, "train.warmup_steps": 0}



def _trainer(rank: int, world: int, overrides: dict, job_dir):
    from tests.helpers import spec_of
    from workers.training.trainer import Trainer

    spec = spec_of(**{"resources.workers": world, **overrides})
    return Trainer(spec, rank, world, torch.device("cpu"), job_dir)


def _bitflip_case(rank, world, port, queue, overrides, flipped, tmp):
    from pathlib import Path

    from workers.training.integrity import SilentDataCorruption

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    faults = [{"at_step": 2, "rank": flipped, "kind": "bitflip"}]
    trainer = _trainer(rank, world, {**overrides, "fault_tolerance.integrity_check_every": 1,
                                     "fault_injection": faults}, Path(tmp))
    groups = [g.ranks for g in trainer.strategy.replica_groups(trainer.model, trainer.ctx)]
    trainer.train_step()  # step 1: checked, clean
    try:
        trainer.train_step()  # step 2: one bit flipped on one rank after the update
        queue.put((rank, groups, None))
    except SilentDataCorruption as exc:
        queue.put((rank, groups, str(exc)))
    dist.destroy_process_group()


@pytest.mark.parametrize("overrides,world,flipped,groups,odd", [
    # ZeRO-1 over dp=3: whole parameters on every rank, one group; the majority names rank 2.
    ({**TEMPERED, "parallel.zero": 1, "train.global_batch_size": 12}, 3, 2, [(0, 1, 2)], "odd ranks: [2]"),
    # tp=2 x dp=2: each tp rank's shards replicated over dp; only the flipped shard's group disagrees.
    # (four processes: in `make test-all` only)
    pytest.param({"parallel.tp": 2, "parallel.dp": 2, "data.max_bytes": 20_000}, 4, 1, [(0, 2), (1, 3)],
                 "odd ranks: [1, 3]", marks=pytest.mark.exhaustive),
], ids=["zero1", "tp_x_dp"])
def test_a_flipped_bit_is_caught_within_its_replica_group(tmp_path, overrides, world, flipped, groups, odd):
    out = spawn_ranks(_bitflip_case, world, overrides, flipped, str(tmp_path))
    assert sorted({tuple(r) for _, gs, _ in out for r in gs}) == groups
    for rank, _, error in out:  # every rank raises at the same step, with the same verdict
        assert error is not None and "at step 2" in error and odd in error, (rank, error)


def _zero_case(rank, world, port, queue, tmp):
    from pathlib import Path

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    losses, state = {}, {}
    for zero in (0, 1, 2):
        trainer = _trainer(rank, world, {**TEMPERED, "parallel.zero": zero}, Path(tmp) / f"zero{zero}")
        losses[zero] = [trainer.train_step().loss for _ in range(3)]
        state[zero] = float(trainer.model.state_dict()["temperature" if zero else "module.temperature"])
        if zero == 2:
            trainer.checkpointer.save(trainer.model, trainer.optimizer, trainer.step)
            trainer.checkpointer.wait()
            saved = trainer.optimizer.state[trainer.model.temperature]["exp_avg"].clone()
    # The ZeRO-2 checkpoint (scalar state kept whole) loads under DDP.
    ddp = _trainer(rank, world, {**TEMPERED, "parallel.zero": 0}, Path(tmp) / "zero2")
    resumed = ddp.resume_from_latest()
    reloaded = ddp.optimizer.state[ddp.model.module.temperature]["exp_avg"]
    queue.put((rank, losses, state, resumed, bool(torch.equal(saved, reloaded))))
    dist.destroy_process_group()


def test_zero_trains_a_model_with_a_0_dim_parameter_as_ddp_does(tmp_path):
    out = spawn_ranks(_zero_case, 2, str(tmp_path))
    for rank, losses, state, resumed, reloaded in out:
        for zero in (1, 2):
            assert losses[zero] == pytest.approx(losses[0], rel=1e-5), (rank, zero, losses)
            assert state[zero] == pytest.approx(state[0], rel=1e-5), (rank, zero, state)
        assert state[0] != 1.5  # the temperature did train
        assert resumed == 3 and reloaded, (rank, resumed, reloaded)


def test_odd_ranks_are_the_minority_of_their_group():
    from workers.training.integrity import disagreements

    a, b = (0, 1, 2), (3, 4)
    assert disagreements([[(a, 7)], [(a, 7)], [(a, 7)], [(b, 5)], [(b, 5)]]) == []
    assert disagreements([[(a, 7)], [(a, 7)], [(a, 8)], [(b, 5)], [(b, 5)]]) == [2]
    assert disagreements([[(a, 7)], [(a, 7)], [(a, 7)], [(b, 5)], [(b, 6)]]) == [3, 4]  # no majority: both


@pytest.mark.parametrize("overrides", [
    {**TEMPERED, "parallel.zero": 2, "resources.workers": 2, "fault_tolerance.integrity_check_every": 1},
    {"parallel.zero": 3, "parallel.dp_shard": 2, "resources.workers": 4, "fault_tolerance.integrity_check_every": 5,
     "checkpoint.every_steps": 10},  # HSDP: each shard has a replica
    {"parallel.pp": 2, "parallel.dp": 2, "resources.workers": 4, "fault_tolerance.integrity_check_every": 5},
    {"parallel.zero": 1, "resources.workers": 2, "supervisor.straggler.policy": "rebalance"},
], ids=["zero2", "hsdp", "pp_x_dp", "zero1_rebalance"])
def test_layouts_with_replicas_may_check_them(overrides):
    from workers.spec_loading import parse_spec

    parse_spec(tiny_spec(**overrides))

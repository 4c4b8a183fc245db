"""Integrity where no replica exists (workers/training/shard_integrity.py): each rank's checksums of its own
state, sealed after the update and verified before the next forward.

- the checksum: a flipped bit anywhere in a held tensor (parameter, buffer, optimizer state) is named;
  untouched state verifies;
- on real gloo processes (no Ray): a bit flipped by the fault injector in the rows a ZeRO-2 rank owns,
  in an FSDP shard (no replica: the spec rules used to refuse the check there) and in an optimizer
  shard is caught at the next step by every rank, naming the corrupted rank;
- end to end, `trainyard run --json` and the supervisor: detection restores the last checkpoint and the
  final params_sha256 equals the fault-free run's; without the check the same flip changes it.
  One per mechanism here; every layout x {parameters, optimizer} in the `exhaustive` matrix.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks
from workers.training.shard_integrity import HeldStateSeal, held_state, word_sum

# --- the checksum ------------------------------------------------------------------------------------


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 5)).sum().backward()
    optimizer.step()
    return model, optimizer


def _flip(t: torch.Tensor, element: int, bit: int) -> None:
    t.detach().reshape(-1)[element: element + 1].view(torch.int32).bitwise_xor_(1 << bit)


def test_untouched_state_verifies_and_each_flipped_bit_is_named():
    model, optimizer = _model_and_optimizer()
    seal = HeldStateSeal(model, optimizer)
    assert seal.changed() == []  # nothing sealed yet
    seal.seal()
    names = seal.names
    assert "parameter 0.weight" in names and "buffer 1.running_mean" in names
    assert "optimizer 0.weight.exp_avg_sq" in names and "optimizer 1.bias.step" in names
    model.eval()(torch.randn(4, 5))  # a forward in eval mode reads, writes nothing
    assert seal.changed() == []
    for name, tensor in held_state(model, optimizer):
        if tensor.dtype != torch.float32:
            continue  # BatchNorm's batch counter (int64)
        for element, bit in ((0, 0), (tensor.numel() - 1, 31), (tensor.numel() // 2, 12)):
            _flip(tensor, element, bit)
            assert seal.changed() == [name], (name, element, bit)
            _flip(tensor, element, bit)  # back: verifies again
            assert seal.changed() == []


def test_the_checksum_reads_unaligned_and_strided_tensors():
    base = torch.randn(33)
    for t in (base[1:], base[1:8], base.to(torch.bfloat16)[1:], base[:32].view(4, 8).t(), base[:0]):
        before = int(word_sum(t))
        if t.numel():
            raw = t.reshape(-1).view(torch.uint8) if t.is_contiguous() else t  # strided: flip through the view
            if t.is_contiguous():
                raw[-1:].bitwise_xor_(1 << 7)  # the sign bit of the last element
            else:
                t[0, 0] = -t[0, 0]
            assert int(word_sum(t)) != before, t.shape


# --- the injector and the check on real gloo processes (no Ray) --------------------------------------



def _flip_case(rank, world, port, queue, overrides, target, tmp):
    from pathlib import Path

    from tests.helpers import spec_of
    from workers.training.integrity import SilentDataCorruption
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    faults = [{"at_step": 2, "rank": 1, "kind": "bitflip", "target": target}]
    spec = spec_of(**{"resources.workers": world, "fault_tolerance.integrity_check_every": 5,
                      "checkpoint.every_steps": 5, "fault_injection": faults, **overrides})
    trainer = Trainer(spec, rank, world, torch.device("cpu"), Path(tmp))
    trainer.train_step()
    trainer.train_step()  # rank 1 flips one bit of its own state after this update
    try:
        trainer.train_step()
        queue.put((rank, None))
    except SilentDataCorruption as exc:
        queue.put((rank, str(exc)))
    dist.destroy_process_group()


@pytest.mark.parametrize("overrides,target,tensor", [
    ({"parallel.zero": 2}, "parameters", "parameter tok_emb.weight"),  # rank 1's rows, all-gathered at step 3
    ({"parallel.zero": 3}, "parameters", "parameter tok_emb.weight"),  # FSDP, dp 2: no replica of the shard
    ({"parallel.zero": 3}, "optimizer", ".exp_avg"),  # its shard of AdamW's first moment
], ids=["zero2_rows", "fsdp_shard", "fsdp_optimizer"])
def test_a_bit_flipped_in_owned_state_stops_every_rank_at_the_next_step(tmp_path, overrides, target, tensor):
    out = spawn_ranks(_flip_case, 2, overrides, target, str(tmp_path))
    for rank, error in out:  # every rank raises before step 3's forward, naming rank 1 and the tensor
        assert error is not None, rank
        assert "between step 2's update and step 3's forward" in error and "corrupted ranks: [1]" in error, error
        assert tensor in error, error


# --- the spec rule -------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [
    {"parallel.zero": 3, "resources.workers": 2},  # FSDP without HSDP
    {"parallel.tp": 2, "resources.workers": 2},  # TP, dp 1
    {"parallel.pp": 2, "resources.workers": 2, "model.n_layers": 2},  # pipeline, dp 1
    {"parallel.zero": 2, "resources.workers": 2},
    {},  # one worker
], ids=["fsdp", "tp", "pp", "zero2", "single"])
def test_layouts_without_replicas_may_check_their_state(overrides):
    from tests.helpers import spec_of

    spec = spec_of(**overrides, **{"fault_tolerance.integrity_check_every": 5})
    assert spec.fault_tolerance.integrity_check_every == 5


def test_a_layout_whose_state_changes_at_rest_is_refused_naming_the_field_and_rule(monkeypatch):
    from tests.helpers import tiny_spec
    from workers.parallel.layouts import integrity as replicas
    from workers.spec import SpecError
    from workers.spec_loading import parse_spec

    monkeypatch.setattr(replicas, "CHANGES_AT_REST", frozenset({"fsdp"}))
    with pytest.raises(SpecError) as info:
        parse_spec(tiny_spec(**{"parallel.zero": 3, "resources.workers": 2,
                                "fault_tolerance.integrity_check_every": 5}))
    message = str(info.value)
    assert "fault_tolerance.integrity_check_every" in message
    assert "state rests between an update and the next forward" in message and "'fsdp'" in message

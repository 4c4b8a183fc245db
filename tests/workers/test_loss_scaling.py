"""fp16 dynamic loss scaling on a real model: underflow rescued, overflow skipped and backed off."""

from __future__ import annotations

import math

import torch

from workers.training.loss_scaling import LossScaler


def tiny_grads(scaler: LossScaler) -> list[torch.Tensor]:
    """Gradients of a loss so small that they underflow in fp16 unless the loss is scaled."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))  # fp32 master weights
    with torch.autocast("cpu", dtype=torch.float16):  # fp16 activations and activation gradients
        out = model(torch.randn(4, 8))
    loss = out.float().pow(2).mean() * 1e-8
    (loss * scaler.factor).backward()
    scaler.unscale_(model)
    return [p.grad for p in model[0].parameters()]  # behind an fp16 activation gradient


def test_scaling_keeps_gradients_that_fp16_would_flush_to_zero():
    unscaled = tiny_grads(LossScaler(enabled=False))
    scaled = tiny_grads(LossScaler(enabled=True))
    assert all(g.abs().max() == 0 for g in unscaled)  # underflow: fp16 alone learns nothing here
    assert all(g.abs().max() > 0 for g in scaled)


def test_overflow_skips_and_halves_then_clean_steps_grow_the_scale_back():
    s = LossScaler(enabled=True, scale=1024.0, growth_interval=3)
    assert s.overflowed(grads_finite=False) and s.scale == 512.0 and s.overflows == 1
    assert not s.overflowed(grads_finite=True) and not s.overflowed(grads_finite=True)
    assert s.scale == 512.0
    assert not s.overflowed(grads_finite=True)
    assert s.scale == 1024.0 and s.clean_steps == 0  # the third clean step in a row doubles it


def test_non_finite_gradients_at_the_minimum_scale_are_a_fault_not_an_overflow():
    s = LossScaler(enabled=True, scale=2.0, min_scale=1.0)
    assert s.overflowed(grads_finite=False) and s.scale == 1.0
    assert not s.overflowed(grads_finite=False)  # nothing left to back off: the trainer's NaN rules apply
    assert s.scale == 1.0 and s.overflows == 1


def test_disabled_scaler_is_the_identity_and_state_round_trips():
    off = LossScaler(enabled=False)
    assert off.factor == 1.0 and not off.overflowed(grads_finite=False)
    s = LossScaler(enabled=True, scale=256.0)
    s.overflowed(grads_finite=False)
    restored = LossScaler(enabled=True)
    restored.load_state_dict(s.state_dict())
    assert (restored.scale, restored.overflows) == (128.0, 1) and math.isfinite(restored.factor)

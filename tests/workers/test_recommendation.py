"""The recommendation model, its click data, the bce loss and the validation AUC (issue 50)."""

from __future__ import annotations

import pytest
import torch

from workers.data.clicks import click_log, click_splits
from workers.models.dlrm import DLRM
from workers.training.auc import roc_auc
from workers.training.losses import LOSSES
from workers.training.validation import Validation


def test_auc_of_a_hand_made_case():
    # Pairs (positive, negative): (0.35 vs 0.1) yes, (0.35 vs 0.4) no, (0.8 vs both) yes: 3 of 4.
    assert roc_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0.0, 0.0, 1.0, 1.0])) == pytest.approx(0.75)
    # A tie between a positive and a negative counts a half.
    assert roc_auc(torch.tensor([0.5, 0.5, 0.9]), torch.tensor([0.0, 1.0, 1.0])) == pytest.approx(0.75)
    assert roc_auc(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([1.0, 1.0, 0.0])) == pytest.approx(1.0)
    assert roc_auc(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0])) is None  # one class: undefined


def test_auc_is_only_recorded_for_a_binary_classifier():
    assert "auc" not in Validation(0.5, 10, 1, 10, 10).as_record()
    assert Validation(0.5, 10, 1, 10, 10, auc=0.7).as_record()["auc"] == 0.7


def test_bce_takes_one_logit_per_sample():
    logits, targets = torch.tensor([[2.0], [-1.0]]), torch.tensor([1.0, 0.0])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits.squeeze(1), targets)
    assert torch.allclose(LOSSES["bce"](logits, targets), expected)
    with pytest.raises(Exception, match="one logit per sample"):
        LOSSES["bce"](torch.zeros(2, 3), targets)


def test_click_logs_are_seeded_power_law_and_learnable():
    dense, sparse, clicks = click_log(20_000, 4, [1000], 1.1, 2.0, seed=3)
    again = click_log(20_000, 4, [1000], 1.1, 2.0, seed=3)
    assert torch.equal(sparse, again[1]) and torch.equal(clicks, again[2])
    counts = torch.bincount(sparse[:, 0], minlength=1000).sort(descending=True).values
    assert counts[0] > 50 * counts[500].clamp_min(1)  # a power law: the head dwarfs the middle
    assert 0.2 < float(clicks.mean()) < 0.8
    uniform = click_log(20_000, 4, [1000], 0.0, 2.0, seed=3)[1]
    assert torch.bincount(uniform[:, 0]).max() < 60  # exponent 0: uniform (expected 20 each)
    train_set, val_set = click_splits(1000, 4, [10, 20], 1.1, 2.0, seed=0)
    inputs, target = train_set[0]
    assert len(train_set) == 900 and len(val_set) == 100
    assert inputs["dense"].shape == (4,) and inputs["sparse"].dtype == torch.long and target.shape == ()


def test_dlrm_outputs_one_logit_per_sample_from_its_interactions():
    model = DLRM(4, [10, 20], 8, 16, 16)
    out = model(dense=torch.randn(5, 4), sparse=torch.tensor([[1, 2]] * 5))
    assert out.shape == (5,)
    rows = [t(torch.tensor([1] * 5)) for t in model.tables[:1]] + [model.tables[1](torch.tensor([2] * 5))]
    assert torch.allclose(model(torch.zeros(5, 4), torch.tensor([[1, 2]] * 5), rows=rows),
                          model(torch.zeros(5, 4), torch.tensor([[1, 2]] * 5)))

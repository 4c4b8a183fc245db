"""The planner's predicted peak per rank against the peak measured during real steps, layout by layout
(bench/planner_vs_peak.py, real gloo ranks, no Ray): every ratio within 0.85-1.15. Three layouts on two
ranks in the normal set; the whole table (`exhaustive`, several minutes here) in make test-all."""

from __future__ import annotations

import pytest

from bench.planner_vs_peak import LAYOUTS, measure, table

# The previous planner was 0.61x, 1.65x and 0.80x off on these: a recomputed block under FSDP, a pipeline's
# micro-batches in flight, autocast's fp32 residuals and 16-bit copies.
FAST = ["fsdp_ac", "pp2_1f1b", "ddp_bf16"]


def _assert_within(names: list[str]) -> None:
    results = measure(names)
    report = table(results)
    for name, (peak, predicted, _, _) in results.items():
        assert 0.85 <= predicted / peak <= 1.15, f"{name}: predicted {predicted} vs measured {peak}\n{report}"


@pytest.mark.timeout(600)
def test_the_planner_predicts_the_measured_peak():
    _assert_within(FAST)


@pytest.mark.exhaustive
@pytest.mark.timeout(1800)
def test_the_planner_predicts_the_measured_peak_of_every_layout():
    _assert_within([n for n in LAYOUTS if n not in FAST])

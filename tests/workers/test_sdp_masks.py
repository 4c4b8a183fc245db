"""SDP without Ray: the mask assignment's invariants, the spec rules (also through `trainyard validate`),
the subnetworks' shapes and consistency, and the unbiasedness of backward masking."""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from tests.helpers import spec_of, tiny_spec
from workers.models.gpt import GPT
from workers.parallel.sdp.feasibility import feasibility_error, held_count
from workers.parallel.sdp.masks import assign
from workers.parallel.sdp.subnetwork import build_subnetwork
from workers.spec import SPEC_ERRORS, format_validation_error

CASES = list(itertools.product(["block", "neuron"], [1, 2, 3, 4, 5, 8], [2, 4, 6, 8, 12, 24, 128],
                               [0.125, 0.25, 0.375, 0.5, 0.6, 0.75, 0.9, 1.0]))


@pytest.mark.parametrize(("mode", "workers"), sorted({(m, w) for m, w, _, _ in CASES}))
def test_every_feasible_assignment_is_covering_balanced_and_connected(mode, workers):
    checked = 0
    for _, _, n, coverage in (c for c in CASES if c[:2] == (mode, workers)):
        layers = 1 if mode == "block" else 3
        a = assign(mode, workers, layers, n, coverage, seed=7)
        problem = feasibility_error(n, workers, coverage, "component")
        # The validator's verdict is exactly what the assignment delivers.
        assert (problem is None) == a.is_connected(), (n, coverage, problem)
        assert (a.spectral_gap > 1e-9) == a.is_connected(), (n, coverage, a.spectral_gap)
        if problem is not None:
            continue
        checked += 1
        k = held_count(n, coverage)
        for layer in range(layers):
            for w in range(workers):
                held = a.held[layer][w]
                assert len(held) == k and len(set(held)) == k and list(held) == sorted(held)  # balanced, no repeats
            counts = [len(a.holders(layer, c)) for c in range(n)]
            assert min(counts) >= 1  # every component is held
            assert max(counts) - min(counts) <= 1  # load spread evenly over components
            assert sum(counts) == workers * k
        assert a.held_fraction(0) == pytest.approx(k / n)
    assert checked > 0


def test_assignment_is_a_pure_function_of_the_seed():
    a, b, c = (assign("neuron", 4, 2, 64, 0.5, seed=s) for s in (3, 3, 4))
    assert a.held == b.held and a.held != c.held
    assert a.spectral_gap == b.spectral_gap


def test_spectral_gap_grows_with_overlap():
    # More sharing between workers = a better-connected mask graph = a larger gap (all-shared: K / (K - 1)).
    gaps = [assign("block", 4, 1, 8, c, 0).spectral_gap for c in (0.375, 0.5, 0.75, 1.0)]
    assert gaps == sorted(gaps) and gaps[0] > 0
    assert gaps[-1] == pytest.approx(4 / 3)


def test_infeasible_coverage_names_the_lowest_feasible_one():
    msg = feasibility_error(8, 4, 0.25, "block")
    assert "lowest feasible coverage is 3/8" in msg
    assert feasibility_error(8, 4, 0.375, "block") is None


# --- spec rules --------------------------------------------------------------------------------

def errors_of(**overrides) -> list[dict]:
    with pytest.raises(SPEC_ERRORS) as exc:
        spec_of(**overrides)
    return format_validation_error(exc.value)


BASE = {"resources.workers": 4, "model.n_layers": 8}
BAD = [
    ({"parallel.sdp": {"coverage": 0.25}}, "parallel.sdp.coverage", "lowest feasible coverage is 3/8"),
    ({"parallel.sdp": {"mode": "neuron", "coverage": 0.001}}, "parallel.sdp.coverage", "at least one MLP hidden unit"),
    ({"parallel.sdp": {}, "parallel.zero": 1}, "parallel.sdp", "zero 0 or 3"),
    ({"parallel.sdp": {}, "parallel.tp": 2, "parallel.dp": 2}, "parallel.sdp", "tp = 1"),
    ({"parallel.sdp": {}, "parallel.local_sgd": {"period": 2}}, "parallel.sdp", "local_sgd"),
    ({"parallel.sdp": {}, "parallel.compression": {"kind": "fp16"}}, "parallel.sdp", "compression"),
    ({"parallel.sdp": {}, "parallel.zero": 3}, "parallel.sdp", "dp_shard >= 2"),
    ({"parallel.sdp": {"mode": "neuron"}, "parallel.zero": 3, "parallel.dp_shard": 2}, "parallel.sdp", "mode 'block'"),
    ({"parallel.sdp": {}, "resources.max_workers": 8}, "parallel.sdp", "fixed world size"),
    ({"parallel.sdp": {"sync": {"period": 0}}}, "parallel.sdp.sync", ""),
    ({"parallel.sdp": {"coverage": 1.5}}, "parallel.sdp.coverage", ""),
]


@pytest.mark.parametrize(("overrides", "field", "words"), BAD)
def test_spec_refuses_bad_sdp_layouts_naming_field_and_rule(overrides, field, words):
    errors = errors_of(**{**BASE, **overrides})
    hits = [e for e in errors if e["field"].startswith(field) and words in e["message"]]
    assert hits, errors


def test_good_sdp_specs_validate():
    spec = spec_of(**BASE, **{"parallel.sdp": {"mode": "neuron", "masking": "backward", "coverage": 0.375,
                                               "sync": {"period": 4}, "seed": 3}})
    assert spec.parallel.sdp.sync.period == 4
    spec_of(**BASE, **{"parallel.sdp": {"coverage": 0.75}, "parallel.zero": 3, "parallel.dp_shard": 2,
                       "parallel.activation_checkpointing": True})


def test_trainyard_validate_prints_the_sdp_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_spec(**BASE, **{"parallel.sdp": {"coverage": 0.25}})))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(tiny_spec(**BASE, **{"parallel.sdp": {"coverage": 0.5}})))
    env = {**os.environ, "TRAINYARD_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "api.cli", "validate", str(bad)], capture_output=True, text=True, env=env)
    assert out.returncode == 2
    assert "parallel.sdp.coverage is infeasible" in out.stderr and "3/8" in out.stderr
    out = subprocess.run([sys.executable, "-m", "api.cli", "validate", str(good), "--json"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["parallel"]["sdp"]["coverage"] == 0.5


# --- subnetworks ---------------------------------------------------------------------------------

def tiny_gpt(n_layers=4, d_model=16) -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=64, seq_len=16, n_layers=n_layers, d_model=d_model, n_heads=2)


def numel(model, trainable=None) -> int:
    return sum(p.numel() for p in model.parameters() if trainable is None or p.requires_grad == trainable)


def test_forward_masking_physically_drops_blocks_and_units():
    full = tiny_gpt()
    a = assign("block", 4, 1, 4, 0.5, 0)
    sub, _ = build_subnetwork(copy.deepcopy(full), a, 1, "forward")
    block = numel(full.blocks[0])
    assert len(sub.blocks) == 2 and numel(sub) == numel(full) - 2 * block
    a = assign("neuron", 4, 4, 64, 0.5, 0)
    sub, _ = build_subnetwork(copy.deepcopy(full), a, 2, "forward")
    mlp = sub.blocks[0].mlp
    assert mlp.fc_weight.shape == (32, 16) and mlp.proj_weight.shape == (16, 32) and mlp.fc_bias.shape == (32,)
    assert numel(sub) == numel(full) - 4 * 32 * (16 + 1 + 16)


def test_backward_masking_keeps_the_full_forward_but_trains_only_held_parts():
    full, x = tiny_gpt(), torch.randint(0, 64, (2, 16))
    for mode, n in (("block", 4), ("neuron", 64)):
        a = assign(mode, 4, 1 if mode == "block" else 4, n, 0.5, 0)
        sub, pieces = build_subnetwork(copy.deepcopy(full), a, 3, "backward")
        # Same function as the full model (neuron mode splits each MLP into held + frozen units).
        torch.testing.assert_close(sub(x), full(x), rtol=1e-5, atol=1e-6)
        assert numel(sub) == numel(full)
        assert numel(sub, trainable=True) < 0.85 * numel(full)
        for piece in pieces:  # trainable exactly where this worker is a holder
            assert dict(sub.named_parameters())[piece.local].requires_grad == (3 in piece.holders), piece


def test_pieces_map_every_full_parameter_element_exactly_once_per_holder():
    full = tiny_gpt()
    shapes = {n: p.shape for n, p in full.named_parameters()}
    for mode, n, masking in (("block", 4, "forward"), ("neuron", 64, "forward"), ("neuron", 64, "backward")):
        a = assign(mode, 4, 1 if mode == "block" else 4, n, 0.5, 0)
        counts = {name: torch.zeros(s) for name, s in shapes.items()}
        for w in range(4):
            sub, pieces = build_subnetwork(copy.deepcopy(full), a, w, masking)
            params = dict(sub.named_parameters())
            for p in pieces:
                if w not in p.holders:
                    continue
                src = params[p.local].detach()
                if p.dim is None:
                    torch.testing.assert_close(src, full.get_parameter(p.global_name).detach(), rtol=0, atol=0)
                    counts[p.global_name] += 1
                else:
                    li, gi = torch.tensor(p.local_index), torch.tensor(p.global_index)
                    want = full.get_parameter(p.global_name).detach().index_select(p.dim, gi)
                    torch.testing.assert_close(src.index_select(p.dim, li), want, rtol=0, atol=0)
                    counts[p.global_name].index_add_(p.dim, gi, torch.ones_like(want))
        for name, c in counts.items():  # every element held somewhere; shared ones by their holder count
            assert c.min() >= 1, (mode, name)


# --- backward masking is unbiased ---------------------------------------------------------------

class Workers:
    """The 4 workers' backward-masked subnetworks of one fixed model, built once."""

    def __init__(self, full, a):
        self.subs = []
        for w in range(a.workers):
            sub, pieces = build_subnetwork(copy.deepcopy(full), a, w, "backward")
            params = dict(sub.named_parameters())
            mine = [(params[p.local], p.global_name, p.dim,
                     None if p.dim is None else torch.tensor(p.local_index),
                     None if p.dim is None else torch.tensor(p.global_index))
                    for p in pieces if w in p.holders and ".mlp." in p.global_name]
            self.subs.append((sub, mine))
        self.names = [n for n, _ in full.named_parameters() if ".mlp." in n]
        self.shapes = dict((n, p.shape) for n, p in full.named_parameters())

    def estimate(self, batches, divide_by: int | None = None) -> torch.Tensor:
        """Each worker's gradient on its batch; every MLP element averaged over its holders (or / divide_by)."""
        total = {n: torch.zeros(self.shapes[n]) for n in self.names}
        count = {n: torch.zeros(self.shapes[n]) for n in self.names}
        for (sub, mine), (x, y) in zip(self.subs, batches):
            sub.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(sub(x).flatten(0, 1), y.flatten()).backward()
            for param, name, dim, li, gi in mine:
                if dim is None:
                    total[name] += param.grad
                    count[name] += 1
                else:
                    g = param.grad.index_select(dim, li)
                    total[name].index_add_(dim, gi, g)
                    count[name].index_add_(dim, gi, torch.ones_like(g))
        return torch.cat([(total[n] / (divide_by or count[n])).flatten() for n in self.names])


def z_scores(full, workers: Workers, data, divide_by=None, rounds=150, micro=2) -> torch.Tensor:
    """Per element: (mean of the estimate over rounds - full-data gradient) / its standard error."""
    x_all, y_all = data
    ref = copy.deepcopy(full)
    torch.nn.functional.cross_entropy(ref(x_all).flatten(0, 1), y_all.flatten()).backward()
    grads = dict((n, p.grad) for n, p in ref.named_parameters())
    truth = torch.cat([grads[n].flatten() for n in workers.names])
    gen = torch.Generator().manual_seed(1)
    samples = []
    for _ in range(rounds):
        idx = torch.randperm(len(x_all), generator=gen)[: len(workers.subs) * micro].view(-1, micro)
        samples.append(workers.estimate([(x_all[i], y_all[i]) for i in idx], divide_by))
    s = torch.stack(samples)
    return (s.mean(0) - truth) / (s.std(0) / rounds ** 0.5 + 1e-12)


@pytest.fixture
def one_thread():
    # Tiny tensors on a shared, loaded host: intra-op threads only contend (7x slower measured).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_backward_masking_gradient_is_unbiased(one_thread):
    """Over 150 random global batches (4 workers x 2 sequences) of a fixed 64-sequence set, the holder-averaged
    backward-masked gradient of every MLP element (N-SDP, C = 0.5) is compared with the full-set gradient.
    Unbiased: the z-scores are ~N(0, 1), so their mean |z| is ~0.80 (we allow < 1.0) and under 1% exceed 4.
    The same check fails for the wrong average (dividing by all 4 workers instead of the holders)."""
    full = tiny_gpt(n_layers=2)
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(0, 64, (64, 17), generator=gen)
    data = (data[:, :-1], data[:, 1:])
    workers = Workers(full, assign("neuron", 4, 2, 64, 0.5, 0))
    z = z_scores(full, workers, data).abs()
    assert z.mean() < 1.0 and (z > 4).float().mean() < 0.01, (z.mean(), (z > 4).float().mean())
    wrong = z_scores(full, workers, data, divide_by=4).abs()
    assert wrong.mean() > 2.0, wrong.mean()

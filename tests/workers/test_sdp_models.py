"""SDP block mode on models other than the built-in GPT: a Hugging Face Llama's `model.layers` and an
entrypoint model's blocks. Spec rules, subnetwork cutting and assembly without Ray; one slow end-to-end run."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import Events, alive_actors, tiny_spec
from workers.models import build_model
from workers.parallel.sdp.assignment import assignment_of, blocks_of
from workers.parallel.sdp.strategy import load_full_state
from workers.parallel.sdp.subnetwork import build_subnetwork
from workers.spec import SPEC_ERRORS, format_validation_error
from workers.spec_loading import parse_spec

LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}


def llama(**overrides) -> dict:
    return tiny_spec(**{"model": {"hf": {"model_type": "llama", "config": LLAMA}},
                        "data": {"name": "text:pystdlib", "max_bytes": 200_000, "seq_len": 32},
                        "resources.workers": 4, "parallel.sdp": {"mode": "block", "coverage": 0.5}, **overrides})


def errors(data: dict) -> list[dict]:
    with pytest.raises(SPEC_ERRORS) as exc:
        parse_spec(data)
    return format_validation_error(exc.value)


def test_spec_accepts_block_mode_on_hf_and_checks_its_layers():
    assert parse_spec(llama()).parallel.sdp.mode == "block"
    found = errors(llama(**{"parallel.sdp": {"coverage": 0.25}}))  # 1 of 4 blocks on 4 workers: no sharing
    assert any(e["field"] == "parallel.sdp.coverage" and "of 4 blocks" in e["message"] for e in found), found


def test_spec_refuses_neuron_mode_off_the_gpt_naming_the_mode():
    found = errors(llama(**{"parallel.sdp": {"mode": "neuron"}}))
    assert any(e["field"] == "parallel.sdp.mode" and "built-in gpt" in e["message"] for e in found), found


def test_entrypoint_model_is_checked_once_built():
    spec = parse_spec(tiny_spec(**{"model": {"entrypoint": "tests.fixtures.sdp_blocks:make_model", "args": {"n": 4}},
                                   "data": {"name": "text:pystdlib", "max_bytes": 200_000, "seq_len": 16},
                                   "resources.workers": 4, "parallel.sdp": {"coverage": 0.25}}))
    model = build_model(spec)
    assert blocks_of(model, spec) == "stack"
    with pytest.raises(ValueError, match=r"parallel.sdp.coverage: .*of 4 blocks"):
        assignment_of(spec, 4)


@pytest.mark.parametrize("masking", ["forward", "backward"])
def test_llama_subnetworks_cut_model_layers_and_assemble_exactly(masking):
    spec = parse_spec(llama(**{"parallel.sdp": {"coverage": 0.5, "masking": masking}}))
    full = build_model(spec)
    reference = {n: p.detach().clone() for n, p in full.named_parameters()}
    a = assignment_of(spec, 4)
    assert a.k == 2
    held: dict[str, set[int]] = {}
    x = torch.randint(0, 256, (2, 16))
    for worker in range(4):
        model = build_model(spec)
        sub, pieces = build_subnetwork(model, a, worker, masking, "model.layers")
        local = dict(sub.named_parameters())
        assert len(sub.model.layers) == (2 if masking == "forward" else 4)
        trainable = {n for n, p in local.items() if p.requires_grad and n.startswith("model.layers.")}
        assert len(trainable) == 2 * 9  # 2 blocks x (q, k, v, o, gate, up, down, 2 norms)
        assert sub(x).logits.shape == (2, 16, 256)  # HF's forward runs the held layers only
        for piece in pieces:
            assert piece.global_name in reference and piece.local in local  # full FQNs <- local names
            assert torch.equal(local[piece.local], reference[piece.global_name])
            if worker in piece.holders:
                held.setdefault(piece.global_name, set()).add(worker)
    assert set(held) == set(reference)  # every full parameter is held by someone
    # Assembly: each parameter from its lowest holder rebuilds the full model (tied names included).
    fresh = build_model(parse_spec(llama(**{"train.seed": 7})))
    load_full_state(fresh, reference)
    assert all(torch.equal(p, reference[n]) for n, p in fresh.named_parameters())


def test_tied_hf_weights_load_from_one_name():
    spec = parse_spec(llama(**{"model": {"hf": {"model_type": "llama", "config": {**LLAMA, "tie_word_embeddings": True}}}}))
    model = build_model(spec)
    state = {n: p.detach().clone() + 1 for n, p in model.named_parameters()}
    assert "lm_head.weight" not in state
    load_full_state(model, state)
    assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])
    with pytest.raises(RuntimeError, match="missing"):
        load_full_state(model, {k: v for k, v in state.items() if k != "model.norm.weight"})


def test_planner_counts_the_held_blocks_of_a_llama():
    from workers.parallel.planner import estimate

    spec = parse_spec(llama())
    full = sum(p.numel() for p in build_model(spec).parameters())
    block = sum(p.numel() for p in build_model(spec).model.layers[0].parameters())
    assert estimate(spec).model_state_bytes_per_rank == 16 * (full - 2 * block)


# --- end to end on Ray -------------------------------------------------------------------------

E2E = {
    "forward": ({"parallel.sdp": {"mode": "block", "coverage": 0.5}}, 2, 1),
    "fsdp": ({"parallel.sdp": {"mode": "block", "coverage": 0.75}, "parallel.zero": 3, "parallel.dp_shard": 2}, 3, 2),
}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", list(E2E))
def test_llama_trains_under_sdp_block_mode(ray_cluster, tmp_path, case):
    """4 workers each train their held Llama layers; the job learns and exports the full model."""
    from safetensors.torch import load_file

    from service.supervisor.run import JobRun

    extra, held, shards = E2E[case]
    spec = parse_spec(llama(**{"train.steps": 10, "train.eval_batches": 2, **extra}), allow_fault_injection=True)
    rec = Events()
    summary = JobRun(spec, tmp_path / case, case, listener=rec).run()
    assert summary["state"] == "SUCCEEDED", summary["error"]
    assert summary["layout"]["strategy"] == "sdp" and len(rec.steps) == 10
    first, last = rec.steps[0]["loss"], rec.steps[-1]["loss"]
    assert last < first - 0.3, (first, last)  # byte-level loss from ~ln 256 = 5.5
    report = summary["sdp"]
    assert report["workers"] == 4 // shards and report["components_per_layer"] == 4
    assert report["held_per_worker"] == held and report["held_fraction_per_rank"] == [held / 4] * (4 // shards)
    model = build_model(spec)
    full = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.model.layers[0].parameters())
    # Each rank keeps (and trains) only its held layers: 16 bytes per parameter, sharded under FSDP.
    kept = full - (4 - held) * block
    assert summary["model_state_bytes_per_rank"] == pytest.approx(16 * kept / shards, rel=0.02)
    exported = load_file(summary["export_path"])
    assert set(exported) == {n for n, _ in model.named_parameters()}  # the full model, every layer
    assert alive_actors() == []

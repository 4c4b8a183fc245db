"""Expert parallelism as a job: the built-in GPT with `model.moe` trained on a real Ray with gloo under
`parallel.ep` (with DDP, FSDP and tp), against one process holding every expert (same data, same global
batch), and its checkpoint resumed under another ep degree (experts are DTensor shards: DCP reshards them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import TrainedOnce, alive_actors, spec_of, train
from workers.spec_loading import parse_spec

pytestmark = pytest.mark.slow

BASE = {"model.n_layers": 2, "model.n_heads": 4, "model.d_model": 32, "train.steps": 20,
        "checkpoint.every_steps": 10, "model.moe": {"experts": 4, "top_k": 2}}
LAYOUTS = {
    "moe_reference": {"resources.workers": 1},
    "ep2": {"resources.workers": 2, "parallel.ep": 2},
    "dp4xep2": {"resources.workers": 4, "parallel.ep": 2},
    "ep2_ac": {"resources.workers": 2, "parallel.ep": 2, "parallel.activation_checkpointing": True},
    "dp2": {"resources.workers": 2},  # the MoE model, every expert on every rank
    # FSDP shards the dense parameters over dp; the experts over ep (dp2 x ep2, and dp4 x ep2 across groups)
    "fsdp_ep2": {"resources.workers": 2, "parallel.ep": 2, "parallel.zero": 3},
    "fsdp_dp4xep2": {"resources.workers": 4, "parallel.ep": 2, "parallel.zero": 3},
    "fsdp_dp2": {"resources.workers": 2, "parallel.zero": 3},  # FSDP, every expert sharded by FSDP (ep1)
    # attention over tp2, experts over ep2 (borrowed from dp2): tp ranks route the same tokens
    "dp2xtp2xep2": {"resources.workers": 4, "parallel.tp": 2, "parallel.ep": 2},
    # all three: FSDP x TP over the 2-D (dp, tp) mesh, the experts over ep2 borrowed from dp2
    "fsdp_dp2xtp2xep2": {"resources.workers": 4, "parallel.tp": 2, "parallel.ep": 2, "parallel.zero": 3},
    # mixed precision: 16-bit rows through the all-to-all
    "moe_reference_bf16": {"resources.workers": 1, "parallel.mixed_precision": "bf16"},
    "ep2_bf16": {"resources.workers": 2, "parallel.ep": 2, "parallel.mixed_precision": "bf16"},
    "fsdp_reference_bf16": {"resources.workers": 1, "parallel.zero": 3, "parallel.mixed_precision": "bf16"},
    "fsdp_ep2_bf16": {"resources.workers": 2, "parallel.ep": 2, "parallel.zero": 3, "parallel.mixed_precision": "bf16"},
}
EXHAUSTIVE = {"ep2_ac", "dp4xep2", "fsdp_dp4xep2", "dp2xtp2xep2", "fsdp_dp2xtp2xep2"}
STRATEGY = {"fsdp_ep2": "fsdp", "fsdp_dp4xep2": "fsdp", "dp2xtp2xep2": "tp", "fsdp_dp2xtp2xep2": "fsdp"}
# Routing is discrete: a near-tie between two experts' router scores can flip with the order of a sum.
TOLERANCE = 1e-3


def spec_for(name: str):
    return spec_of(**{**BASE, **LAYOUTS[name]})


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    yield TrainedOnce(tmp_path_factory.mktemp("moe"), spec_for)
    assert alive_actors() == []


@pytest.mark.parametrize("name", [n if n not in EXHAUSTIVE else pytest.param(n, marks=pytest.mark.exhaustive)
                                  for n in ("ep2", "dp4xep2", "ep2_ac", "dp2", "fsdp_ep2", "fsdp_dp4xep2",
                                            "dp2xtp2xep2", "fsdp_dp2xtp2xep2")])
def test_expert_parallel_follows_one_process_with_every_expert(runs, name):
    _, ref = runs["moe_reference"]
    summary, steps = runs[name]
    assert summary["layout"]["strategy"] == STRATEGY.get(name, "ddp")  # dp2: every expert on both ranks, DDP
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.5  # the reference learns
    for step in (9, 19):  # dp2 routes exactly as one process: only the order of the gradient sums differs
        assert steps[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-5 if name == "dp2" else TOLERANCE), \
            (name, step)
    # telemetry: every routed token counted once per layer (16 sequences of 32 tokens, top 2, 2 layers), the
    # same counts as the reference's routing, and their imbalance
    for record, want in zip(steps, ref):
        assert sum(record["expert_tokens"]) == 16 * 32 * 2 * 2 and len(record["expert_tokens"]) == 4
        assert record["expert_load_imbalance"] == max(record["expert_tokens"]) / (16 * 32 * 2 * 2 / 4) >= 1.0
    assert steps[0]["expert_tokens"] == ref[0]["expert_tokens"]  # step 1: the same weights route the same way
    if name == "dp2":
        return
    # comm bytes: the data-parallel step's reduction of the shared parameters (DDP's all-reduce; FSDP's
    # reduce-scatter and all-gathers move at least as much; under tp each rank's shards), plus the all-to-all
    # (forward and backward) and, across expert groups, the expert shards' all-reduce
    from workers.models import build_model
    from workers.models.description import describe
    from workers.models.param_counts import tp_sharded_params
    from workers.parallel.expert_parallel import expert_parameters

    model = build_model(spec_for(name))
    experts = sum(p.numel() for p in expert_parameters(model))
    tp = summary["layout"].get("tp", 1)
    shared = sum(p.numel() for p in model.parameters()) - experts - tp_sharded_params(
        model, describe(model).tp_plan) * (1 - 1 / tp)
    dp, ep = summary["layout"]["dp"], summary["layout"]["ep"]
    ddp = 2 * (dp - 1) / dp * 4 * shared
    across = 2 * (dp // ep - 1) / (dp // ep) * 4 * experts / ep
    assert summary["comm_bytes_per_step"] > ddp + across, (name, summary["comm_bytes_per_step"], ddp, across)
    # each rank holds 2 of the 4 experts: its model state is below one holding all of them
    assert summary["model_state_bytes_per_rank"] < runs["moe_reference"][0]["model_state_bytes_per_rank"]
    from workers.parallel.planner import estimate  # and the planner knows by how much

    predicted = estimate(spec_for(name)).model_state_bytes_per_rank
    assert predicted == pytest.approx(summary["model_state_bytes_per_rank"], rel=0.10), name


@pytest.mark.parametrize(("name", "reference"), [
    ("ep2_bf16", "moe_reference_bf16"),
    pytest.param("fsdp_ep2_bf16", "fsdp_reference_bf16", marks=pytest.mark.exhaustive)])
def test_expert_parallel_in_mixed_precision_follows_one_process_in_it(runs, name, reference):
    """bf16 (autocast under DDP, FSDP's cast of the dense parameters; the expert shards FSDP leaves are cast
    where they meet the rows): the all-to-all carries the 16-bit rows on gloo as it is."""
    summary, steps = runs[name]
    _, ref = runs[reference]
    assert summary["layout"]["strategy"] == ("fsdp" if "fsdp" in name else "ddp")
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.5
    for step in (9, 19):
        assert steps[step]["loss"] == pytest.approx(ref[step]["loss"], rel=TOLERANCE), (name, step)


def mixtral(layout: dict):
    from tests.user_models import MIXTRAL_SPEC

    return parse_spec({**MIXTRAL_SPEC, "train": {"steps": 12, "global_batch_size": 16, "micro_batch_size": 4,
                                                 "lr": 3e-3, "warmup_steps": 2},
                       "resources": {"workers": layout.get("workers", 1)}, "parallel": layout.get("parallel", {})})


@pytest.fixture(scope="module")
def mixtral_reference(ray_cluster, tmp_path_factory):
    return train(mixtral({}), tmp_path_factory.mktemp("mixtral") / "one")[1]


@pytest.mark.parametrize("parallel", [pytest.param({"ep": 2}, id="ep2"),
                                      pytest.param({"ep": 2, "zero": 3}, id="fsdp_ep2", marks=pytest.mark.exhaustive)])
def test_a_hugging_face_mixtral_under_ep2_follows_one_process(mixtral_reference, tmp_path, parallel):
    """transformers' own Mixtral (stacked experts, its router): experts split over 2 ranks, tokens by
    all-to-all, its load-balancing loss added to cross-entropy, the rest replicated (DDP) or sharded by FSDP;
    the loss follows one process within 1e-3."""
    ref = mixtral_reference
    summary, steps = train(mixtral({"workers": 2, "parallel": parallel}), tmp_path / "ep2")
    assert (summary["layout"]["ep"], summary["layout"]["dp"]) == (2, 2)  # ep borrows the dp ranks
    assert summary["layout"]["strategy"] == ("fsdp" if parallel.get("zero") == 3 else "ddp")
    assert ref[-1]["loss"] < ref[0]["loss"]
    for step in (5, 11):
        assert steps[step]["loss"] == pytest.approx(ref[step]["loss"], rel=TOLERANCE), step
    assert sum(steps[0]["expert_tokens"]) == 16 * 16 * 2 * 2  # 16 sequences of 16 tokens, top 2, 2 layers


# (trained under, resumed under): ep2's experts saved as shards of one tensor, resumed with every expert on
# every rank (dp2); FSDP x ep2's (dense parameters sharded by FSDP over dp, experts over ep) under FSDP alone.
RESUMES = [pytest.param("ep2", "dp2", id="ep2-to-dp2"),
           pytest.param("fsdp_ep2", "fsdp_dp2", id="fsdp_ep2-to-fsdp_dp2", marks=pytest.mark.exhaustive)]


@pytest.mark.parametrize(("trained", "resumed_as"), RESUMES)
def test_an_ep2_checkpoint_resumes_without_expert_parallelism(runs, tmp_path, trained, resumed_as):
    """The step-10 checkpoint under ep1: steps 11..20 continue as the ep2 run did."""
    summary, steps = runs[trained]
    src = Path(summary["job_dir"]) / "checkpoints" / "step-00000010"
    job = tmp_path / f"{trained}-to-{resumed_as}"
    shutil.copytree(src, job / "checkpoints" / "step-00000010")
    _, resumed = train(spec_for(resumed_as), job)
    assert [s["step"] for s in resumed] == list(range(11, 21))
    for s in resumed:
        assert s["loss"] == pytest.approx(steps[s["step"] - 1]["loss"], rel=TOLERANCE), s["step"]

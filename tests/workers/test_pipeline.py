"""Pipeline parallelism on a real local Ray with gloo: numerics against the single-process reference,
PP x DP, checkpoint resharding, activations in flight, and the measured bubble against theory."""

from __future__ import annotations

import statistics

import pytest
from safetensors.torch import load_file

from service.supervisor.run import JobRun
from tests.helpers import Events, spec_of
from workers.models import build_model
from workers.parallel.pipeline.chimera_schedule import simulated_bubble
from workers.parallel.planner import estimate

pytestmark = pytest.mark.slow

BASE = {"model.n_layers": 4, "train.steps": 10}
REL = 1e-5  # the tolerance; observed differences are ~5e-8


def run(spec, tmp_path, name):
    rec = Events()
    summary = JobRun(spec, tmp_path / name, name, listener=rec).run()
    assert summary["state"] == "SUCCEEDED", summary["error"]
    return summary, rec.steps


def pipeline(schedule, pp=2, **overrides):
    return spec_of(**{**BASE, "resources.workers": pp, "parallel.pp": pp,
                      "parallel.pipeline": {"schedule": schedule}, **overrides})


@pytest.fixture(scope="module")
def reference(ray_cluster, tmp_path_factory):
    _, steps = run(spec_of(**BASE), tmp_path_factory.mktemp("ref"), "ref")
    return [s["loss"] for s in steps]


CASES = [(s, 2) for s in ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zero_bubble",
                          "zbv_zero_bubble", "dualpipe_v", "chimera")] + [("gpipe", 4), ("1f1b", 4), ("chimera", 4)]
# `make test` runs one schedule of each kind (single-stage, looped, V-shaped, bidirectional) and one deeper
# pipeline; every schedule at every depth runs in `make test-all`.
REPRESENTATIVE = {("1f1b", 2), ("interleaved_1f1b", 2), ("zbv_zero_bubble", 2), ("gpipe", 4), ("chimera", 4)}


@pytest.mark.parametrize("schedule,pp", [
    pytest.param(s, p, id=f"{s}-pp{p}", marks=() if (s, p) in REPRESENTATIVE else pytest.mark.exhaustive)
    for s, p in CASES])
def test_schedule_matches_single_process_reference(reference, tmp_path, schedule, pp):
    summary, steps = run(pipeline(schedule, pp), tmp_path, f"{schedule}-{pp}")
    losses = [s["loss"] for s in steps]
    assert len(losses) == 10
    assert losses == pytest.approx(reference, rel=REL)
    assert summary["layout"]["strategy"] == "pipeline" and summary["layout"]["pp"] == pp
    # Accounting on every step, per stage, and in the summary.
    for s in steps:
        assert [st["stage"] for st in s["stages"]] == list(range(pp))
        assert 0.0 <= s["bubble_fraction"] < 1.0 and s["bubble_fraction_theoretical"] is not None
    assert summary["bubble_fraction"] is not None and summary["bubble_fraction_theoretical"] is not None
    split = summary["pipeline"]["split"]
    assert split[0]["embedding"] and split[-1]["head"]
    assert sorted(b for st in split for b in st["blocks"]) == [0, 1, 2, 3]
    assert summary["params_sha256"] and summary["comm_bytes_per_step"] > 0


@pytest.mark.exhaustive  # make test: pp 2 x tp 2 x dp 2 on Llama (test_pipeline_models)
def test_pp2_x_dp2_matches_reference(reference, tmp_path):
    spec = spec_of(**BASE, **{"resources.workers": 4, "parallel.pp": 2, "parallel.dp": 2})
    summary, steps = run(spec, tmp_path, "pp2dp2")
    assert [s["loss"] for s in steps] == pytest.approx(reference, rel=REL)
    assert summary["layout"] == {**summary["layout"], "pp": 2, "dp": 2}
    assert len(steps[-1]["stages"]) == 2  # two replicas per stage, averaged


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pp2_x_fsdp_dp2_matches_reference(reference, tmp_path, schedule):
    """pp x FSDP2: each stage sharded over its two replicas by the shard step (parallel.zero 3)."""
    spec = pipeline(schedule, **{"resources.workers": 4, "parallel.dp": 2, "parallel.zero": 3})
    summary, steps = run(spec, tmp_path, f"pp2-fsdp-{schedule}")
    assert [s["loss"] for s in steps] == pytest.approx(reference, rel=1e-4)
    assert summary["layout"] == {**summary["layout"], "pp": 2, "dp": 2, "zero": 3, "strategy": "pipeline"}
    predicted = estimate(spec)  # each stage's state halved over its replicas; FSDP's gathers metered as its own
    assert summary["model_state_bytes_per_rank"] == pytest.approx(predicted.model_state_bytes_per_rank, rel=0.1)
    assert summary["comm_bytes_per_step"] == pytest.approx(predicted.comm_bytes_per_step, rel=0.1)
    exported = load_file(summary["export_path"])  # FSDP shards and both stages gathered
    assert set(exported) == set(build_model(spec).state_dict())


@pytest.mark.exhaustive  # make test: chimera at pp 4
def test_chimera_pp2_x_dp2_matches_reference(reference, tmp_path):
    spec = pipeline("chimera", **{"resources.workers": 4, "parallel.dp": 2})
    summary, steps = run(spec, tmp_path, "chimera-dp2")
    assert [s["loss"] for s in steps] == pytest.approx(reference, rel=REL)  # two copies of each stage x dp 2
    assert summary["layout"] == {**summary["layout"], "pp": 2, "dp": 2}


@pytest.mark.exhaustive  # make test: pp 2 x tp 2 x dp 2 on Llama (test_pipeline_models)
def test_pp2_x_tp2_matches_reference(reference, tmp_path):
    spec = spec_of(**BASE, **{"resources.workers": 4, "parallel.pp": 2, "parallel.tp": 2,
                              "parallel.pipeline": {"schedule": "zbv_zero_bubble"}})
    summary, steps = run(spec, tmp_path, "pp2tp2")
    assert [s["loss"] for s in steps] == pytest.approx(reference, rel=REL)
    assert summary["layout"] == {**summary["layout"], "pp": 2, "tp": 2, "dp": 1}
    exported = load_file(summary["export_path"])  # TP shards and both stages gathered
    assert set(exported) == set(build_model(spec).state_dict())


@pytest.mark.exhaustive  # make test: a checkpoint across layouts (test_strategies, tp2 -> dp2, fsdp -> ddp2)
def test_checkpoints_reshard_between_pipeline_and_data_parallel(ray_cluster, tmp_path):
    # Constant lr: the first leg's schedule must not depend on its shorter train.steps.
    base = {**BASE, "train.lr_schedule": "constant", "train.steps": 8, "train.warmup_steps": 0}
    _, ref = run(spec_of(**base), tmp_path, "ref")
    layouts = {"pp2": {"resources.workers": 2, "parallel.pp": 2}, "dp2": {"resources.workers": 2}}
    for first, second in [("pp2", "dp2"), ("dp2", "pp2")]:
        name = f"{first}-then-{second}"
        run(spec_of(**{**base, **layouts[first], "train.steps": 4}), tmp_path, name)
        summary, steps = run(spec_of(**base, **layouts[second]), tmp_path, name)  # resumes at step 4
        assert [s["step"] for s in steps] == [5, 6, 7, 8]
        assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in ref[4:]], rel=REL)
    exported = load_file(str(tmp_path / "dp2-then-pp2" / "model.safetensors"))  # gathered from both stages
    assert set(exported) == set(build_model(spec_of(**base)).state_dict())


@pytest.mark.exhaustive  # 50 s; make test keeps pp x FSDP2's parity runs
def test_a_pp_x_fsdp_checkpoint_reshards_to_and_from_data_parallel(ray_cluster, tmp_path):
    """pp 2 x FSDP2 (dp 2) writes each stage's shards through DCP; dp 2 resumes them, and a zero 3 (dp 2)
    checkpoint resumes under pp 2 x FSDP2: the losses continue the reference's."""
    base = {**BASE, "train.lr_schedule": "constant", "train.steps": 8, "train.warmup_steps": 0}
    _, ref = run(spec_of(**base), tmp_path, "ref")
    layouts = {"pp2fsdp": {"resources.workers": 4, "parallel.pp": 2, "parallel.dp": 2, "parallel.zero": 3},
               "dp2": {"resources.workers": 2}, "fsdp2": {"resources.workers": 2, "parallel.zero": 3}}
    for first, second in [("pp2fsdp", "dp2"), ("fsdp2", "pp2fsdp")]:
        name = f"{first}-then-{second}"
        run(spec_of(**{**base, **layouts[first], "train.steps": 4}), tmp_path, name)
        summary, steps = run(spec_of(**base, **layouts[second]), tmp_path, name)  # resumes at step 4
        assert [s["step"] for s in steps] == [5, 6, 7, 8]
        assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in ref[4:]], rel=1e-4)


def test_1f1b_holds_fewer_activations_than_gpipe(ray_cluster, tmp_path):
    m = 8
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        summary, _ = run(pipeline(schedule, **{"train.global_batch_size": 4 * m, "train.steps": 3}),
                         tmp_path, schedule)
        peaks[schedule] = summary["pipeline"]["stages"]
    for g, o in zip(peaks["gpipe"], peaks["1f1b"]):
        assert g["activation_microbatches_peak"] == m  # GPipe holds every micro-batch
        assert o["activation_microbatches_peak"] <= 2  # 1F1B at most P
        assert o["activation_bytes_peak"] < g["activation_bytes_peak"] / 3
    for st in peaks["1f1b"]:  # the summary's parts of a step (bench/pipeline.py's time table) make up its wall
        parts = sum(st[f"{p}_s"] for p in ("forward", "backward", "weight_grad", "comm", "idle", "other"))
        assert parts == pytest.approx(st["wall_s"], rel=1e-6)


# --- measured bubble ---------------------------------------------------------------------------

# Compute-heavy enough that per-op Python overhead is small; 8 blocks so embedding and head
# shift the stage costs by only a few percent.
BUBBLE = {"model.n_layers": 8, "model.d_model": 128, "model.seq_len": 64, "model.n_heads": 4,
          "train.micro_batch_size": 8, "train.steps": 16, "train.lr_schedule": "constant",
          "train.warmup_steps": 0, "resources.workers": 2, "parallel.pp": 2}


# Timing assertions need the cores: descheduling on a machine running many more processes than
# it has cores adds idle time no schedule explains. These tests carry the `timing` mark, and
# `make test` runs them first, on their own, before the rest of the suite loads the machine.
timing = pytest.mark.timing


_MEASURED: dict = {}  # (schedule, m): one run's figures, shared by the timing tests of one session


def measured_bubble(tmp_path, name, schedule, m, fresh=False):
    """The median bubble over the steady steps of one run, its theory, and those steps. A run of the same
    schedule and M is measured once per session (1F1B at M = 4 is every comparison's baseline) unless
    `fresh` asks for another."""
    if (schedule, m) in _MEASURED and not fresh:
        return _MEASURED[(schedule, m)]
    spec = spec_of(**BUBBLE, **{"train.global_batch_size": BUBBLE["train.micro_batch_size"] * m,
                                "parallel.pipeline": {"schedule": schedule, "microbatches": m}})
    summary, steps = run(spec, tmp_path, name)
    steady = steps[2:]  # skip the first steps (shape inference, allocator warm-up)
    figures = (statistics.median(s["bubble_fraction"] for s in steady), summary["bubble_fraction_theoretical"],
               steady)
    _MEASURED[(schedule, m)] = figures
    return figures


def flush_bubble(step: dict, m: int) -> float:
    """GPipe/1F1B's (P-1)/(M+P-1) for stages of the busy times this step measured: the makespan is
    M micro-batches of the slowest stage plus one of each other stage (fill and drain). Equal to
    the formula on equal stages; on this CPU the last stage (head and loss) and core sharing make
    them differ by 3-12%, which the faster stage idles on top of the formula (gpipe-8: 0.15-0.17
    measured against 1/9)."""
    busy = [s["busy_s"] for s in step["stages"]]
    makespan = max(busy) + (sum(busy) - max(busy)) / m
    return statistics.fmean((makespan - b) / makespan for b in busy)


@timing
@pytest.mark.parametrize("m", [2, 4, 8])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_measured_bubble_close_to_theory(ray_cluster, tmp_path, schedule, m):
    measured, theory, steps = measured_bubble(tmp_path, f"{schedule}-{m}", schedule, m)
    assert theory == pytest.approx(1 / (m + 1))
    # The schedule reaches the makespan its formula gives for the stages as measured (12 runs here:
    # within -0.025..+0.027; gpipe-8 highest, the two transfers at its turn from forward to backward
    # are not in the formula). A schedule that serialised stages, or a meter that missed idle time,
    # would be off by far more.
    expected = statistics.median(flush_bubble(s, m) for s in steps)
    if measured != pytest.approx(expected, abs=0.05):
        # One more run: a host that descheduled a stage for part of a short run adds idle time no
        # schedule explains. A schedule or meter that is really off misses twice.
        measured, _, steps = measured_bubble(tmp_path, f"{schedule}-{m}-again", schedule, m, fresh=True)
        expected = statistics.median(flush_bubble(s, m) for s in steps)
    assert measured == pytest.approx(expected, abs=0.05)
    assert expected == pytest.approx(theory, abs=0.1)  # and the stages are close to balanced


@timing
def test_chimera_measures_lower_than_1f1b_and_close_to_its_schedule(ray_cluster, tmp_path):
    """pp 2, 4 micro-batches: 1F1B's formula gives 0.2, chimera's 0 (each rank starts one direction).
    Chimera's measured bubble is compared with its own plan simulated at the forward and backward
    costs the step measured (the paper's formula assumes F = B; here B is about 2F)."""
    m = 4
    one_f_one_b, _, _ = measured_bubble(tmp_path, "1f1b", "1f1b", m)
    chimera, theory, steps = measured_bubble(tmp_path, "chimera", "chimera", m)
    assert theory == 0.0
    assert chimera < one_f_one_b
    simulated = statistics.median(
        simulated_bubble(2, m, sum(st["forward_s"] for st in s["stages"]), sum(st["backward_s"] for st in s["stages"]))
        for s in steps)
    assert chimera == pytest.approx(simulated, abs=0.1)


@timing
def test_zero_bubble_measures_lower_than_1f1b(ray_cluster, tmp_path):
    m = 4
    one_f_one_b, _, _ = measured_bubble(tmp_path, "1f1b", "1f1b", m)
    zbv, theory, _ = measured_bubble(tmp_path, "zbv", "zbv_zero_bubble", m)
    assert theory == 0.0
    assert zbv < one_f_one_b


def test_unbalanced_split_shows_a_higher_bubble_and_rebalancing_reduces_it(ray_cluster, tmp_path):
    # Stage 0 holds the embedding and 7 of 8 blocks: the last stage idles most of every step. With a
    # rebalance threshold the supervisor re-splits by measured cost at the step-6 checkpoint.
    spec = spec_of(**{**BUBBLE, "train.steps": 14, "train.global_batch_size": 16, "train.micro_batch_size": 4,
                      "checkpoint.every_steps": 6,
                      "parallel.pipeline": {"schedule": "1f1b", "split": [7, 1], "rebalance_threshold": 0.25}})
    rec = Events()
    summary = JobRun(spec, tmp_path / "rebalance", "rebalance", listener=rec).run()
    assert summary["state"] == "SUCCEEDED", summary["error"]
    [(_, data)] = [e for e in rec.events if e[0] == "pipeline_rebalance"]
    assert data["step"] == 6 and data["split"][0] < 7 and sum(data["split"]) == 8
    assert [len(s["blocks"]) for s in summary["pipeline"]["split"]] == data["split"]  # the split in use, reported
    by_step = {s["step"]: s for s in rec.steps}  # steps 7.. replayed under the new split replace the old ones
    def median(key, steps):
        return statistics.median(key(by_step[k]) for k in steps)

    def imbalance(record):  # slowest stage's busy time over the fastest's
        busy = [s["busy_s"] for s in record["stages"]]
        return max(busy) / min(busy)

    before, after = range(2, 7), range(9, 15)
    assert median(lambda r: r["bubble_fraction"], before) > 0.3  # above the 1F1B formula's 0.2: the imbalance shows
    # Busy times move together under CPU contention, so their ratio is the robust signal; the bubble,
    # idle over wall, also carries the machine's noise (0.40 -> 0.20 on a quiet machine, 0.36 -> 0.32 at load 30).
    assert median(imbalance, after) < 0.6 * median(imbalance, before)
    assert median(lambda r: r["bubble_fraction"], after) < median(lambda r: r["bubble_fraction"], before)
    assert by_step[14]["bubble_fraction_theoretical"] == pytest.approx(0.2)

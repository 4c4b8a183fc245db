"""Pipeline parallelism: the schedule's micro-batches and stages, what stages can pass between them."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts.accounting import LayoutCost, one_pass, ring
from workers.parallel.layouts.layout import Layout
from workers.parallel.pipeline.memory import p2p_bytes, peak_rank, pipeline_peak, stage_params
from workers.spec import (
    ASYNC_SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    V_SCHEDULES,
    JobSpec,
    PipelineSpec,
    Violation,
    pipeline_microbatches,
    structure_of,
)

# pp x FSDP2 (zero 3): the single-stage schedules whose flush torch's PipelineStage ends with FSDP's reduce-scatter,
# checked against the single-process reference (tests/workers/test_pipeline.py)
SHARDED_STAGE_SCHEDULES = ("gpipe", "1f1b")


def pipeline_errors(spec: JobSpec) -> Iterator[Violation]:
    p, pipe = spec.parallel, spec.parallel.pipeline
    if p.pp > 1:
        yield from _sharded_stage_errors(spec)
    if p.mixed_precision != "fp32" and p.pp > 1:
        yield Violation("parallel.mixed_precision",
            f"parallel.mixed_precision must be 'fp32' with pipeline parallelism: the stages exchange fp32 "
            f"activations (mixed_precision={p.mixed_precision!r}, pp={p.pp})")
    if p.pp == 1:
        if pipe is not None:
            yield Violation("parallel.pipeline", f"parallel.pipeline needs parallel.pp > 1 (pp={p.pp})")
        return
    facts = structure_of(spec)
    if facts.name == "mlp":
        yield Violation("parallel.pp",
            f"parallel.pp > 1 needs a model with repeated blocks: stages are cut at block boundaries (pp={p.pp})")
        return
    if facts.tied_embeddings:
        yield Violation("model.hf.config.tie_word_embeddings",
            f"model.hf.config.tie_word_embeddings must be false with parallel.pp > 1: the input embedding lives "
            f"on the first stage and the output head on the last (pp={p.pp})")
    pipe = pipe or PipelineSpec()
    if spec.train.loss == "model":
        yield Violation("train.loss",
            f"train.loss 'model' is not available with parallel.pp > 1: only the last stage sees the outputs "
            f"and the labels stay with the first; use 'cross_entropy' (pp={p.pp})")
    for name, on in (("sequence_parallel", p.sequence_parallel),
                     ("activation_checkpointing", p.activation_checkpointing),
                     ("mixed_precision", p.mixed_precision != "fp32")):
        if on:  # stages pass replicated fp32 activations and run blocks without recomputation
            yield Violation(f"parallel.{name}",
                f"parallel.{name} is not available with pipeline parallelism yet "
                f"(pp={p.pp}, {name}={getattr(p, name)!r})")
    per_step, m, v = spec.grad_accum_steps, pipeline_microbatches(spec), pipe.stages_per_rank
    stages, layers = p.pp * v, facts.layers
    if per_step and per_step % m:
        yield Violation("parallel.pipeline.microbatches",
            f"parallel.pipeline.microbatches must divide the micro-batches per step, global_batch_size / "
            f"(dp x micro_batch_size) (microbatches={m}, global_batch_size={spec.train.global_batch_size}, "
            f"dp={spec.dp}, micro_batch_size={spec.train.micro_batch_size}, per step={per_step})")
    if pipe.schedule in SINGLE_STAGE_SCHEDULES and v != 1:
        yield Violation("parallel.pipeline.virtual_stages",
            f"parallel.pipeline.virtual_stages must be 1 for schedule {pipe.schedule!r} (virtual_stages={v})")
    if pipe.schedule in V_SCHEDULES and v != 2:
        yield Violation("parallel.pipeline.virtual_stages",
            f"parallel.pipeline.virtual_stages must be 2 for V-shaped schedule {pipe.schedule!r} (virtual_stages={v})")
    if pipe.schedule in ("1f1b", "zbv_zero_bubble") and m < p.pp:
        yield Violation("parallel.pipeline.microbatches",
            f"parallel.pipeline.microbatches must be >= parallel.pp for {pipe.schedule!r} "
            f"(microbatches={m}, pp={p.pp})")
    if pipe.schedule in ("interleaved_1f1b", "zero_bubble") and m % p.pp:
        yield Violation("parallel.pipeline.microbatches",
            f"parallel.pipeline.microbatches must be a multiple of parallel.pp for interleaved schedule "
            f"{pipe.schedule!r} (microbatches={m}, pp={p.pp})")
    if pipe.schedule == "dualpipe_v" and m < stages:
        yield Violation("parallel.pipeline.microbatches",
            f"parallel.pipeline.microbatches must be >= pp x virtual_stages for 'dualpipe_v' "
            f"(microbatches={m}, pp={p.pp}, virtual_stages={v})")
    if pipe.schedule == "chimera":
        yield from _chimera_errors(spec, m)
    if pipe.schedule in ASYNC_SCHEDULES:
        yield from _async_errors(spec, m, per_step)
    if pipe.rebalance_threshold is not None and (v != 1 or spec.checkpoint.every_steps == 0):
        yield Violation("parallel.pipeline.rebalance_threshold",
            f"parallel.pipeline.rebalance_threshold needs one stage per rank (gpipe/1f1b) and "
            f"checkpoint.every_steps > 0 (schedule={pipe.schedule!r}, virtual_stages={v}, "
            f"every_steps={spec.checkpoint.every_steps})")
    if layers is None:  # a user module: its blocks are counted when the job builds it
        return
    if pipe.split is None:
        if stages > layers + 2:
            yield Violation("parallel.pipeline",
                f"parallel.pipeline: pp x virtual_stages must be <= model.n_layers + 2, one block or the "
                f"embedding/head per stage (pp={p.pp}, virtual_stages={v}, n_layers={layers})")
        return
    split = pipe.split
    if len(split) != stages or sum(split) != layers or min(split) < 0 or 0 in split[1:-1]:
        yield Violation("parallel.pipeline.split",
            f"parallel.pipeline.split must have pp x virtual_stages entries summing to model.n_layers, "
            f"each >= 1 except the first and last stage (split={split}, pp={p.pp}, virtual_stages={v}, "
            f"n_layers={layers})")


def _chimera_errors(spec: JobSpec, m: int) -> Iterator[Violation]:
    p = spec.parallel
    if p.pp % 2:
        yield Violation("parallel.pp", f"parallel.pp must be even for schedule 'chimera': each rank holds stage r "
                                       f"of one pipeline and stage pp-1-r of the other (pp={p.pp})")
    if m % 2:
        yield Violation("parallel.pipeline.microbatches",
            f"parallel.pipeline.microbatches must be even for schedule 'chimera': they alternate between its "
            f"two pipelines (microbatches={m})")
    yield from _not_combined(spec, "chimera")


def _async_errors(spec: JobSpec, m: int, per_step: int) -> Iterator[Violation]:
    p, name = spec.parallel, spec.parallel.pipeline.schedule  # type: ignore[union-attr]
    if m != per_step:
        yield Violation("parallel.pipeline.microbatches",
            f"parallel.pipeline.microbatches must be the step's micro-batches, global_batch_size / (dp x "
            f"micro_batch_size), for {name!r}: it has no flush (microbatches={m}, per step={per_step})")
    if per_step < p.pp:
        yield Violation("train.global_batch_size",
            f"train.global_batch_size must give each step at least parallel.pp micro-batches for {name!r}, "
            f"so one weight version is owed backwards at a time (per step={per_step}, pp={p.pp})")
    r = spec.resources
    if r.elastic_range != (r.workers, r.workers):
        yield Violation("resources.min_workers",
            f"resources.min_workers and max_workers must equal resources.workers for {name!r}: the gradients a "
            f"checkpoint owes the next step belong to its ranks' data (min_workers={r.min_workers}, "
            f"workers={r.workers}, max_workers={r.max_workers})")
    yield from _not_combined(spec, name)


def _sharded_stage_errors(spec: JobSpec) -> Iterator[Violation]:
    """pp x zero: FSDP2 (zero 3) shards plain stages over dp, with schedules gpipe and 1f1b; no ZeRO-1/2."""
    p = spec.parallel
    schedule = (p.pipeline or PipelineSpec()).schedule
    if p.zero in (1, 2):
        yield Violation("parallel.zero",
            f"parallel.zero must be 0 or 3 with pipeline parallelism (zero={p.zero}, pp={p.pp})")
    elif p.zero == 3 and schedule not in SHARDED_STAGE_SCHEDULES:
        yield Violation("parallel.pipeline.schedule",
            f"parallel.zero 3 (FSDP) with pipeline parallelism runs schedules {', '.join(SHARDED_STAGE_SCHEDULES)} "
            f"only (schedule={schedule!r}, zero=3)")
    elif p.zero == 3 and p.dp_shard is not None:
        yield Violation("parallel.dp_shard", f"parallel.dp_shard (HSDP) is not available with parallel.pp > 1: "
                                             f"FSDP shards each stage over all its replicas (dp_shard={p.dp_shard}, "
                                             f"pp={p.pp})")
    elif p.zero == 3:
        for name, degree in (("tp", p.tp), ("cp", p.cp)):
            if degree > 1:
                yield Violation(f"parallel.{name}", f"parallel.{name} must be 1 with parallel.zero 3 and "
                                                    f"parallel.pp > 1 (not combined yet; {name}={degree})")


def _not_combined(spec: JobSpec, schedule: str) -> Iterator[Violation]:
    """The schedules with executors of their own (chimera, pipedream*) run one plain stage per direction."""
    p = spec.parallel
    for name, degree in (("tp", p.tp), ("cp", p.cp), ("ep", p.ep)):
        if degree > 1:
            yield Violation(f"parallel.{name}", f"parallel.{name} must be 1 with schedule {schedule!r} "
                                                f"(not combined yet; {name}={degree})")


def cost(spec: JobSpec, facts) -> LayoutCost:  # replicated stages; the planner lists pipelines, auto never picks one
    rank = peak_rank(spec, facts)  # the rank with the highest peak: its stages' parameters, its sends
    held = stage_params(spec, facts)[rank]
    state, activations = pipeline_peak(spec, facts)
    replicas = spec.dp * spec.parallel.cp  # a stage's gradients are averaged over dp x cp
    if spec.parallel.zero == 3:  # pp x FSDP2 (torch's PipelineStage: no reshard after a backward but the flush's
        # last): the blocks gathered for every micro-batch's forward and once more for the flush's backwards, the
        # stage's root once per flush; the gradients reduce-scattered once per flush
        flushes = spec.grad_accum_steps / pipeline_microbatches(spec)
        root = min(facts.outer_params / 2 * ((rank == 0) + (rank == spec.parallel.pp - 1)), held)
        gathered = (held - root) * (spec.grad_accum_steps + flushes) + root * flushes
        comm = one_pass(replicas) * 4 * (gathered + flushes * held) + p2p_bytes(spec, facts, rank)
        return LayoutCost(16 * held / replicas, comm, state, activation_bytes=activations)
    comm = ring(replicas) * 4 * held + p2p_bytes(spec, facts, rank)
    return LayoutCost(16 * held, comm, state, activation_bytes=activations)


# pp > 1 (x dp, x tp, x cp)
LAYOUT = Layout("pipeline", lambda spec: spec.parallel.pp > 1, pipeline_errors, cost)

"""Dry-run layout planner: enumerate the layouts a spec allows, predict each one's
per-rank model-state bytes, activation bytes and logical communication bytes per
step, and pick the cheapest predicted step that fits the per-worker memory budget.

The byte predictions use the same accounting the strategies are measured by
(fp32 AdamW, ring collectives, workers/parallel/metering.py), so they can be
checked against a run: tests/workers/test_strategies.py does, within 10%.
The memory predicted is the step's peak, not the state between steps: the start of the last
micro-batch's backward, with every activation of that micro-batch held, each strategy's state at
that moment (its own `cost`: optimiser state, gradients kept across micro-batches, gradient buckets,
gathered weights) and the loss's logits; bench/planner_vs_peak.py and
tests/workers/test_planner_peak.py check it against the measured peak (workers/step_memory.py).
Step time is a roofline guess: 6 x params x tokens FLOPs (8x with activation
checkpointing) at the worker's sustained rate, plus bytes over the link
bandwidth plus a latency per collective, with no overlap assumed; a pipeline's
compute is stretched by its schedule's ideal bubble.

The search covers every layout of the spec's workers the strategies run: pp = 1 layouts
(DDP, ZeRO, FSDP/HSDP, TP, each with its options; context parallelism; for an MoE model, expert
parallelism over every ep dividing dp x cp where the compatibility table lets ep compose) and
pipeline layouts (pp x tp x dp with the default schedule). `parallel: auto` chooses among the pp = 1
layouts only (AUTO_LEAVES_OUT says why). An ep layout holds 1/ep of the experts' state per rank and
pays the all-to-all (counted as the dispatch meters it), so a tight budget picks it where the
experts would not fit otherwise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from workers.parallel.activations import activation_bytes
from workers.parallel.layouts import layout_of
from workers.parallel.layouts.accounting import (
    context_parallel_comm_bytes,
    expert_parallel_comm_bytes,
    tensor_parallel_comm_bytes,
)
from workers.parallel.layouts.compatibility import composes
from workers.parallel.layouts.expert import experts_of
from workers.parallel.pipeline.bubble import spec_theoretical_bubble
from workers.spec import (
    SPEC_ERRORS,
    GPTModelSpec,
    JobSpec,
    SpecError,
    Violation,
    format_validation_error,
    sequence_length,
)
from workers.spec_checks import checked_spec

if TYPE_CHECKING:
    import torch

GIB = 1024**3
# Sustained FLOP/s of one worker and link bandwidth/latency: deliberately round guesses.
CPU_FLOPS_PER_CORE = 2.0e10
GPU_FLOPS = 4.0e14  # a bf16 H100/H200-class accelerator at ~40% MFU
CPU_LINK = (1.0e9, 2e-4)  # bytes/s, s per collective (gloo over loopback/TCP)
GPU_LINK = (1.0e11, 2e-5)  # NVLink-class

@dataclass(frozen=True)
class ModelFacts:
    params: int  # all parameters
    tp_params: int  # of which tensor parallelism shards
    layers: int = 0
    d_model: int = 0
    n_heads: int = 0
    seq_len: int = 0
    vocab: int = 0
    layernorm_params: int = 0  # of the norm layers (their grads are reduced under sequence parallelism)
    outer_params: int = 0  # outside the repeated blocks (embeddings, final norm, head): FSDP's root unit
    expert_params: int = 0  # of MoE experts (expert parallelism splits them over ep ranks)
    moe_layers: int = 0  # MoE layers (each one's dispatch sends rows by all-to-all under ep)
    experts: int = 0  # per MoE layer
    routed_per_token: float = 0.0  # expert assignments kept per token: top_k (x a capacity factor below 1)

    @classmethod
    def of(cls, spec: JobSpec) -> ModelFacts:
        """Counted on the model itself, built on the meta device (shapes only, no memory): the planner's one
        use of torch, imported here so that a GPT's prediction (workers/parallel/memory_fit.py) needs none."""
        import torch

        from workers.models import MODEL_BUILDERS
        from workers.models.description import ModelStructureError, describe_spec_model
        from workers.models.hf_moe import hf_experts_modules
        from workers.models.moe import MoE
        from workers.models.param_counts import norm_params, tp_sharded_params
        from workers.parallel.expert_parallel import expert_parameters

        with torch.device("meta"):
            model = MODEL_BUILDERS[type(spec.model)](spec.model)
        total = sum(p.numel() for p in model.parameters())
        try:
            desc = describe_spec_model(model, spec.model)
        except ModelStructureError:  # no repeated blocks (the mlp): parameters are all the planner counts
            return cls(params=total, tp_params=0, outer_params=total)
        d_model, n_heads, vocab = _dims(spec, model)
        in_blocks = sum(p.numel() for p in desc.blocks(model).parameters())
        experts = sum(p.numel() for p in expert_parameters(model)) + sum(  # built-in; HF unsharded
            e.gate_up_proj.numel() + e.down_proj.numel() for e, _ in hf_experts_modules(model))
        moe, hf = [m for m in model.modules() if isinstance(m, MoE)], hf_experts_modules(model)
        routed = (moe[0].top_k * min(1.0, moe[0].capacity_factor or 1.0) if moe
                  else float(getattr(getattr(model, "config", None), "num_experts_per_tok", 0) or 0))
        return cls(total, tp_sharded_params(model, desc.tp_plan), desc.n_blocks, d_model, n_heads,
                   sequence_length(spec) or 0, vocab, norm_params(model), total - in_blocks, experts,
                   len(moe) + len(hf), (experts_of(spec) or (0, ""))[0], routed)


def _dims(spec: JobSpec, model: torch.nn.Module) -> tuple[int, int, int]:
    """(width, attention heads, vocabulary): the gpt spec's, else the model config's (0 when unknown:
    an entrypoint model without a transformers-style config gets no activation estimate)."""
    m = spec.model
    if isinstance(m, GPTModelSpec):
        return m.d_model, m.n_heads, m.vocab_size
    config = getattr(model, "config", None)
    keys = ("hidden_size", "num_attention_heads", "vocab_size")
    hidden, heads, vocab = (int(getattr(config, k, 0) or 0) for k in keys)
    return hidden, heads, vocab


@dataclass
class Estimate:
    parallel: dict[str, Any]
    strategy: str
    model_state_bytes_per_rank: int  # between steps
    peak_state_bytes_per_rank: int  # weights, optimiser state, gradients and their buffers at the step's peak
    activation_bytes_per_rank: int  # at that peak: one micro-batch (a pipeline rank: those in flight)
    comm_bytes_per_step: int
    compute_s: float
    comm_s: float
    fits: bool = True
    note: str = ""
    auto_eligible: bool = True  # whether `parallel: auto` may choose it (pp = 1)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def memory_bytes_per_rank(self) -> int:
        """The predicted peak of a step: what the state holds then, plus one micro-batch's activations."""
        return self.peak_state_bytes_per_rank + self.activation_bytes_per_rank

    def to_dict(self) -> dict:
        return {**asdict(self), "predicted_step_s": self.step_s, "memory_bytes_per_rank": self.memory_bytes_per_rank}


def estimate(spec: JobSpec, facts: ModelFacts | None = None) -> Estimate:
    """Predicted bytes (of the rank with the highest peak) and step time of the layout `spec.parallel`."""
    f = facts or ModelFacts.of(spec)
    p, t = spec.parallel, spec.train
    tp, accum = p.tp, spec.grad_accum_steps
    strategy = layout_of(spec)
    layout = strategy.cost(spec, f)  # the layout's own accounting of state and data-parallel traffic
    state = layout.model_state_bytes
    comm = (layout.dp_comm_bytes + tensor_parallel_comm_bytes(spec, f) + context_parallel_comm_bytes(spec, f)
            + expert_parallel_comm_bytes(spec, f))
    if layout.activation_bytes is not None:  # the strategy counts its own (pipeline: micro-batches in flight)
        act = layout.activation_bytes
    else:  # the larger of two moments of the backward: its start, and a block's backward
        start, in_block = activation_bytes(spec, f)
        act = max(start, in_block + layout.block_backward_bytes)
    gpu = spec.resources.gpus_per_worker > 0
    flops_rate = (GPU_FLOPS * spec.resources.gpus_per_worker if gpu
                  else CPU_FLOPS_PER_CORE * spec.resources.cpus_per_worker)
    bandwidth, latency = GPU_LINK if gpu else CPU_LINK
    tokens = t.global_batch_size * (f.seq_len or 1)
    flops = (8 if p.activation_checkpointing else 6) * f.params * tokens / spec.world_size
    flops /= 1.0 - (spec_theoretical_bubble(spec) or 0.0)  # a pipeline's ranks idle this fraction of a flush
    collectives = (accum * (f.layers or 1) * (6 if tp > 1 else 0)) + (accum * 2 * (f.layers + 1) if p.zero == 3 else 1)
    collectives += accum * f.moe_layers * 5 if p.ep > 1 else 0  # counts, rows out and back, their gradients
    return Estimate(
        parallel=_compact(p.model_dump(mode="json")),
        strategy=strategy.name,
        model_state_bytes_per_rank=int(state),
        peak_state_bytes_per_rank=int(layout.peak_state_bytes),
        activation_bytes_per_rank=int(act),
        comm_bytes_per_step=int(comm),
        compute_s=flops / flops_rate,
        comm_s=comm / bandwidth + latency * collectives,
    )


def _compact(parallel: dict) -> dict:
    defaults = {"pipeline": None, "dp_shard": None, "cp": 1, "ep": 1, "reshard_after_forward": True,
                "offload_optimizer": False, "fsdp_accumulate": "sharded",
                "sequence_parallel": False, "activation_checkpointing": False, "mixed_precision": "fp32",
                "compression": None, "local_sgd": None, "sdp": None, "pp": 1}
    return {k: v for k, v in parallel.items() if k not in defaults or v != defaults[k]}


# --- search --------------------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_layouts(workers: int, experts: int = 0) -> list[dict]:
    """Every pp=1 layout of `workers` ranks the strategies implement, with context parallelism where a
    sequence is too long for one rank, and for a model with `experts` per MoE layer, expert parallelism
    (the spec rules prune them)."""
    out = []
    for tp in _divisors(workers):
        dp = workers // tp
        out.append({"dp": dp, "tp": tp, "zero": 0})
        if tp > 1:
            out.append({"dp": dp, "tp": tp, "zero": 0, "sequence_parallel": True})
        if dp > 1 and tp == 1:
            out += [{"dp": dp, "tp": 1, "zero": 1}, {"dp": dp, "tp": 1, "zero": 2}]
        if dp > 1:
            for shard in _divisors(dp)[1:]:
                hsdp = {} if shard == dp else {"dp_shard": shard}
                out.append({"dp": dp, "tp": tp, "zero": 3, **hsdp})
                out.append({"dp": dp, "tp": tp, "zero": 3, "reshard_after_forward": False, **hsdp})
    for cp in _divisors(workers)[1:]:  # context parallel: each sequence split over cp ranks (DDP, FSDP, tp)
        for tp in _divisors(workers // cp):
            dp = workers // (cp * tp)
            out += [{"dp": dp, "tp": tp, "cp": cp, "zero": 0}, {"dp": dp, "tp": tp, "cp": cp, "zero": 3}]
    if experts:  # ep borrows dp x cp ranks: every degree dividing it, on the layouts the table lets ep join
        out += [{**layout, "ep": ep} for layout in out if _ep_joins(layout)
                for ep in _divisors(layout["dp"] * layout.get("cp", 1))[1:] if experts % ep == 0]
    return out


def _ep_joins(layout: dict) -> bool:
    """Whether the compatibility table lets expert parallelism run with this layout's features."""
    zero = layout["zero"]
    on = [name for name, present in (
        ("zero1", zero == 1), ("zero2", zero == 2), ("fsdp", zero == 3 and "dp_shard" not in layout),
        ("hsdp", zero == 3 and "dp_shard" in layout), ("tp", layout["tp"] > 1), ("cp", layout.get("cp", 1) > 1),
        ("sequence_parallel", layout.get("sequence_parallel", False))) if present]
    return all(composes("ep", name) for name in on)


def pipeline_layouts(workers: int) -> list[dict]:
    """Every pp > 1 layout of `workers` ranks: pp stages x tp x dp, zero 0 (the pipeline strategy's only),
    with the default schedule (parallel.pipeline.schedule picks another for the same layout)."""
    return [{"dp": workers // (pp * tp), "tp": tp, "pp": pp, "zero": 0}
            for pp in _divisors(workers)[1:] for tp in _divisors(workers // pp)]


AUTO_LEAVES_OUT = ("parallel: auto does not choose a pipeline layout (pp > 1): its predicted step counts the "
                   "schedule's ideal bubble but not the stages' imbalance or their point-to-point transfers")


@dataclass
class Plan:
    chosen: Estimate | None
    candidates: list[Estimate]
    rejected: list[dict] = field(default_factory=list)  # layouts the spec rules refuse, with the reason
    memory_budget_bytes: int | None = None
    explanation: str = ""

    def to_dict(self) -> dict:
        return {
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "memory_budget_bytes": self.memory_budget_bytes,
            "explanation": self.explanation,
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected": self.rejected,
        }


def plan(data: dict | JobSpec, memory_budget_gib: float | None = None, *, pipelines: bool = True) -> Plan:
    """Rank every valid layout of the spec's workers, the pipeline ones too unless `pipelines` is False
    (`parallel: auto`, which never chooses them); `data` is a spec (its `parallel` is ignored)."""
    raw = data.model_dump(mode="json") if isinstance(data, JobSpec) else dict(data)
    raw.pop("parallel", None)
    workers = int(raw.get("resources", {}).get("workers", 1))
    budget_gib = (memory_budget_gib if memory_budget_gib is not None
                  else raw.get("resources", {}).get("memory_per_worker_gib"))
    budget = int(budget_gib * GIB) if budget_gib else None
    facts, estimates, rejected = None, [], []
    experts = _experts(raw)
    for layout in candidate_layouts(workers, experts) + (pipeline_layouts(workers) if pipelines else []):
        try:
            spec = checked_spec({**raw, "parallel": layout}, allow_fault_injection=True)
        except SPEC_ERRORS as exc:
            reason = "; ".join(e["message"] for e in format_validation_error(exc))
            rejected.append({"parallel": layout, "reason": reason})
            continue
        facts = facts or ModelFacts.of(spec)
        est = estimate(spec, facts)
        est.auto_eligible = spec.parallel.pp == 1
        if budget is not None and est.memory_bytes_per_rank > budget:
            est.fits = False
            est.note = f"needs {est.memory_bytes_per_rank / GIB:.2f} GiB per rank > budget {budget / GIB:.3g} GiB"
        estimates.append(est)
    estimates.sort(key=lambda e: (not e.fits, e.step_s, e.memory_bytes_per_rank))
    eligible = [e for e in estimates if e.auto_eligible]
    chosen = eligible[0] if eligible and eligible[0].fits else None
    return Plan(chosen, estimates, rejected, budget, _explain(chosen, eligible, budget, workers))


def _experts(raw: dict) -> int:
    """Experts per MoE layer of the spec's model (0: dense, or a model the spec rules will refuse anyway)."""
    try:
        spec = JobSpec.model_validate({**raw, "parallel": {}})
    except SPEC_ERRORS + (ValueError,):
        return 0
    return (experts_of(spec) or (0, ""))[0]


def _explain(chosen: Estimate | None, estimates: list[Estimate], budget: int | None, workers: int) -> str:
    """Why `parallel: auto` chooses what it does, among the layouts it may choose (`estimates`)."""
    if not estimates:
        return f"no layout of {workers} workers passes the spec rules"
    if chosen is None:
        assert budget is not None  # without a budget every layout that passes the rules fits
        least = min(estimates, key=lambda e: e.memory_bytes_per_rank)
        return (f"no layout fits the budget of {budget / GIB:.3g} GiB per worker; the leanest, "
                f"{_label(least)}, needs {least.memory_bytes_per_rank / GIB:.3g} GiB")
    text = (f"{_label(chosen)} ({chosen.strategy}): predicted step {chosen.step_s * 1e3:.1f} ms "
            f"(compute {chosen.compute_s * 1e3:.1f} ms + comm {chosen.comm_s * 1e3:.1f} ms for "
            f"{chosen.comm_bytes_per_step / 1e6:.2f} MB), {chosen.memory_bytes_per_rank / GIB:.3g} GiB per rank")
    text += f" within {budget / GIB:.3g} GiB" if budget else " (no memory budget given)"
    runner_up = next((e for e in estimates[1:] if e.fits), None)
    if runner_up is not None:
        text += f"; next best {_label(runner_up)} at {runner_up.step_s * 1e3:.1f} ms"
    over = sum(not e.fits for e in estimates)
    if over:
        text += f"; {over} layout(s) do not fit"
    return text


def _label(e: Estimate) -> str:
    p = e.parallel
    parts = [f"dp={p['dp']}", f"tp={p['tp']}", f"zero={p['zero']}"]
    parts += [f"{k}={v}" for k, v in p.items() if k not in ("dp", "tp", "zero") and v is not None]
    return " ".join(parts)


def resolve_auto(data: dict) -> dict:
    """The `parallel` block `parallel: auto` stands for: the plan's choice. When no layout passes the
    rules at all, the default layout, so that validation reports why."""
    result = plan(data, pipelines=False)
    chosen, eligible = result.chosen, [e for e in result.candidates if e.auto_eligible]
    if chosen is None and eligible:
        assert result.memory_budget_bytes is not None  # without a budget every layout that passes the rules fits
        least = min(eligible, key=lambda e: e.memory_bytes_per_rank)
        raise SpecError([Violation("parallel",
            f"parallel: auto found no layout of resources.workers={data.get('resources', {}).get('workers', 1)} "
            f"that fits resources.memory_per_worker_gib (budget={result.memory_budget_bytes / GIB:.3g} GiB, "
            f"leanest {_label(least)} needs {least.memory_bytes_per_rank / GIB:.3g} GiB)")])
    if chosen is None:
        return {}
    return {k: v for k, v in chosen.parallel.items() if v is not None}

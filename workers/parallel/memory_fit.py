"""Whether a job's predicted peak per worker fits the memory a worker will have: checked at submit (REST,
service/admission/submit.py) and by `trainyard validate`, so a model that can never fit is refused before
it runs instead of failing (or swapping) for minutes on the cluster.

The prediction is the planner's (planner.py `estimate`: the strategy's state at the step's peak plus one
micro-batch's activations, checked against measured peaks within 10%), fed with the model's facts: counted
analytically for the built-in GPT, so the check builds no model (a 256-layer, d_model 16384 GPT is
arithmetic, not 0.8 s of building modules on the meta device); built on the meta device for the mlp, a GPT
with its own blocks or tp_plan, and a Hugging Face model whose config the service can read (`model.hf`
model_type and config, or a readable `pretrained` directory: shapes only, no weights, cached per model).
Not predicted, and said so in the submit's answer (`memory.predicted: false` and why): a program
(`program.*`: its model is its own), an entrypoint model (`model.entrypoint`: user code is not run at
submit), a pretrained directory the service cannot read. A rank of any job that runs out of memory
fails at once with the figures instead (workers/training/out_of_memory.py).

The budget is the tightest of those known: `resources.memory_per_worker_gib`, the largest node's memory
(Ray's `memory` resource, as the control plane's cluster view reports it), or, for `trainyard validate`
without a cluster, this host's physical memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from workers.spec import GPTModelSpec, HFModelSpec, JobSpec, ModelEntrypointSpec, Violation
from workers.spec.model import hf_facts_of

GIB = 1024**3
SPEC_FIELD = "resources.memory_per_worker_gib"


@dataclass(frozen=True)
class MemoryBudget:
    bytes: int
    source: str  # the sentence naming it: "resources.memory_per_worker_gib (16 GiB)", "the largest node's memory"
    field: str  # the spec field a refusal names


def spec_budget(spec: JobSpec) -> MemoryBudget | None:
    gib = spec.resources.memory_per_worker_gib
    return MemoryBudget(int(gib * GIB), f"{SPEC_FIELD} ({gib:g} GiB)", SPEC_FIELD) if gib else None


def node_budget(largest_node_memory: float | None) -> MemoryBudget | None:
    if not largest_node_memory:
        return None
    return MemoryBudget(int(largest_node_memory), f"the largest node's memory ({_gib(largest_node_memory)})",
                        "resources")


def host_budget() -> MemoryBudget:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return MemoryBudget(total, f"this host's memory ({_gib(total)}; set {SPEC_FIELD} for the cluster's workers)",
                        "resources")


def gpt_facts(spec: JobSpec):
    """The built-in GPT's ModelFacts, counted from its shape (workers/models/gpt.py): per block two norms
    (2d each), q, k, v and the output projection (d x d + d each), the MLP (d x 4d + 4d, 4d x d + d);
    token and position embeddings, the final norm and the untied head. None for other models, or a GPT
    whose blocks or tensor-parallel plan the spec overrides (then the planner counts on the model itself)."""
    m = spec.model
    if not isinstance(m, GPTModelSpec) or m.blocks is not None or m.tp_plan is not None or m.moe is not None:
        return None  # an MoE GPT is counted on the model itself (its experts)
    from workers.parallel.planner import ModelFacts
    from workers.spec import sequence_length

    d, layers, vocab, seq = m.d_model, m.n_layers, m.vocab_size, m.seq_len
    block = 12 * d * d + 13 * d
    outer = vocab * d + seq * d + 2 * d + d * vocab
    return ModelFacts(params=layers * block + outer, tp_params=layers * (12 * d * d + 7 * d), layers=layers,
                      d_model=d, n_heads=m.n_heads, seq_len=sequence_length(spec) or 0, vocab=vocab,
                      layernorm_params=layers * 4 * d + 2 * d, outer_params=outer)


@dataclass(frozen=True)
class MemoryPrediction:
    peak_bytes: int | None  # the predicted peak per worker; None: not predicted
    params: int = 0
    estimate: Any = None  # the planner's Estimate (its state and activations)
    why_not: str = ""  # when not predicted: why


def predict(spec: JobSpec) -> MemoryPrediction:
    """The planner's predicted peak per worker (of the worker with the highest), or why there is none."""
    if spec.program is not None:
        return MemoryPrediction(None, why_not="a program's memory is its own (program): not predicted")
    if isinstance(spec.model, ModelEntrypointSpec):
        return MemoryPrediction(None, why_not="model.entrypoint is user code, not run at submit: not predicted")
    if isinstance(spec.model, HFModelSpec) and hf_facts_of(spec.model) is None:
        return MemoryPrediction(None, why_not="model.hf.pretrained is not readable by the service: not predicted")
    facts = gpt_facts(spec)
    if facts is None:
        try:
            facts = _built_facts(spec)
        except Exception as exc:  # a model the meta device cannot build: the workers will say why
            return MemoryPrediction(None, why_not=f"the model could not be built to count it ({exc}): not predicted")
    from workers.parallel.planner import estimate

    layout = estimate(spec, facts)
    return MemoryPrediction(layout.memory_bytes_per_rank, facts.params, layout)


_BUILT: dict[tuple[str, int], Any] = {}  # (the model's JSON, tokens per sample) -> its ModelFacts


def _built_facts(spec: JobSpec):
    """ModelFacts counted on the model built on the meta device (a 70 B Hugging Face model: ~3 s, once)."""
    from workers.parallel.planner import ModelFacts
    from workers.spec import sequence_length

    key = (spec.model.model_dump_json(), sequence_length(spec) or 0)
    if key not in _BUILT:
        if len(_BUILT) >= 16:  # a long-lived service sees many models: keep the recent ones
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = ModelFacts.of(spec)
    return _BUILT[key]


def predicted_peak(spec: JobSpec) -> int | None:
    """The planner's predicted peak bytes of the worker with the highest (None: not predicted here)."""
    return predict(spec).peak_bytes


def memory_view(spec: JobSpec, budgets: list[MemoryBudget | None]) -> dict[str, Any]:
    """What the submit's answer says of memory (`memory`): the predicted peak and the budget it was
    compared with, or that it was not predicted and why."""
    p = predict(spec)
    known = [b for b in budgets if b is not None]
    budget = min(known, key=lambda b: b.bytes) if known else None
    if p.peak_bytes is None:
        return {"predicted": False, "reason": p.why_not + "; a rank out of memory fails the job at once"}
    return {"predicted": True, "peak_per_worker_gib": round(p.peak_bytes / GIB, 3),
            "budget_gib": round(budget.bytes / GIB, 3) if budget else None,
            "budget": budget.source if budget else "none known (no cluster view, no resources.memory_per_worker_gib)"}


def memory_violation(spec: JobSpec, budgets: list[MemoryBudget | None]) -> Violation | None:
    """The refusal of a job whose predicted peak per worker exceeds the tightest budget known, or None."""
    known = [b for b in budgets if b is not None]
    if not known:
        return None
    p = predict(spec)
    if p.peak_bytes is None:
        return None
    budget = min(known, key=lambda b: b.bytes)
    if p.peak_bytes <= budget.bytes:
        return None
    layout = p.estimate
    return Violation(budget.field, (
        f"{budget.field}: the model ({_model_name(spec)}: {p.params / 1e9:,.2f} B parameters) needs a predicted "
        f"peak of {_gib(p.peak_bytes)} per worker under its layout ({layout.strategy}, {spec.world_size} workers: "
        f"state {_gib(layout.peak_state_bytes_per_rank)} + activations {_gib(layout.activation_bytes_per_rank)}), "
        f"more than {budget.source}: shard it further (parallel.zero: 3, tp, pp), add workers or lower "
        f"train.micro_batch_size"))


def _model_name(spec: JobSpec) -> str:
    m = spec.model
    if isinstance(m, GPTModelSpec):
        return f"gpt, {m.n_layers} layers, d_model {m.d_model}"
    if isinstance(m, HFModelSpec):
        facts = hf_facts_of(m)
        return f"hf {facts.model_type}, {facts.n_layers} layers" if facts is not None else "hf"
    return getattr(m, "name", None) or "model.entrypoint"  # the spec's words, not the section's class


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"

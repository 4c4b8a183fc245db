"""Mixture-of-Experts models (the GPT's model.moe, Hugging Face MoE configs such as Mixtral and Qwen3-MoE)
and expert parallelism (parallel.ep): what they need of the model and the layout. Which features ep
composes with is the compatibility table's (compatibility.py)."""

from __future__ import annotations

from collections.abc import Iterator

from workers.spec import GPTModelSpec, HFModelSpec, JobSpec, Violation
from workers.spec.model import hf_facts_of


def experts_of(spec: JobSpec) -> tuple[int, str] | None:
    """(experts per layer, the field that sets them) of an MoE model; None for a dense one."""
    m = spec.model
    if isinstance(m, GPTModelSpec) and m.moe is not None:
        return m.moe.experts, "model.moe.experts"
    if isinstance(m, HFModelSpec):
        facts = hf_facts_of(m)
        if facts is not None and facts.experts:
            return facts.experts, f"model.hf.config.{facts.experts_field}"
    return None


def expert_rules(spec: JobSpec) -> Iterator[Violation]:
    p = spec.parallel
    moe = experts_of(spec)
    if moe is not None:
        experts, field = moe
        # tp shards attention (and dense MLPs); the experts stay whole on each tp rank, the router replicated
        facts = hf_facts_of(spec.model) if isinstance(spec.model, HFModelSpec) else None
        plan_shards_mlp = facts is not None and facts.tp_plan_shards_mlp and spec.model.tp_plan is None
        for key, on, why in (
                ("parallel.tp", p.tp > 1 and plan_shards_mlp,
                 "the model's own tensor-parallel plan shards the MLPs the experts replace; give model.tp_plan"),
                ("parallel.pp", p.pp > 1, "each stage would see only its own layers' load-balancing loss"),
                ("parallel.sdp", p.sdp is not None, "subnetworks are cut from dense blocks")):
            if on:
                yield Violation(key, f"{key} is not available with a mixture-of-experts model yet: {why} "
                                     f"({field}={experts}, tp={p.tp}, pp={p.pp})")
    if p.ep == 1:
        return
    if moe is None:
        yield Violation("parallel.ep", f"parallel.ep > 1 needs a model with experts: model.moe on the built-in gpt "
                                       f"or a Hugging Face MoE config such as mixtral (ep={p.ep}, the model is dense)")
    elif moe[0] % p.ep:
        yield Violation("parallel.ep", f"parallel.ep must divide {moe[1]}: each ep rank holds the same number of "
                                       f"experts (ep={p.ep}, {moe[1].rsplit('.', 1)[-1]}={moe[0]})")

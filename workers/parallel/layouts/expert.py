"""Mixture-of-Experts models (model.moe) and expert parallelism (parallel.ep): what they need of the model
and the layout. Which features ep composes with is the compatibility table's (compatibility.py)."""

from __future__ import annotations

from collections.abc import Iterator

from workers.spec import GPTModelSpec, JobSpec, Violation


def expert_rules(spec: JobSpec) -> Iterator[Violation]:
    p, m = spec.parallel, spec.model
    moe = m.moe if isinstance(m, GPTModelSpec) else None
    if moe is not None:
        for field, on, why in (
                ("parallel.tp", p.tp > 1, "the GPT's tensor-parallel plan shards a dense MLP (fc, proj)"),
                ("parallel.pp", p.pp > 1, "each stage would see only its own layers' load-balancing loss"),
                ("parallel.sdp", p.sdp is not None, "subnetworks are cut from dense blocks")):
            if on:
                yield Violation(field, f"{field} is not available with model.moe yet: {why} "
                                       f"(experts={moe.experts}, tp={p.tp}, pp={p.pp})")
    if p.ep == 1:
        return
    if moe is None:
        yield Violation("parallel.ep", f"parallel.ep > 1 needs a model with experts: set model.moe on the built-in "
                                       f"gpt (ep={p.ep}, model {getattr(m, 'name', 'entrypoint')!r} is dense)")
    elif moe.experts % p.ep:
        yield Violation("parallel.ep", f"parallel.ep must divide model.moe.experts: each ep rank holds the same "
                                       f"number of experts (ep={p.ep}, experts={moe.experts})")

"""Subnetwork data parallelism: what it composes with, and whether the coverage gives connected masks."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts.accounting import (
    LayoutCost,
)
from workers.parallel.layouts.layout import Layout
from workers.parallel.sdp.feasibility import feasibility_error
from workers.spec import (
    GPTModelSpec,
    JobSpec,
    MLPModelSpec,
    SDPPeriodSpec,
    Violation,
    sdp_components,
    sdp_workers,
    structure_of,
)


def sdp_errors(spec: JobSpec) -> Iterator[Violation]:
    p, sdp, r = spec.parallel, spec.parallel.sdp, spec.resources
    if sdp is None:
        return
    if isinstance(spec.model, MLPModelSpec):
        yield Violation("parallel.sdp",
            "parallel.sdp needs a model with repeated blocks to cut subnetworks from (model 'mlp' has none): "
            "use the gpt, a model.hf or a model.entrypoint")
        return
    if sdp.mode == "neuron" and not isinstance(spec.model, GPTModelSpec):
        # Neuron masking rewrites the GPT's own MLP (fc/proj); other models' MLPs have other shapes.
        yield Violation("parallel.sdp.mode",
            f"parallel.sdp.mode 'neuron' needs the built-in gpt model, whose MLP hidden units it masks; use "
            f"mode 'block' for model {structure_of(spec).name!r} (its repeated blocks)")
        return
    if p.tp > 1 or p.pp > 1:
        yield Violation("parallel.sdp",
            f"parallel.sdp needs parallel.tp = 1 and parallel.pp = 1: each worker runs a whole subnetwork "
            f"(tp={p.tp}, pp={p.pp})")
    if p.zero not in (0, 3):
        yield Violation("parallel.sdp",
            f"parallel.sdp needs parallel.zero 0 or 3: ZeRO-1/2 shard state over all dp ranks, but each SDP "
            f"worker holds different parameters (zero={p.zero})")
    if p.compression is not None or p.local_sgd is not None:
        yield Violation("parallel.sdp",
            "parallel.sdp excludes parallel.compression and parallel.local_sgd: SDP does its own averaging "
            "among each piece's holders (use parallel.sdp.sync {period: H} for periodic averaging)")
    if p.zero == 3:
        if p.dp_shard is None or p.dp_shard < 2:
            yield Violation("parallel.sdp",
                f"parallel.sdp with parallel.zero 3 needs parallel.dp_shard >= 2: the ranks that shard one "
                f"subnetwork with FSDP (dp_shard={p.dp_shard})")
        if sdp.mode != "block" or sdp.masking != "forward":
            yield Violation("parallel.sdp",
                f"parallel.sdp with parallel.zero 3 needs mode 'block' and masking 'forward': FSDP shards whole "
                f"blocks of the subnetwork (mode={sdp.mode!r}, masking={sdp.masking!r})")
    elif p.dp_shard is not None:
        return  # the fsdp layout's rules (layouts/fsdp.py) already refuse dp_shard without zero 3
    if r.min_workers not in (None, r.workers) or r.max_workers not in (None, r.workers):
        yield Violation("parallel.sdp",
            f"parallel.sdp needs a fixed world size (resources.min_workers = max_workers = workers): the masks "
            f"and checkpoints are per worker (min_workers={r.min_workers}, workers={r.workers}, "
            f"max_workers={r.max_workers})")
    every = spec.fault_tolerance.integrity_check_every
    if isinstance(sdp.sync, SDPPeriodSpec) and every % sdp.sync.period:
        yield Violation("fault_tolerance.integrity_check_every",
            f"fault_tolerance.integrity_check_every must be a multiple of parallel.sdp.sync.period: a piece's "
            f"holders are identical only right after an average (every={every}, period={sdp.sync.period})")
    if p.zero == 3 and (p.dp_shard is None or spec.dp % p.dp_shard):
        return
    n, what = sdp_components(spec)
    if n is None:  # an entrypoint model (or an unread pretrained directory): checked when the job builds it
        return
    problem = feasibility_error(n, sdp_workers(spec), sdp.coverage, what)
    if problem:
        yield Violation("parallel.sdp.coverage",
            f"parallel.sdp.coverage is infeasible for this model ({sdp.mode} mode, coverage={sdp.coverage}): {problem}")


def cost(spec: JobSpec, facts) -> LayoutCost:  # subnetworks: bytes from the mask assignment itself
    from workers.parallel.sdp.plan import sdp_bytes  # worker 0's subnetwork on the meta device: torch

    state, comm = sdp_bytes(spec)
    return LayoutCost(state, comm, state)  # not modelled at peak yet: the between-steps state


# parallel.sdp, also with zero 3 per subnetwork
LAYOUT = Layout("sdp", lambda spec: spec.parallel.sdp is not None, sdp_errors, cost)

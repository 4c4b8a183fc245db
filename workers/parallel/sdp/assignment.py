"""The spec's SDP masks on a built model: which blocks are repeated, and which worker holds which."""

from __future__ import annotations

from torch import nn

from workers.models.description import ModelStructureError, describe_spec_model
from workers.parallel.sdp.feasibility import feasibility_error
from workers.parallel.sdp.masks import Assignment, assign
from workers.spec import GPTModelSpec, JobSpec, sdp_components, sdp_workers


def assignment_of(spec: JobSpec, n_blocks: int | None = None) -> Assignment:
    """The masks of the spec's layout; block mode over `n_blocks` (the built model's), else the spec's count."""
    sdp = spec.parallel.sdp
    assert sdp is not None  # the SDP code runs only for a spec with parallel.sdp
    n, what = sdp_components(spec, n_blocks)
    if n is None:
        raise ValueError("parallel.sdp: the number of blocks is known only from the built model; pass n_blocks")
    problem = feasibility_error(n, sdp_workers(spec), sdp.coverage, what)
    if problem:  # an entrypoint model is checked here, once built (the spec rules could not count its blocks)
        raise ModelStructureError("parallel.sdp.coverage", f"infeasible for this model ({sdp.mode} mode, "
                                                           f"coverage={sdp.coverage}): {problem}")
    if sdp.mode == "block":
        layers = 1
    else:
        assert isinstance(spec.model, GPTModelSpec)  # the spec rules allow neuron mode only on the built-in gpt
        layers = spec.model.n_layers
    return assign(sdp.mode, sdp_workers(spec), layers, n, sdp.coverage, sdp.seed)


def blocks_of(model: nn.Module, spec: JobSpec) -> str:
    """FQN of the model's repeated blocks (the GPT's 'blocks', Llama's 'model.layers', ...)."""
    return describe_spec_model(model, spec.model).blocks_path

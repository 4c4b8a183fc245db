"""Apply a tensor-parallel plan ({module FQN glob: style}) to any model, with sequence parallelism.

Styles (the spec's `model.tp_plan` values; transformers' plans use the same names):
  colwise                 Linear split by output features (whole heads of q/k/v, MLP hidden units)
  rowwise                 Linear split by input features; its output is summed over tp
  colwise_gather_output   colwise whose output is gathered whole (an LM head before the loss)
  embedding_rowwise       Embedding split by vocabulary rows; lookups summed over tp
  sequence_parallel       a norm that runs on this rank's slice of the sequence
With `sequence_parallel: true` the residual stream between blocks stays split along the
sequence: every norm outside the column/row pairs runs on 1/tp of the tokens, each sub-layer
that holds a colwise projection gathers the sequence on entry, its rowwise projection
reduce-scatters on exit, and the final norm (a norm outside the blocks) gathers it back for
the head. The blocks take the hidden state as their first positional argument.

Attention modules that keep head counts as attributes (num_heads, num_key_value_heads, ...)
get the local counts; transformers' attention reshapes with -1 and needs none.
"""

from __future__ import annotations

import fnmatch

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from workers.models.description import ModelDescription, ModelStructureError

HEAD_COUNT_ATTRIBUTES = ("num_heads", "num_key_value_heads", "num_attention_heads", "n_heads", "n_head", "n_kv_heads")


def _style(name: str, sequence_parallel: bool, in_block: bool):
    if name == "colwise":
        return ColwiseParallel()
    if name == "rowwise":  # under SP a block's rowwise output goes straight back to the sequence split
        return RowwiseParallel(output_layouts=Shard(1)) if sequence_parallel and in_block else RowwiseParallel()
    if name == "colwise_gather_output":
        return ColwiseParallel(output_layouts=Replicate())
    if name == "embedding_rowwise":
        return RowwiseParallel(input_layouts=Replicate())
    if name == "sequence_parallel":
        return SequenceParallel()
    raise ModelStructureError("model.tp_plan", f"unknown style {name!r}")


def resolve_plan(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """Concrete module FQN -> style for every module a glob matches; a glob that matches nothing is an error."""
    names = [n for n, _ in model.named_modules() if n]
    resolved: dict[str, str] = {}
    for pattern, style in plan.items():
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern) and n.count(".") == pattern.count(".")]
        if not hits:
            raise ModelStructureError("model.tp_plan", f"{pattern!r} matches no module of the model "
                                                       f"(e.g. {', '.join(names[:4])}, ...)")
        for n in hits:
            resolved[n] = style
    return resolved


def apply_tensor_plan(model: nn.Module, tp_mesh: DeviceMesh, desc: ModelDescription,
                      sequence_parallel: bool = False) -> nn.Module:
    if not desc.tp_plan:
        raise ModelStructureError("model.tp_plan", "parallel.tp > 1 needs a tensor-parallel plan and this model "
                                                   "ships none: give model.tp_plan {module FQN glob: style}")
    tp = tp_mesh.size()
    resolved = resolve_plan(model, desc.tp_plan)
    in_blocks = f"{desc.blocks_path}."
    styles = {n: _style(s, sequence_parallel, n.startswith(in_blocks)) for n, s in resolved.items()}
    if sequence_parallel:
        styles.update(_sequence_parallel_styles(model, desc, resolved))
    parallelize_module(model, tp_mesh, styles)
    if sequence_parallel:
        _gather_after_final_norms(model, desc, tp_mesh)
    _localise_head_counts(model, resolved, tp)
    return model


def _sequence_parallel_styles(model: nn.Module, desc: ModelDescription, resolved: dict[str, str]) -> dict:
    blocks = desc.blocks_path
    styles: dict = {f"{blocks}.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                                      use_local_output=True)}
    colwise_parents = {n.rsplit(".", 1)[0] for n, s in resolved.items() if s == "colwise" and "." in n}
    for name, module in model.named_modules():
        if name in resolved:
            continue
        if name in colwise_parents and name.startswith(f"{blocks}."):
            styles[name] = GatherSequence()  # attention / MLP: the whole sequence in, a split one out
        elif _is_norm(module) and not any(name.startswith(f"{p}.") for p in colwise_parents):
            styles[name] = SequenceParallel()
    return styles


def _gather_after_final_norms(model: nn.Module, desc: ModelDescription, tp_mesh: DeviceMesh) -> None:
    """A norm outside the blocks (the final one) hands the head the whole sequence again."""
    for name, module in model.named_modules():
        if _is_norm(module) and not name.startswith(f"{desc.blocks_path}."):
            module.register_forward_hook(lambda _m, _args, out: _gathered(out, tp_mesh))


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower() and any(True for _ in module.parameters(recurse=False))


class GatherSequence(ParallelStyle):
    """Gather the sequence of a module's hidden-state input, given positionally or as `hidden_states=`."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def hook(_module, args, kwargs):
            if args:
                return (_gathered(args[0], device_mesh), *args[1:]), kwargs
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": _gathered(kwargs["hidden_states"], device_mesh)}
            return None

        module.register_forward_pre_hook(hook, with_kwargs=True)
        return module


def _gathered(x, mesh: DeviceMesh):
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
    return x.redistribute(placements=[Replicate()]).to_local()


def _localise_head_counts(model: nn.Module, resolved: dict[str, str], tp: int) -> None:
    parents = {n.rsplit(".", 1)[0] for n, s in resolved.items() if s == "colwise" and "." in n}
    for name in parents:
        module = model.get_submodule(name)
        for attr in HEAD_COUNT_ATTRIBUTES:
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value % tp == 0:
                setattr(module, attr, value // tp)

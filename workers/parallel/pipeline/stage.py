"""A pipeline stage of any model with repeated blocks: the full model's own forward, restricted.

A stage is a copy of the model's module tree that shares the owned modules with the full model
and replaces the rest:
- the blocks ModuleList by `OwnedBlocks` (only this stage's blocks, under their original
  indices, so state-dict names stay `model.layers.<i>...` under any layout);
- parts before the blocks (embeddings) that another stage owns by `ZerosStandIn`, which returns
  zeros of the shape the real part returned: the model's own code then still builds positions,
  rotary tables and causal masks for this stage, and the first owned block's pre-hook swaps the
  zeros' descendant for the hidden state received from the previous stage;
- parts after the blocks (final norm, head) that another stage owns by `NotOnThisStage`: a stage
  that is not last stops after its last owned block (a forward hook raises `_StageDone`).

Only the modules on the way from the root to a replaced module are copied (shallowly), so the
stage holds no parameters but its own and adds no copies of them.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from workers.model_io import logits_of
from workers.models.description import ModelDescription
from workers.parallel.pipeline.probe import Probe, ShapeRule, first_tensor


class OwnedBlocks(nn.ModuleList):
    """Some of the blocks, in order, registered under their indices in the full model."""

    def __init__(self, blocks: dict[int, nn.Module]):
        super().__init__()
        for i in sorted(blocks):
            self.add_module(str(i), blocks[i])

    def __getitem__(self, idx):
        if isinstance(idx, slice):  # e.g. Llama's `self.layers[: config.num_hidden_layers]`: the owned ones
            return nn.ModuleList(list(self._modules.values())[idx])
        return self._modules[str(idx)]  # the full model's index


class ZerosStandIn(nn.Module):
    """In the place of a part another stage owns, called before the blocks: zeros of its output's shape."""

    def __init__(self, name: str, rule: ShapeRule):
        super().__init__()
        self.name, self.rule = name, rule

    def forward(self, *args, **kwargs) -> torch.Tensor:
        given = first_tensor(args, kwargs)
        assert given is not None, f"{self.name} was called without a tensor input (the probe saw one)"
        return torch.zeros(self.rule.shape_for(given), dtype=self.rule.dtype, device=given.device)

    def extra_repr(self) -> str:
        return f"{self.name}, held by another stage"


class NotOnThisStage(nn.Module):
    """In the place of a part another stage owns that this stage must never run."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"pipeline stage ran {self.name!r}, which another stage holds")

    def extra_repr(self) -> str:
        return f"{self.name}, held by another stage"


class _StageDone(Exception):
    """Raised by the last owned block's hook: the rest of the forward belongs to later stages."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object with its own child/parameter/hook tables, sharing every child and tensor."""
    new = copy.copy(module)
    for key, value in vars(module).items():
        if key.startswith("_") and isinstance(value, (dict, set)):
            new.__dict__[key] = copy.copy(value)
    return new


def pruned_copy(full: nn.Module, replacements: dict[str, nn.Module]) -> nn.Module:
    """`full` with the modules at the given FQNs replaced, in a copy; `full` itself is unchanged."""
    root = _shallow_copy(full)
    copied = {id(root)}
    for fqn, replacement in replacements.items():
        *path, leaf = fqn.split(".")
        node = root
        for name in path:
            child = node._modules[name]
            assert child is not None, f"{fqn}: no module at {name!r}"  # the FQNs are the model's own modules
            if id(child) not in copied:
                child = _shallow_copy(child)
                node._modules[name] = child
                copied.add(id(child))
            node = child
        node._modules[leaf] = replacement
    return root


class FullNames(nn.Module):
    """Holds a pruned copy's children at its own root, so its names are the full model's."""

    pruned: nn.Module  # set by adopt(), a plain attribute

    def adopt(self, pruned: nn.Module) -> None:
        object.__setattr__(self, "pruned", pruned)  # a plain attribute: its children are ours
        for name, child in pruned._modules.items():
            self.add_module(name, child)
        for name, buf in pruned._buffers.items():
            self.register_buffer(name, buf, persistent=name not in pruned._non_persistent_buffers_set)

    def train(self, mode: bool = True):
        super().train(mode)
        self.pruned.train(mode)  # the copied ancestors keep their own `training` flags
        return self


def replacements_for(full: nn.Module, desc: ModelDescription, probe: Probe, blocks: tuple[int, ...],
                     first: bool, last: bool, runnable: bool = True) -> dict[str, nn.Module]:
    """What a holder of `blocks` (and of the parts before/after the blocks when first/last) replaces."""
    all_blocks = desc.blocks(full)
    out: dict[str, nn.Module] = {desc.blocks_path: OwnedBlocks({i: all_blocks[i] for i in blocks})}
    if not first:
        for name in probe.parts.before:
            rule = probe.part_outputs.get(name)
            out[name] = ZerosStandIn(name, rule) if runnable and rule is not None else NotOnThisStage(name)
    if not last:
        for name in probe.parts.after:
            out[name] = NotOnThisStage(name)
    return out


class _BlocksEnd(nn.Module):
    """In an embedding-only stage, where the first block would be: the stage ends with its input."""

    def forward(self, hidden, *args, **kwargs):
        raise _StageDone(hidden)


class _ReceivedHidden(nn.Module):
    """In a head-only stage, where the last block would be: returns the hidden state received."""

    def __init__(self, received):
        super().__init__()
        self.received = received  # a callable, not a module: the stage is not this module's child

    def forward(self, *args, **kwargs):
        return self.received()


class StageModule(FullNames):
    """What torch's PipelineStage runs for one stage: input ids (first) or a hidden state in,
    the hidden state after the last owned block (or, on the last stage, the logits) out."""

    def __init__(self, full: nn.Module, desc: ModelDescription, probe: Probe, blocks: tuple[int, ...],
                 first: bool, last: bool):
        super().__init__()
        replace = replacements_for(full, desc, probe, blocks, first, last)
        if not blocks and first:  # embedding only (a pinned split of 0 blocks on the first stage)
            replace[desc.blocks_path] = OwnedBlocks({0: _BlocksEnd()})
        elif not blocks:  # head only
            replace[desc.blocks_path] = OwnedBlocks({desc.n_blocks - 1: _ReceivedHidden(lambda: self._incoming)})
        self.adopt(pruned_copy(full, replace))
        self.first, self.last, self.blocks_held = first, last, blocks
        self._probe = probe
        self._incoming: torch.Tensor | None = None
        self._running = False
        if blocks and not first:
            desc.blocks(full)[blocks[0]].register_forward_pre_hook(self._take_incoming, with_kwargs=True)
        if blocks and not last:
            desc.blocks(full)[blocks[-1]].register_forward_hook(self._stop)

    def _take_incoming(self, module, args, kwargs):
        if self._incoming is None:
            return None
        if args:
            return (self._incoming, *args[1:]), kwargs
        key = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        return args, {**kwargs, key: self._incoming}

    def _stop(self, module, args, output):
        if self._running:
            raise _StageDone(output if isinstance(output, torch.Tensor) else output[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            inputs = x
        else:
            p = self._probe
            inputs = torch.zeros((x.shape[0], *p.input_shape[1:]), dtype=p.input_dtype, device=x.device)
            self._incoming = x
        self._running = True
        try:
            return logits_of(self.pruned(inputs))
        except _StageDone as done:
            return done.hidden
        finally:
            self._incoming, self._running = None, False

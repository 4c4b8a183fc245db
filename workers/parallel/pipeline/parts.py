"""Where a model's parameters live relative to its repeated blocks, for cutting it into stages.

The parts are the top-most parameter-holding modules outside the blocks (Llama: `model.embed_tokens`,
`model.norm`, `lm_head`; GPT-2: `transformer.wte`, `transformer.wpe`, `transformer.ln_f`, `lm_head`).
A part the forward calls before the first block belongs to the first stage, one called after the
last block to the last stage. Two ways to tell which is which:

- `parts_by_call_order`: one real forward, the truth the stages are cut by;
- `parts_by_registration`: the order the modules were registered in, for cost estimates where only a
  meta-device model exists (the supervisor). Parameter-free modules (rotary tables, dropout) are not
  parts: every stage keeps and runs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from workers.models.description import ModelDescription, ModelStructureError


@dataclass(frozen=True)
class Parts:
    before: tuple[str, ...]  # FQNs, first stage
    after: tuple[str, ...]  # FQNs, last stage


def outside_parts(model: nn.Module, blocks_path: str) -> list[str]:
    """FQNs of the top-most parameter-holding modules that neither contain nor sit inside the blocks."""
    ancestors = {""} | {blocks_path.rsplit(".", i)[0] for i in range(1, blocks_path.count(".") + 1)}
    for name in ancestors:  # a parameter held directly by a container of the blocks has no stage to go to
        if model.get_submodule(name)._parameters:
            own = ", ".join(model.get_submodule(name)._parameters)
            raise ModelStructureError("model.blocks", f"module {name or '<root>'!r} holds parameters ({own}) "
                                                      f"directly beside the blocks {blocks_path!r}: move them "
                                                      f"into a submodule so that a pipeline stage can own them")
    parts = []
    for name, module in model.named_modules():
        if name in ancestors or name == blocks_path or name.startswith(blocks_path + "."):
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        if parent in ancestors and any(True for _ in module.parameters()):
            parts.append(name)
    return parts


def parts_by_call_order(model: nn.Module, desc: ModelDescription, order: list[str]) -> Parts:
    """Split the parts by when `order` (module FQNs in first-call order) first calls them."""
    index = {name: i for i, name in enumerate(order)}
    blocks = [index.get(desc.block_fqn(i)) for i in range(desc.n_blocks)]
    missing = [i for i, b in enumerate(blocks) if b is None]
    if missing:
        raise ModelStructureError("model.blocks", f"the forward pass never called blocks {missing} of "
                                                  f"{desc.blocks_path!r}: a pipeline runs every block once")
    called = [b for b in blocks if b is not None]
    first, last = min(called), max(called)
    before, after = [], []
    for name in outside_parts(model, desc.blocks_path):
        at = index.get(name, -1)  # never called: kept with the first stage, so that checkpoints still hold it
        if at < first:
            before.append(name)
        elif at > last:
            after.append(name)
        else:
            raise ModelStructureError("model.blocks", f"{name!r} is called between the blocks of "
                                                      f"{desc.blocks_path!r}: a pipeline stage cannot own it")
    return Parts(tuple(before), tuple(after))


def parts_by_registration(model: nn.Module, desc: ModelDescription) -> Parts:
    """Split the parts by whether they were registered before or after the blocks (no forward)."""
    names = [name for name, _ in model.named_modules()]
    at = names.index(desc.blocks_path)
    parts = outside_parts(model, desc.blocks_path)
    return Parts(tuple(p for p in parts if names.index(p) < at), tuple(p for p in parts if names.index(p) > at))

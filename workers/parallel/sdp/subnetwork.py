"""The rank's subnetwork of a model (block mode: any model; neuron mode: the built-in GPT) and the
map from its tensors back to the full model.

Forward masking drops what the worker does not hold: fewer blocks (block mode)
or narrower MLPs (neuron mode: fc rows and proj columns of the held hidden
units only, consistently), so parameters, gradients, optimiser state and
activations all shrink. Backward masking keeps the full forward: unheld blocks
are frozen (requires_grad False), unheld hidden units live in separate frozen
tensors, so gradients and optimiser state exist only for held components.

Every local tensor is described by `Piece`s: which rows/columns of which full
parameter it holds and which workers hold them. Synchronisation (sync.py) and
the full-model export work on pieces only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from workers.models.description import blocks_at
from workers.parallel.sdp.masks import Assignment


@dataclass(frozen=True)
class Piece:
    local: str  # parameter name inside the subnetwork
    global_name: str  # parameter name in the full model
    dim: int | None  # None: the whole tensor; else the dimension the indices select
    local_index: tuple[int, ...] | None
    global_index: tuple[int, ...] | None
    holders: tuple[int, ...]  # SDP workers holding this piece


class MaskedMLP(nn.Module):
    """The GPT MLP restricted to `held` hidden units; the others frozen (backward masking) or absent.

    Forward masking scales the held units' activations by n / k (as inverted dropout does), so the
    full model assembled from all workers is the expectation of the subnetworks it was trained as.
    """

    def __init__(self, fc: nn.Linear, proj: nn.Linear, drop: nn.Module, held: list[int], keep_frozen: bool):
        super().__init__()
        n = fc.out_features
        h = torch.tensor(held, dtype=torch.long)
        unheld = torch.tensor(sorted(set(range(n)) - set(held)), dtype=torch.long)
        self.fc_weight = nn.Parameter(fc.weight.detach()[h].clone())
        self.fc_bias = nn.Parameter(fc.bias.detach()[h].clone())
        self.proj_weight = nn.Parameter(proj.weight.detach()[:, h].clone())
        self.proj_bias = nn.Parameter(proj.bias.detach().clone())
        self.frozen = keep_frozen and len(unheld) > 0
        if self.frozen:
            self.frozen_fc_weight = nn.Parameter(fc.weight.detach()[unheld].clone(), requires_grad=False)
            self.frozen_fc_bias = nn.Parameter(fc.bias.detach()[unheld].clone(), requires_grad=False)
            self.frozen_proj_weight = nn.Parameter(proj.weight.detach()[:, unheld].clone(), requires_grad=False)
        self.scale = 1.0 if keep_frozen or len(held) == n else n / len(held)
        self.drop = drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(F.linear(x, self.fc_weight, self.fc_bias))
        if self.scale != 1.0:
            h = h * self.scale
        y = F.linear(h, self.proj_weight, self.proj_bias)
        if self.frozen:
            y = y + F.linear(F.gelu(F.linear(x, self.frozen_fc_weight, self.frozen_fc_bias)), self.frozen_proj_weight)
        return self.drop(y)


def mask_tensor(a: Assignment, worker: int) -> torch.Tensor:
    """What the checkpoint records: the held component indices, one row per layer."""
    return torch.tensor([list(a.held[layer][worker]) for layer in range(a.layers)], dtype=torch.long)


def build_subnetwork(model: nn.Module, a: Assignment, worker: int, masking: str,
                     blocks_path: str = "blocks") -> tuple[nn.Module, list[Piece]]:
    """Turn the full model (identical on every rank) into this worker's subnetwork, in place.

    Block mode works on any model through the FQN of its repeated blocks (`blocks_path`, from the
    model description); neuron mode rewrites the built-in GPT's MLPs."""
    everyone = tuple(range(a.workers))
    names = {id(p): n for n, p in model.named_parameters()}  # full-model names, before any change
    if a.mode == "block":
        blocks = blocks_at(model, blocks_path)
        if len(blocks) != a.n:
            raise ValueError(f"SDP: the mask assignment is for {a.n} blocks, the model has {len(blocks)} "
                             f"at {blocks_path!r}")
        owner: dict[str, tuple[int, ...]] = {}
        held = a.held[0][worker]
        for i, block in enumerate(blocks):
            for p in block.parameters():
                owner[names[id(p)]] = a.holders(0, i)
                if masking == "backward" and i not in held:
                    p.requires_grad_(False)
        if masking == "forward":
            # A shorter list at the same path: the model's forward runs whatever blocks it holds
            # (HF decoders slice self.layers[:num_hidden_layers], which a shorter list satisfies).
            model.set_submodule(blocks_path, nn.ModuleList(blocks[i] for i in held))
        pieces = [Piece(local, names[id(p)], None, None, None, owner.get(names[id(p)], everyone))
                  for local, p in model.named_parameters()]
        return model, pieces

    from workers.models.gpt import GPT, MLP

    if not isinstance(model, GPT):
        raise ValueError(f"parallel.sdp.mode 'neuron' needs the built-in gpt model (got {type(model).__name__})")
    pieces = []
    special = {}
    for i, block in enumerate(model.blocks):
        mlp, held = block.mlp, list(a.held[i][worker])
        assert isinstance(mlp, MLP)  # the built-in GPT's block, not yet rewritten
        prefix = f"blocks.{i}.mlp"
        block.mlp = masked = MaskedMLP(mlp.fc, mlp.proj, mlp.drop, held, keep_frozen=masking == "backward")
        unheld = sorted(set(range(a.n)) - set(held))
        for local_units, frozen in ((held, False), (unheld if masked.frozen else [], True)):
            by_holders: dict[tuple, list[tuple[int, int]]] = {}
            for j, unit in enumerate(local_units):
                by_holders.setdefault(a.holders(i, unit), []).append((j, unit))
            f = "frozen_" if frozen else ""
            for holders, pairs in by_holders.items():
                li, gi = tuple(j for j, _ in pairs), tuple(u for _, u in pairs)
                pieces += [Piece(f"{prefix}.{f}fc_weight", f"{prefix}.fc.weight", 0, li, gi, holders),
                           Piece(f"{prefix}.{f}fc_bias", f"{prefix}.fc.bias", 0, li, gi, holders),
                           Piece(f"{prefix}.{f}proj_weight", f"{prefix}.proj.weight", 1, li, gi, holders)]
            special.update({f"{prefix}.{f}fc_weight": 1, f"{prefix}.{f}fc_bias": 1, f"{prefix}.{f}proj_weight": 1})
        pieces.append(Piece(f"{prefix}.proj_bias", f"{prefix}.proj.bias", None, None, None, everyone))
        special[f"{prefix}.proj_bias"] = 1
    pieces += [Piece(n, n, None, None, None, everyone) for n, _ in model.named_parameters() if n not in special]
    return model, pieces

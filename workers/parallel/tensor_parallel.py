"""Megatron-style tensor parallelism with DTensor from the model's plan (workers/parallel/tensor_plan.py), and DP x TP.

Within a block, q/k/v and mlp.fc are column-parallel (each tp rank holds
n_heads / tp whole heads and 4d / tp hidden units) and attn.proj and mlp.proj
are row-parallel, so a block costs one all-reduce forward and one backward per
sub-layer. With `sequence_parallel` the residual stream between sub-layers is
split along the sequence: LayerNorms run on 1/tp of the tokens and the
all-reduces become all-gather + reduce-scatter pairs. Embeddings, the final
LayerNorm and the head stay replicated over tp.

Data parallelism on top (`dp > 1`, `zero: 0`) is the replicate step
(workers/parallel/data_parallel/): it all-reduces each gradient's local piece over the dp group once per step.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.models.description import ModelDescription, describe
from workers.parallel.tensor_plan import apply_tensor_plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool = False,
                          desc: ModelDescription | None = None) -> nn.Module:
    """Shard the model over `tp_mesh` in place by its plan (the spec's, the model's own, the GPT's)."""
    return apply_tensor_plan(model, tp_mesh, desc or describe(model), sequence_parallel)

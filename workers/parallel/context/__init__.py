"""Context parallelism: one sequence sharded over the cp ranks, attention as ring attention.

- chunking.py: which tokens a cp rank holds (load-balanced causal chunks) and their global positions;
- ring.py: one asynchronous hop around the cp ring (torch.distributed P2P);
- ring_attention.py: causal attention over the sharded sequence, forward and backward around the ring;
- models.py: the built-in GPT and transformers causal LMs run on a rank's shard;
- loss.py: each rank's share of the loss, and the gradient sum over the group.
"""

from workers.parallel.context.chunking import sequence_positions, shard_sequence, unshard_sequence
from workers.parallel.context.loss import all_reduce_gradients, cp_mean_loss
from workers.parallel.context.models import apply_context_parallel
from workers.parallel.context.ring_attention import ring_attention

__all__ = ["all_reduce_gradients", "apply_context_parallel", "cp_mean_loss", "ring_attention",
           "sequence_positions", "shard_sequence", "unshard_sequence"]

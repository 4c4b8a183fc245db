"""Activation bytes of one micro-batch on one rank, counted tensor by tensor for a GPT-shaped block with fused
attention (scaled_dot_product_attention keeps no score matrix) and no dropout, the way the CPU tracker and the
CUDA allocator see them (workers/step_memory.py).

In units of n = seq x micro x width elements, a block keeps: its input, both norm outputs and the attention
output's residual (4n, split by tp under sequence parallelism, where the all-gathered norm outputs, 2n, are
kept too); q, k, v, the attention output, the MLP's up projection and its GELU (12n, split by tp). After the
blocks: the final norm's input and output (2n). The loss keeps fp32 logits' log-softmax, and its backward
adds their gradient and the logits' gradient: 3 x seq x micro x vocab x 4 bytes at the start of the backward.
Under activation checkpointing a block keeps only its input and the backward recomputes one block at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.spec import JobSpec


@dataclass(frozen=True)
class MicroBatchActivations:
    """Bytes of one micro-batch; `facts` is a workers.parallel.planner.ModelFacts."""
    block: float  # one block's activations while it is not recomputed
    kept: float  # what one block keeps until its backward (`block`, or its input under checkpointing)
    stream: float  # one residual-stream tensor (a pipeline stage's input or output)
    final: float  # the final norm's input and output
    logits: float  # one fp32 logits tensor
    block_backward: float  # the MLP's gradients a block's backward adds (up-projection and GELU wide)
    # cp > 1: what ring attention holds at once beyond SDPA's (fp32), in the last block's forward as in a
    # block's backward: the key/value block held and the one arriving (and in backward their gradients
    # travelling and arriving): about 8 x one rank's keys (bench/long_context.py measures it)
    ring: float = 0.0

    @classmethod
    def of(cls, spec: JobSpec, facts) -> MicroBatchActivations:
        p = spec.parallel
        tokens = facts.seq_len // p.cp  # a context-parallel rank holds 1/cp of every sequence
        n = tokens * spec.train.micro_batch_size * facts.d_model
        half = p.mixed_precision != "fp32"
        # FSDP's mixed precision computes the blocks in 16 bits; autocast keeps norms and residuals in fp32
        # and keeps a 16-bit copy of each matmul input it casts (q, k, v and the MLP's: 4n).
        pure_half = half and p.zero == 3
        wide, narrow = (2 if pure_half else 4), (2 if half else 4)
        casts = 4 * n * 2 if half and not pure_half else 0
        split = p.tp if p.sequence_parallel else 1
        gathered = 2 * n * wide if p.sequence_parallel and not casts else 0
        block = 4 * n / split * wide + 12 * n / p.tp * narrow + casts + gathered
        kept = n / split * wide if p.activation_checkpointing else block
        return cls(block, kept, n * wide, 2 * n * wide, 4 * tokens * spec.train.micro_batch_size * facts.vocab,
                   8 * n / p.tp * narrow, 8 * n / p.tp * 4 if p.cp > 1 else 0.0)


def activation_bytes(spec: JobSpec, facts) -> tuple[float, float]:
    """(at the start of the backward, while a block runs its backward) of one micro-batch through every block;
    zero for a model without repeated blocks."""
    if not facts.layers:
        return 0.0, 0.0
    a = MicroBatchActivations.of(spec, facts)
    kept = facts.layers * a.kept
    recomputed = a.block if spec.parallel.activation_checkpointing else 0.0
    return kept + a.final + 3 * a.logits + a.ring, kept + recomputed + a.ring

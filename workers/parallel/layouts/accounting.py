"""The accounting every layout's cost is made of (bytes per parameter, ring fractions), torch-free:
the planner and the submit's memory check predict without loading a strategy."""

from __future__ import annotations

from dataclasses import dataclass

from workers.spec import JobSpec


@dataclass(frozen=True)
class LayoutCost:
    """What the planner predicts for a strategy's layout (workers/parallel/planner.py adds compute, TP traffic
    and the activations of one micro-batch)."""
    model_state_bytes: float  # per rank between steps: fp32 weights 4 + grads 4 + AdamW moments 8 bytes/param, sharded
    dp_comm_bytes: float  # per step: the data-parallel collectives' logical bytes
    # Per rank at the step's peak, when the last micro-batch's backward starts (every activation held): weights,
    # optimiser state, gradients kept from earlier micro-batches, persistent gradient buffers, gathered weights.
    peak_state_bytes: float
    # Per rank on top of that while one repeated block runs its backward (FSDP: its gathered weights, whole
    # gradients and reduce-scatter input); the peak with activation checkpointing, which recomputes a block then.
    block_backward_bytes: float = 0.0
    # Activations at the peak, where the strategy counts them itself (pipeline: micro-batches in flight per
    # schedule); None: one micro-batch through every block (workers/parallel/activations.py).
    activation_bytes: float | None = None


def accumulated_grad_bytes(spec: JobSpec) -> float:
    """Bytes per parameter of whole fp32 gradients held while a later micro-batch runs (none with one)."""
    return 4.0 if spec.grad_accum_steps > 1 else 0.0


def optimizer_state_bytes(spec: JobSpec) -> float:
    """Bytes per parameter of AdamW's moments on the worker's device (offloaded to the host on GPU)."""
    offloaded = spec.parallel.offload_optimizer and spec.resources.gpus_per_worker > 0
    return 0.0 if offloaded else 8.0


def ring(k: int) -> float:
    """Fraction of a buffer one rank sends in a ring all-reduce over k ranks."""
    return 2 * (k - 1) / k if k > 1 else 0.0


def one_pass(k: int) -> float:
    """... in one all-gather or one reduce-scatter."""
    return (k - 1) / k if k > 1 else 0.0


def params_per_rank(spec: JobSpec, facts) -> float:
    """Parameters a rank holds before any data-parallel sharding (tensor parallelism splits its plan's,
    expert parallelism the experts)."""
    experts = getattr(facts, "expert_params", 0)
    return facts.params - facts.tp_params + facts.tp_params / spec.parallel.tp - experts * (1 - 1 / spec.parallel.ep)


def kept_expert_params(spec: JobSpec, facts) -> float:
    """Expert parameters a rank holds outside FSDP: under ep > 1 its expert shards (FSDP leaves them, they are
    reduced across expert groups); without ep none (FSDP shards the experts like any parameter)."""
    return getattr(facts, "expert_params", 0) / spec.parallel.ep if spec.parallel.ep > 1 else 0.0


def tensor_parallel_comm_bytes(spec: JobSpec, f) -> float:
    """Activations of one micro-batch, A = mb x seq x d x 4 bytes, through the TP collectives per step."""
    p, tp, accum = spec.parallel, spec.parallel.tp, spec.grad_accum_steps
    if tp == 1 or not f.layers:
        return 0.0
    a = spec.train.micro_batch_size * f.seq_len // p.cp * f.d_model * 4  # a cp rank holds 1/cp of the sequence
    if p.sequence_parallel:
        # per block: forward 2 all-gathers + 2 reduce-scatters, backward 2 all-gathers + 4 input-grad
        # all-reduces (q, k, v, fc); plus the sequence split/merge at the ends and the LayerNorm grads.
        per_micro = f.layers * 14 * one_pass(tp) * a + 2 * one_pass(tp) * a
        return accum * per_micro + ring(tp) * 4 * f.layernorm_params
    # per block: forward 2 all-reduces (row-parallel outputs), backward 4 (q, k, v, fc input grads)
    return accum * f.layers * 6 * ring(tp) * a


def context_parallel_comm_bytes(spec: JobSpec, f) -> float:
    """Bytes a cp rank sends around the ring per step: per block and micro-batch, its keys and values (fp32,
    A = mb x seq/cp x d/tp x 4 each: a tp rank's heads) pass cp - 1 hops forward and again backward, and their
    gradients cp hops (the last one home): 2A x (3cp - 2). Keys and values are counted at the model width (a
    GQA model sends fewer)."""
    cp = spec.parallel.cp
    if cp == 1 or not f.layers:
        return 0.0
    a = spec.train.micro_batch_size * f.seq_len // cp * f.d_model // spec.parallel.tp * 4
    layers = f.layers / spec.parallel.pp  # a pipeline rank runs its stages' blocks only
    return spec.grad_accum_steps * layers * 2 * a * (3 * cp - 2)


def expert_parallel_comm_bytes(spec: JobSpec, f) -> float:
    """All-to-all bytes an ep rank sends per step, as its dispatch meters them (workers/parallel/expert_dispatch.py),
    with even routing assumed (the meter follows the router): per MoE layer and micro-batch forward, the other
    ranks' share of the per-expert counts (int64) and of the routed rows, out and back (T x k x (ep-1)/ep rows
    each way, d x 4 bytes a row, fewer under a capacity factor below 1); the backward sends the rows again,
    once. A forward recomputed by activation checkpointing sends its counts and rows again (it has no
    backward of its own)."""
    ep, layers = spec.parallel.ep, getattr(f, "moe_layers", 0)
    if ep == 1 or not layers:
        return 0.0
    remote = (ep - 1) / ep
    rows = 2 * spec.train.micro_batch_size * f.seq_len * f.routed_per_token * remote * f.d_model * 4
    forwards = 2 if spec.parallel.activation_checkpointing else 1
    return spec.grad_accum_steps * layers * (forwards * (f.experts * remote * 8 + rows) + rows)


def expert_shard_params(spec: JobSpec, facts) -> float:
    """Expert parameters per rank that DDP leaves out under ep: their gradients are all-reduced only across
    the dp / ep ranks holding the same shard (workers/parallel/data_parallel/replicate.py, reduce_expert_grads)."""
    ep = spec.parallel.ep
    return getattr(facts, "expert_params", 0) / ep if ep > 1 else 0.0


SIGN_KINDS = ("onebit", "signsgd")  # parallel.compression kinds that all-gather packed signs
SIGN_CHUNK = 128  # their elements per scale (workers/parallel/sign_compression.py CHUNK)


def compressed_fraction(spec) -> float:
    """Fraction of the fp32 gradient bytes the hook all-reduces (the planner's figure): the hook's bytes over
    DDP's ring all-reduce of the fp32 gradients, 2(k-1)/k x 4 bytes per parameter."""
    c = spec.parallel.compression
    if c is None:
        return 1.0
    if c.kind in ("fp16", "bf16"):
        return 0.5
    if c.kind in SIGN_KINDS:
        return _sign_fraction(spec)
    return _powersgd_fraction(spec)


def _sign_fraction(spec) -> float:
    """onebit/signsgd all-gather one message per rank: 1 bit per parameter (8 to a byte) and bf16 scales per
    piece of at most 128 elements of each tensor (onebit 2, signsgd 1). A rank sends its message to, and
    receives one from, each of the k-1 others (what a ring all-gather moves per rank, one_pass(k) of the
    gathered k messages): (k-1)(N/8 + S) bytes against DDP's 2(k-1)/k x 4N, k/64 of it plus the scales
    (onebit on 2 ranks: 1/32 + 1/128 = 1/25.6). Above 1 from about 50 ranks on: an all-gather grows with
    the world, a ring all-reduce does not."""
    import torch  # only for a sign-compression spec: the model's tensors, built on the meta device

    from workers.models import MODEL_BUILDERS

    k = spec.dims.size("dp_cp")
    if k <= 1:
        return 1.0
    with torch.device("meta"):
        model = MODEL_BUILDERS[type(spec.model)](spec.model)
    sizes = [p.numel() for p in model.parameters()]
    n, pieces = sum(sizes), sum(-(-size // SIGN_CHUNK) for size in sizes)
    scale_bytes = 2 * (2 if spec.parallel.compression.kind == "onebit" else 1) * pieces
    return (k - 1) * (n / 8 + scale_bytes) / (ring(k) * 4 * n)


def _powersgd_fraction(spec) -> float:
    """PowerSGD's P and Q factors of each matrix (rank r), vectors and small matrices whole."""
    import torch  # only for a PowerSGD spec: the matrices of the model, built on the meta device

    from workers.models import MODEL_BUILDERS

    r = spec.parallel.compression.rank
    with torch.device("meta"):
        model = MODEL_BUILDERS[type(spec.model)](spec.model)
    sent = total = 0
    for param in model.parameters():
        n = param.shape[0]
        m = param.numel() // n
        k = min(n, m, r)
        total += n * m
        sent += (n + m) * k if (n + m) * k * 2 < n * m else n * m
    return sent / total

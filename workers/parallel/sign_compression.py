"""1-bit SGD and signSGD with majority vote as DDP communication hooks: signs packed 8 to a byte.

(No `from __future__ import annotations`: DDP checks the hooks' real annotations.)

Each rank turns its bucket (plus, with error feedback, the residual it kept from the last step) into one
message: bf16 scales per piece of the bucket (each tensor cut into pieces of at most CHUNK elements), then
one sign bit per element packed into uint8. The messages are all-gathered (the ranks' signs cannot be
summed as bits), and every rank decodes all of them in rank order, so every rank computes the same
gradient bit for bit. Error feedback (parallel.compression.error_feedback) defaults to on for onebit and
off for signsgd (docs/parallel.md says why).

- onebit (Seide et al. 2014, "1-bit stochastic gradient descent and its application to data-parallel
  distributed training of speech DNNs"): a piece's elements >= 0 decode to the mean of its non-negative
  values, the others to minus the mean of their magnitudes (the reconstruction that minimises the squared
  error for the given signs); the ranks' decoded messages are averaged. The quantization error, value
  minus decoded, is the rank's residual, added to its next gradient before quantizing.
- signsgd (Bernstein et al. 2018, "signSGD with majority vote is communication efficient and fault
  tolerant"): the direction is the sign of the sum of the ranks' signs (the majority; 0 on a tie, which
  on 2 ranks is wherever they disagree); its magnitude per piece is the ranks' mean |value| averaged over
  the ranks, so that the update is as large in L1 as the averaged gradient and the learning rate tuned for
  DDP still fits. With error feedback (Karimireddy et al. 2019) a rank keeps value minus its own
  sign x scale: the vote's own loss (ties, outvoted ranks) is not fed back.

The meter counts (world - 1) messages per bucket: what one rank sends, and receives, in a ring all-gather,
the convention of the ring all-reduce's 2(k-1)/k (bytes one rank sends).
"""

import io
import weakref

import torch
import torch.distributed as dist

from workers.parallel.layouts.accounting import SIGN_CHUNK
from workers.parallel.loop_hooks import LoopHooks
from workers.storage_tracker import GRADS, note_lasting
from workers.telemetry import CommMeter, ring_allreduce_bytes

_SHIFTS = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0], dtype=torch.uint8)
SCALES_PER_PIECE = {"onebit": 2, "signsgd": 1}
# Elements per scale: each tensor of a bucket is cut into pieces of at most this many, each with its own
# scales (bf16, 2 bytes each): 128 adds 1/128 of fp32's bytes to onebit's 1/32 on 2 ranks; finer pieces
# track the gradient's magnitudes better (docs/parallel.md has the measurements that chose it).
CHUNK = SIGN_CHUNK
RESIDUALS = "residuals-rank{rank}.pt"  # in the checkpoint's directory: pruned with it
SCALE_DTYPE = torch.bfloat16  # fp32's range: a tiny gradient's scale does not flush to zero as in fp16


def pack_signs(positive: torch.Tensor) -> torch.Tensor:
    """A bool tensor (True: >= 0) as uint8, 8 elements a byte, the first in the high bit; zero-padded."""
    bits = positive.reshape(-1).to(torch.uint8)
    pad = -bits.numel() % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    return (bits.view(-1, 8) << _SHIFTS.to(bits.device)).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """pack_signs' inverse: the first `numel` bits as bool."""
    bits = (packed.unsqueeze(1) >> _SHIFTS.to(packed.device)) & 1
    return bits.reshape(-1)[:numel].bool()


def _segment_sum(values: torch.Tensor, segments: torch.Tensor, count: int) -> torch.Tensor:
    return values.new_zeros(count).index_add_(0, segments, values)


def chunked(lengths: list[int], chunk: int) -> list[int]:
    """The tensors' lengths cut into pieces of at most `chunk` elements (each piece gets its own scales)."""
    return [min(chunk, n - i) for n in lengths for i in range(0, n, chunk)]


class SignCodec:
    """Encodes one bucket's values to a message and decodes the ranks' messages: `segments` gives each element's
    piece (scales are per piece), `lengths` the pieces' element counts."""

    def __init__(self, kind: str, lengths: list[int], device: torch.device):
        self.kind, self.numel, self.pieces = kind, sum(lengths), len(lengths)
        self.lengths = torch.tensor(lengths, dtype=torch.float32, device=device)
        self.segments = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                                torch.tensor(lengths, device=device))
        self.scale_bytes = SCALE_DTYPE.itemsize * SCALES_PER_PIECE[kind] * self.pieces
        self.message_bytes = self.scale_bytes + (self.numel + 7) // 8

    def encode(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(message, what this rank's message stands for locally: its quantized values)."""
        v = values.reshape(-1).float()
        positive = v >= 0
        seg = self.segments
        if self.kind == "onebit":
            n_pos = _segment_sum(positive.float(), seg, self.pieces)
            up = _segment_sum(torch.where(positive, v, 0.0), seg, self.pieces) / n_pos.clamp(min=1)
            down = _segment_sum(torch.where(positive, 0.0, -v), seg, self.pieces) / (self.lengths - n_pos).clamp(min=1)
            scales = torch.cat([up, down]).to(SCALE_DTYPE)
        else:
            scales = (_segment_sum(v.abs(), seg, self.pieces) / self.lengths).to(SCALE_DTYPE)
        # what the message decodes to, from the rounded scales the others see (error feedback keeps the rest)
        local = self._decoded(scales.float(), positive)
        message = torch.cat([scales.view(torch.uint8), pack_signs(positive)])
        return message, local.to(values.dtype)

    def _decoded(self, scales: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
        up = scales[:self.pieces]
        down = scales[self.pieces:] if self.kind == "onebit" else up
        return torch.where(positive, up[self.segments], -down[self.segments])

    def _split(self, message: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scales = message[:self.scale_bytes].clone().view(SCALE_DTYPE).float()  # clone: an aligned copy
        return scales, unpack_signs(message[self.scale_bytes:], self.numel)

    def decode(self, messages: list[torch.Tensor]) -> torch.Tensor:
        """The ranks' messages (in rank order) as the averaged update, fp32, on every rank the same."""
        seg, world = self.segments, len(messages)
        if self.kind == "onebit":
            total = torch.zeros(self.numel, dtype=torch.float32, device=seg.device)
            for m in messages:
                total += self._decoded(*self._split(m))
            return total / world
        votes = torch.zeros(self.numel, dtype=torch.int32, device=seg.device)
        magnitude = torch.zeros(self.pieces, dtype=torch.float32, device=seg.device)
        for m in messages:
            scales, positive = self._split(m)
            votes += positive.int() * 2 - 1
            magnitude += scales
        return torch.sign(votes).float() * (magnitude / world)[seg]


class SignState:
    """The hook's state: its meter, and per DDP bucket a codec and (error feedback) the residual."""

    def __init__(self, meter: CommMeter, kind: str, error_feedback: bool):
        self.meter, self.kind, self.error_feedback = meter, kind, error_feedback
        self.crosses = False  # this rank's ring successor is on another node (compression.register_comm_hook)
        self.codecs: dict[int, SignCodec] = {}
        self.residuals: dict[int, torch.Tensor] = {}
        self.restored: dict[int, torch.Tensor] = {}  # from the checkpoint resumed, until each bucket's first use
        self.owner: weakref.ref = weakref.ref(self)  # the DDP module (register_comm_hook sets it)

    def first_residual(self, index: int, buffer: torch.Tensor) -> torch.Tensor:
        """A bucket's residual at its first use: the checkpoint's where one was restored for it, else zeros."""
        residual = torch.zeros_like(buffer)
        kept = self.restored.pop(index, None)
        if kept is not None and kept.numel() == buffer.numel():
            residual.copy_(kept.view_as(residual))
        return residual

    def codec(self, bucket: dist.GradBucket) -> SignCodec:
        buffer = bucket.buffer()
        lengths = [g.numel() for g in bucket.gradients()]
        codec = self.codecs.get(bucket.index())
        if codec is None or codec.numel != buffer.numel():  # a bucket laid out again: start it afresh
            if sum(lengths) != buffer.numel():
                lengths = [buffer.numel()]  # not one view per tensor: the bucket is one tensor
            codec = self.codecs[bucket.index()] = SignCodec(self.kind, chunked(lengths, CHUNK), buffer.device)
            self.residuals.pop(bucket.index(), None)
        return codec


def sign_hook(state: SignState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    owner = state.owner()
    note_lasting([buffer], GRADS, owner)  # the reducer's bucket lives across steps: peak memory counts it
    world = dist.get_world_size()
    codec = state.codec(bucket)
    values = buffer
    if state.error_feedback:
        residual = state.residuals.get(bucket.index())
        if residual is None:
            residual = state.residuals[bucket.index()] = state.first_residual(bucket.index(), buffer)
            note_lasting([residual], GRADS, owner)  # kept across steps, like the bucket
        values = buffer + residual
    message, local = codec.encode(values)
    if state.error_feedback:
        # What this rank's message lost, sent next step. A non-finite gradient (an fp16 overflow, which the
        # loss scaler skips) leaves a zero residual, not one that would poison every later step.
        torch.sub(values, local.view_as(values), out=residual).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    gathered = [torch.empty_like(message) for _ in range(world)]
    sent = (world - 1) * message.numel()
    state.meter.launched(sent, sent if state.crosses else 0)  # a ring all-gather: to this rank's successor
    state.meter.compressed(ring_allreduce_bytes(buffer.numel() * 4, world))
    fut = dist.all_gather(gathered, message, async_op=True).get_future()

    def decode(f: torch.futures.Future) -> torch.Tensor:
        state.meter.finished()
        buffer.copy_(codec.decode(gathered).view_as(buffer))
        return buffer

    return fut.then(decode)


class SignResiduals(LoopHooks):
    """Error feedback's residuals go with the job's checkpoints (one file per rank in the checkpoint's
    directory), so a restarted job continues bit-identically. A restart on another world size starts them
    at zero: a rank's residual is what its own messages lost."""

    def __init__(self, state: SignState):
        self.state = state

    def before_save(self, wrapped, storage, step: int, rank: int, control) -> None:
        from workers.checkpointing import checkpoint_root, step_name

        data = io.BytesIO()
        torch.save({"world": dist.get_world_size(),
                    "residuals": {i: r.detach().cpu() for i, r in self.state.residuals.items()}}, data)
        (checkpoint_root(storage) / step_name(step)).write_bytes(RESIDUALS.format(rank=rank), data.getvalue())

    def after_load(self, storage, step: int, rank: int, control) -> None:
        from workers.checkpointing import checkpoint_root, step_name

        try:
            raw = (checkpoint_root(storage) / step_name(step)).read_bytes(RESIDUALS.format(rank=rank))
        except FileNotFoundError:  # a checkpoint of another layout (or from before residuals were kept)
            return
        saved = torch.load(io.BytesIO(raw))
        if saved["world"] == dist.get_world_size():
            self.state.restored = dict(saved["residuals"])

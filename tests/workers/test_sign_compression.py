"""1-bit SGD and signSGD (workers/parallel/sign_compression.py): the packing, the codecs, and the hook's
error feedback on a one-rank gloo group (no Ray). The 2-rank jobs are in test_sign_compression_jobs.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workers.parallel.sign_compression import (
    CHUNK,
    SignCodec,
    SignState,
    chunked,
    pack_signs,
    sign_hook,
    unpack_signs,
)
from workers.telemetry import CommMeter


@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 1001])
def test_pack_then_unpack_gives_the_signs_back(n):
    signs = torch.rand(n, generator=torch.Generator().manual_seed(n)) >= 0.5
    packed = pack_signs(signs)
    assert packed.dtype == torch.uint8 and packed.numel() == (n + 7) // 8  # 8 signs a byte, really
    assert torch.equal(unpack_signs(packed, n), signs)


def test_the_first_sign_is_the_high_bit():
    signs = torch.tensor([True, False, True, False, False, False, False, True, True])
    assert pack_signs(signs).tolist() == [0b10100001, 0b10000000]


def test_tensors_are_cut_into_pieces_of_at_most_chunk_elements():
    assert chunked([5, 3, 1], 2) == [2, 2, 1, 2, 1, 1]
    assert chunked([300], CHUNK) == [128, 128, 44]


def test_onebit_scales_are_the_means_of_each_pieces_positive_and_negative_values():
    codec = SignCodec("onebit", [4, 2], torch.device("cpu"))
    values = torch.tensor([1.0, 3.0, -2.0, -4.0, 0.5, 0.25])
    message, local = codec.encode(values)
    # per piece: up 2 and down 3; the second piece has no negatives (its down scale is 0)
    assert local.tolist() == [2.0, 2.0, -3.0, -3.0, 0.375, 0.375]
    assert message.dtype == torch.uint8 and message.numel() == 2 * 2 * 2 + 1  # 4 bf16 scales + 6 bits
    assert torch.equal(codec.decode([message]), local)


def test_scales_travel_rounded_to_bf16_and_the_local_value_uses_the_rounded_ones():
    """Error feedback keeps exactly what the others did not receive: the local value is the decoded message."""
    codec = SignCodec("onebit", [3], torch.device("cpu"))
    message, local = codec.encode(torch.tensor([1.0, 1.001, -0.3]))
    assert local[0].item() == torch.tensor(1.0005).to(torch.bfloat16).item() != 1.0005
    assert torch.equal(codec.decode([message]), local)


def test_onebit_averages_the_ranks_decoded_messages():
    codec = SignCodec("onebit", [3], torch.device("cpu"))
    a, local_a = codec.encode(torch.tensor([1.0, -1.0, 2.0]))
    b, local_b = codec.encode(torch.tensor([-3.0, -1.0, 1.0]))
    assert torch.allclose(codec.decode([a, b]), (local_a + local_b) / 2)


def test_signsgd_takes_the_majority_and_the_ranks_mean_magnitude():
    codec = SignCodec("signsgd", [4], torch.device("cpu"))
    ranks = [torch.tensor([1.0, 1.0, -1.0, 1.0]), torch.tensor([2.0, -2.0, -2.0, 2.0]),
             torch.tensor([3.0, -3.0, 3.0, -3.0])]
    messages = [codec.encode(v)[0] for v in ranks]
    assert all(m.numel() == 2 + 1 for m in messages)  # one bf16 scale + 4 bits
    # votes +3, -1, -1, +1; magnitudes 1, 2, 3 -> 2
    assert codec.decode(messages).tolist() == [2.0, -2.0, -2.0, 2.0]
    # two ranks that disagree cast no vote
    assert codec.decode(messages[:2]).tolist() == [1.5, 0.0, -1.5, 1.5]


class _Bucket:
    """What the hook reads of a DDP GradBucket."""

    def __init__(self, grads: list[torch.Tensor]):
        self._buffer = torch.cat([g.reshape(-1) for g in grads])
        self.lengths = [g.numel() for g in grads]

    def buffer(self):
        return self._buffer

    def gradients(self):
        return list(torch.split(self._buffer, self.lengths))

    def index(self):
        return 0


@pytest.fixture
def one_rank_group():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _steps(kind: str, error_feedback: bool, grads: list[torch.Tensor]):
    state = SignState(CommMeter(), kind, error_feedback)
    sent = []
    for g in grads:
        bucket = _Bucket([g[:50], g[50:]])
        sent.append(sign_hook(state, bucket).wait().clone())
    return state, sent


@pytest.mark.parametrize("kind", ["onebit", "signsgd"])
def test_error_feedback_sends_every_gradient_eventually(one_rank_group, kind):
    """With error feedback, what was sent plus what is still held equals what was handed in (nothing lost)."""
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(80, generator=gen) * torch.linspace(0.01, 3.0, 80) for _ in range(12)]
    state, sent = _steps(kind, True, grads)
    assert torch.allclose(sum(sent) + state.residuals[0], sum(grads), atol=1e-5)
    assert state.residuals[0].abs().max() > 0  # quantization did lose something each step
    # the bytes: one rank sends nothing; the hook noted the fp32 all-reduce it replaced (also nothing on 1 rank)
    assert state.meter.logical_bytes == 0


@pytest.mark.parametrize("kind", ["onebit", "signsgd"])
def test_without_error_feedback_nothing_is_kept(one_rank_group, kind):
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(80, generator=gen) for _ in range(3)]
    state, sent = _steps(kind, False, grads)
    assert state.residuals == {}
    codec = SignCodec(kind, [50, 30], torch.device("cpu"))  # under CHUNK: one piece each
    for g, s in zip(grads, sent):
        assert torch.equal(s, codec.encode(g)[1])  # each step's own quantization, no memory


def test_a_non_finite_gradient_leaves_no_non_finite_residual(one_rank_group):
    """An fp16 overflow step: its decoded gradient is non-finite (the loss scaler skips it), its residual not."""
    grad = torch.ones(80)
    grad[3] = float("inf")
    state, sent = _steps("onebit", True, [grad])
    assert not torch.isfinite(sent[0]).all()
    assert torch.isfinite(state.residuals[0]).all()


def test_the_summary_reports_the_ratio_against_ddps_fp32_all_reduce():
    from service.supervisor.summary import compression_summary

    steps = [{"comm_bytes": 100, "comm_bytes_uncompressed": 3200}, {"comm_bytes": 100, "comm_bytes_uncompressed": 3200},
             {"comm_bytes": 3200, "comm_bytes_uncompressed": 3200}]  # a plain warm-up step (PowerSGD) is not the median
    assert compression_summary("onebit", steps) == {"kind": "onebit", "comm_bytes_fp32_per_step": 3200, "ratio": 32.0}
    assert compression_summary("fp16", [{"comm_bytes": 0}])["ratio"] is None  # one rank: nothing sent

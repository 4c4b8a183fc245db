"""Zero-bubble's W pass as deferred GEMMs (workers/parallel/pipeline/deferred_weight_grad.py): B leaves
the linears' weight gradients undone, W fills them in, and together they equal one full backward."""

from __future__ import annotations

import copy

import torch

from workers.models.gpt import Block
from workers.parallel.pipeline.deferred_weight_grad import DeferredWeightGrads


def test_b_then_w_gives_the_full_backwards_gradients():
    torch.manual_seed(0)
    reference = torch.nn.Sequential(Block(32, 4, 0.0), Block(32, 4, 0.0))
    deferred = copy.deepcopy(reference)
    deferral = DeferredWeightGrads(deferred)
    deferral.queue.armed = True  # as inside a scheduled B
    runners = []
    for seed in (1, 2):  # two micro-batches in flight, their W run after both B, in the other order
        x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(seed))
        reference(x).square().sum().backward()
        xd = x.clone().requires_grad_()
        deferred(xd).square().sum().backward()  # B: the input gradient and every non-linear parameter's
        assert xd.grad is not None
        assert all(m.weight.grad is None for m in deferred.modules() if isinstance(m, torch.nn.Linear))
        runners.append(deferral.build())
    for run in reversed(runners):
        run()
    for (name, p), q in zip(reference.named_parameters(), deferred.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_no_grad_forward_is_the_plain_linear_and_queues_nothing():
    layer = torch.nn.Linear(4, 3)
    deferral = DeferredWeightGrads(layer)
    with torch.no_grad():
        out = layer(torch.ones(2, 4))
    torch.testing.assert_close(out, torch.nn.functional.linear(torch.ones(2, 4), layer.weight, layer.bias))
    deferral.build()()  # an empty queue: W does nothing
    assert layer.weight.grad is None


def test_a_backward_outside_a_scheduled_b_is_an_ordinary_one():
    layer = torch.nn.Linear(4, 3)  # torch's shape inference on the first step runs such a backward
    deferral = DeferredWeightGrads(layer)
    layer(torch.ones(2, 4)).sum().backward()
    assert not deferral.queue
    torch.testing.assert_close(layer.weight.grad, torch.full((3, 4), 2.0))


def test_torchs_zero_bubble_schedule_with_the_deferral_gives_its_own_gradients(tmp_path):
    """Two stages on one gloo rank under torch's interleaved zero-bubble schedule, with and without the
    deferral: the same gradients (torch's shape inference backward on the first step included)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleavedZeroBubble

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        chunks = [torch.nn.Sequential(torch.nn.Linear(16, 32), Block(32, 4, 0.0)),
                  torch.nn.Sequential(Block(32, 4, 0.0), torch.nn.Linear(32, 16))]
        x, y = torch.randn(4, 8, 16), torch.randn(4, 8, 16)

        def gradients(defer: bool) -> list[torch.Tensor]:
            copies = copy.deepcopy(chunks)
            stages = []
            for i, chunk in enumerate(copies):
                deferral = DeferredWeightGrads(chunk) if defer else None
                stage = PipelineStage(chunk, i, 2, torch.device("cpu"), dw_builder=deferral.build if deferral else None)
                if deferral:
                    deferral.arm(stage)
                stages.append(stage)
            ScheduleInterleavedZeroBubble(stages, n_microbatches=2, loss_fn=lambda o, t: (o - t).square().mean(),
                                          scale_grads=False).step(x, target=y)
            return [p.grad for chunk in copies for p in chunk.parameters()]

        for plain, deferred in zip(gradients(False), gradients(True), strict=True):
            torch.testing.assert_close(deferred, plain, rtol=1e-5, atol=1e-7)
    finally:
        dist.destroy_process_group()

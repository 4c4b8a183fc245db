"""The zero-bubble schedules' weight-gradient pass, as the zero-bubble paper runs it: deferred GEMMs.

A zero-bubble schedule splits each micro-batch's backward into B (the input's gradient, which the
previous stage waits for) and W (the weights' gradients, which fill the bubbles). torch's default split
runs B as `autograd.grad` to the stage's inputs after walking the autograd graph in Python to group the
parameters, then W as one more `autograd.grad` per parameter group, re-entering the graph's nodes: on
this CPU B + W cost about 1.2x one full backward (docs/pipeline.md).

Here every plain `nn.Linear` of a stage computes only its input's gradient in the backward and queues
(its input, its output's gradient); the rest of the backward (norms, attention, embeddings) runs as
usual. torch's `dw_builder` hook then takes the queue of that micro-batch, and W is one GEMM (and a sum
for the bias) per queued linear: the FLOPs autograd would have spent, with no graph walk. The linears'
gradients are the same products autograd forms (tested against a full backward).
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

# The schedules that call W apart from B (backward_one_chunk(full_backward=False)).
SPLIT_BACKWARD_SCHEDULES = ("zero_bubble", "zbv_zero_bubble", "dualpipe_v")

Pending = list[tuple[nn.Linear, torch.Tensor, torch.Tensor]]  # (layer, its input, its output's gradient)


class _Queue(list):
    """A stage's deferred linears. Only a B pass of the schedule defers (`armed`): any other backward
    through the stage (torch's shape inference on the first step runs one) is an ordinary one."""

    armed = False


class _InputGradOnlyLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer, queue):
        ctx.save_for_backward(x, weight)
        ctx.layer, ctx.queue = layer, queue
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        grad_x = grad_out @ weight if ctx.needs_input_grad[0] else None
        if not ctx.queue.armed:  # an ordinary backward: autograd takes the weights' gradients as usual
            g = grad_out.reshape(-1, grad_out.shape[-1])
            grad_w = g.t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
            grad_b = g.sum(0) if ctx.needs_input_grad[2] else None
            return grad_x, grad_w, grad_b, None, None
        # A copy: autograd and the stage reuse gradient buffers (in-place accumulation, receive buffers).
        ctx.queue.append((ctx.layer, x, grad_out.clone()))
        return grad_x, None, None, None, None


def _accumulate(param: torch.Tensor, grad: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = grad
    else:
        param.grad += grad


def run_weight_grads(pending: Pending) -> None:
    """W: each queued linear's weight (and bias) gradient, accumulated as autograd would."""
    for layer, x, grad_out in pending:
        g = grad_out.reshape(-1, grad_out.shape[-1])
        _accumulate(layer.weight, g.t() @ x.reshape(-1, x.shape[-1]))
        if layer.bias is not None:
            _accumulate(layer.bias, g.sum(0))


class DeferredWeightGrads:
    """One stage's deferral: every plain nn.Linear under `module` leaves its weight gradient to W during
    the B passes `arm` marks. `build` is torch's `dw_builder` for the stage (called after each B: it
    takes that micro-batch's queue). `layers` is empty when none qualifies (a tensor-parallel weight is
    a DTensor, whose gradient stays autograd's); the stage then needs no builder."""

    def __init__(self, module: nn.Module):
        self.queue = _Queue()
        self.layers = [m for m in module.modules() if type(m) is nn.Linear and type(m.weight) is nn.Parameter]
        for layer in self.layers:
            layer.forward = types.MethodType(_deferring_forward(self.queue), layer)  # type: ignore[method-assign]

    def build(self) -> Callable[[], None]:
        pending = list(self.queue)
        self.queue.clear()
        return lambda: run_weight_grads(pending)

    def arm(self, stage) -> None:
        """Defer only inside the stage's scheduled backward calls."""
        backward, queue = stage.backward_one_chunk, self.queue

        def armed_backward(*args, **kwargs):
            queue.armed = True
            try:
                return backward(*args, **kwargs)
            finally:
                queue.armed = False

        stage.backward_one_chunk = armed_backward


def _deferring_forward(queue: _Queue):
    def forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            return F.linear(x, self.weight, self.bias)
        return _InputGradOnlyLinear.apply(x, self.weight, self.bias, self, queue)
    return forward

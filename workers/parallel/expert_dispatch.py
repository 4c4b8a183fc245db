"""Expert-parallel dispatch: rows routed to experts go to the experts' owners by all-to-all and come back
the same way (workers/parallel/expert_parallel.py installs it on the built-in MoE and on Hugging Face
experts modules alike)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from workers.parallel.metering import counted_by_caller


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with autograd: the backward sends the gradients back along the reverse splits.
    (torch.distributed.nn's is deprecated in torch 2.13 and its successor is private; both work on gloo.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, send: list[int], recv: list[int], group, sent_back=None) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group, ctx.sent_back = send, recv, group, sent_back
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))  # 16-bit rows too: gloo and NCCL carry them
        with counted_by_caller():
            dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Metered here, where it happens: a forward recomputed by activation checkpointing has no backward
        # of its own, so counting a backward per forward would count one too many.
        if ctx.sent_back is not None:
            remote = sum(ctx.recv) - ctx.recv[dist.get_rank(ctx.group)]
            ctx.sent_back(remote * (grad.numel() // max(1, grad.shape[0])) * grad.element_size())
        return _AllToAll.apply(grad.contiguous(), ctx.recv, ctx.send, ctx.group), None, None, None, None


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group, sent_back=None) -> torch.Tensor:
    """Rows x[sum(send[:r]) : sum(send[:r+1])] go to rank r; the result holds recv[r] rows from rank r.
    `sent_back(bytes)`: told, at the backward, the bytes of gradient rows it sends to other ranks."""
    return _AllToAll.apply(x, send, recv, group, sent_back)


class ExpertParallelDispatch:
    """An MoE's dispatch across the ep group: rank r owns global experts [r*L, (r+1)*L), L = E / ep.
    `moe`: anything with `local_experts` and `run_experts(xs, counts)` (an MoE, an HFExpertsRunner).

    `all_to_all_bytes`: bytes this rank sent to other ranks in its last forward (the per-expert counts
    and the token activations both ways); `step_bytes` adds the backward's gradient rows as it sends them.
    """

    def __init__(self, group, ep: int, rank: int):
        self.group, self.ep, self.rank = group, ep, rank
        self.all_to_all_bytes = 0
        self.step_bytes = 0  # since the last take: every forward's and every backward's

    def __call__(self, moe, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        local = moe.local_experts
        # 1. how many rows of each of my local experts every rank sends me: [ep, local]
        recv_counts = torch.empty_like(counts)
        with counted_by_caller():
            dist.all_to_all_single(recv_counts, counts, group=self.group)
        send = counts.view(self.ep, local).sum(1).tolist()
        recv_counts = recv_counts.view(self.ep, local)
        recv = recv_counts.sum(1).tolist()
        # 2. the rows, which arrive source-rank-major; regroup them expert-major for the expert matmuls
        arrived = all_to_all(xs, send, recv, self.group, self._sent_back)
        expert_of = torch.repeat_interleave(torch.arange(local, device=xs.device).repeat(self.ep),
                                            recv_counts.reshape(-1))
        regroup = torch.argsort(expert_of, stable=True)
        ys = moe.run_experts(arrived[regroup], recv_counts.sum(0))
        # 3. back in arrival order, and back to the ranks they came from
        back = torch.empty_like(ys).index_copy(0, regroup, ys)
        out = all_to_all(back, recv, send, self.group, self._sent_back)
        width = xs.shape[1]  # rows go in xs's dtype and come back in ys's (autocast: 16-bit expert outputs)
        remote_sent = sum(send) - send[self.rank]
        remote_returned = sum(recv) - recv[self.rank]
        rows_bytes = width * (remote_sent * xs.element_size() + remote_returned * ys.element_size())
        self.all_to_all_bytes = (counts.numel() - local) * counts.element_size() + rows_bytes
        self.step_bytes += self.all_to_all_bytes  # the backward's: _sent_back
        return out

    def _sent_back(self, nbytes: int) -> None:
        self.step_bytes += nbytes

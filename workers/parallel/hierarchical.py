"""Topology-aware gradient all-reduce (parallel.collectives 'hierarchical'): a DDP communication hook.

DDP hands the hook each bucket; flat, it is one ring all-reduce over every rank, and every hop of
the ring that leaves a node crosses the slow link. Hierarchical, from the placement's node map
(which rank is on which node, `StrategyContext.nodes`):

  1. reduce-scatter inside each node: local rank i holds its node's sum of the bucket's chunk i;
  2. all-reduce of chunk i across nodes, among the ranks of local index i (one group per index), the
     chunk passing through the cross-node compressor: only what crosses hosts is compressed;
  3. all-gather inside the node: every rank the whole averaged bucket.

Per node, 2 (N - 1) / N of the bucket crosses hosts (N nodes), split over its L ranks, against
2 (W - 1) / W of it per ring hop that leaves the node, flat (W ranks). Nodes of unequal size (a
placement of 3 + 1 ranks) have no common chunking: there each node reduces to its first rank, the
first ranks all-reduce across nodes, and broadcast back (the same bytes cross hosts, through one
rank per node). One node (every rank local) is steps 1 and 3 only; one rank per node is step 2 only.

The groups are made once per job (every rank makes every group, in one order, as new_group needs).
The three collectives of a bucket run on one thread of their own, bucket after bucket in the order
DDP hands them over (the same on every rank), so the backward goes on while they run, as under the
flat hook's asynchronous all-reduce; they use only these groups, never the one DDP itself uses.
"""

import contextlib
import math
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from workers.parallel.metered_state import MeteredState
from workers.storage_tracker import GRADS, note_lasting
from workers.telemetry import CommMeter, ring_allreduce_bytes


@dataclass(frozen=True)
class NodeMap:
    """The node of every rank, as indices in order of first appearance."""

    node_of: tuple[int, ...]

    @classmethod
    def of(cls, node_ids: Sequence[str]) -> "NodeMap":
        order = list(dict.fromkeys(node_ids))
        return cls(tuple(order.index(n) for n in node_ids))

    @property
    def nodes(self) -> int:
        return len(set(self.node_of))

    def members(self, node: int) -> list[int]:
        return [r for r, n in enumerate(self.node_of) if n == node]

    def local_index(self, rank: int) -> int:
        return self.members(self.node_of[rank]).index(rank)

    @property
    def even(self) -> bool:
        """Every node holds as many ranks."""
        return len({len(self.members(n)) for n in range(self.nodes)}) == 1


# --- what crosses nodes ---------------------------------------------------------------------------

class CrossNodeCompressor(Protocol):
    """Step 2's codec: `encode` gives the tensor the cross-node all-reduce sums (a sum of encodings must
    decode to the sum of the inputs); `decode` writes the result back into the chunk. One per job, called
    on the hook's thread bucket after bucket, so a compressor with error feedback can key its residuals on
    the bucket's index."""

    def encode(self, chunk: torch.Tensor, bucket: int) -> torch.Tensor: ...

    def decode(self, summed: torch.Tensor, chunk: torch.Tensor, bucket: int) -> None: ...

    def wire_bytes(self, chunk: torch.Tensor) -> int:
        """The bytes `encode(chunk)` puts on the wire (for the meter)."""


class Uncompressed:
    def encode(self, chunk: torch.Tensor, bucket: int) -> torch.Tensor:
        return chunk

    def decode(self, summed: torch.Tensor, chunk: torch.Tensor, bucket: int) -> None:
        if summed is not chunk:
            chunk.copy_(summed)

    def wire_bytes(self, chunk: torch.Tensor) -> int:
        return chunk.numel() * chunk.element_size()


class Cast:
    """fp16/bf16 on the wire: half the bytes; the node's partial sums (already averaged) are cast."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def encode(self, chunk: torch.Tensor, bucket: int) -> torch.Tensor:
        return chunk.to(self.dtype)

    def decode(self, summed: torch.Tensor, chunk: torch.Tensor, bucket: int) -> None:
        chunk.copy_(summed)

    def wire_bytes(self, chunk: torch.Tensor) -> int:
        return chunk.numel() * self.dtype.itemsize


# parallel.compression.kind -> the cross-node codec. PowerSGD is refused at submit (its factors are
# orthogonalised between two all-reduces of one group: it is not a codec of one summed tensor).
CROSS_NODE: dict[str | None, Callable[[], CrossNodeCompressor]] = {
    None: Uncompressed, "fp16": lambda: Cast(torch.float16), "bf16": lambda: Cast(torch.bfloat16),
}


# --- the groups, once per job --------------------------------------------------------------------

class HierarchicalGroups:
    """This rank's intra-node group and cross-node group (None where it would hold this rank alone)."""

    def __init__(self, nodes: NodeMap, rank: int) -> None:
        self.map, self.rank = nodes, rank
        members = [nodes.members(n) for n in range(nodes.nodes)]
        self.node_ranks = members[nodes.node_of[rank]]
        self.leader = self.node_ranks[0]
        self.local: dist.ProcessGroup | None = None
        self.cross: dist.ProcessGroup | None = None
        for ranks in members:  # every rank makes every group, in this order
            if len(ranks) > 1:
                group = dist.new_group(ranks)
                if rank in ranks:
                    self.local = group
        across = ([[m[i] for m in members] for i in range(len(members[0]))] if nodes.even
                  else [[m[0] for m in members]])  # uneven: the first rank of every node
        for ranks in across:
            if len(ranks) > 1:
                group = dist.new_group(ranks)
                if rank in ranks:
                    self.cross = group

    @property
    def local_size(self) -> int:
        return len(self.node_ranks)


class SerialComm:
    """One daemon thread that runs submitted work in submission order; each submission's future is set
    with its result (or its exception)."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="hierarchical-allreduce", daemon=True).start()

    def submit(self, work: Callable[[], torch.Tensor]) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        self._work.put((work, future))
        return future

    def _loop(self) -> None:
        while True:
            work, future = self._work.get()
            try:
                future.set_result(work())
            except BaseException as exc:  # noqa: BLE001 - DDP raises it where it waits on the bucket
                future.set_exception(exc)


class HierarchicalState(MeteredState):
    def __init__(self, meter: CommMeter, groups: HierarchicalGroups, codec: CrossNodeCompressor) -> None:
        super().__init__(meter)
        self.groups, self.codec, self.comm = groups, codec, SerialComm()
        self.world = len(groups.map.node_of)

    @property
    def rank_is_leader(self) -> bool:
        return self.groups.rank == self.groups.leader


def hierarchical_hook(state: HierarchicalState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    note_lasting([buffer], GRADS, state.owner())  # the reducer's bucket lives across steps: peak memory counts it
    index = bucket.index()
    reduce = _even if state.groups.map.even else _through_leaders
    state.meter.launched(*_bytes(state, buffer))

    def run() -> torch.Tensor:
        with torch.cuda.device(buffer.device) if buffer.is_cuda else contextlib.nullcontext():
            reduce(state, buffer, index)
        state.meter.finished()
        return buffer

    return state.comm.submit(run)


def _even(state: HierarchicalState, buffer: torch.Tensor, index: int) -> None:
    g, n = state.groups, buffer.numel()
    size = g.local_size
    buffer.div_(state.world)
    per = math.ceil(n / size)
    padded = buffer if per * size == n else torch.cat([buffer, buffer.new_zeros(per * size - n)])
    if g.local is not None:
        chunk = padded.new_empty(per)
        dist.reduce_scatter_tensor(chunk, padded, group=g.local)  # local index i: the node's sum of chunk i
    else:
        chunk = padded
    if g.cross is not None:
        sent = state.codec.encode(chunk, index)
        dist.all_reduce(sent, group=g.cross)  # chunk i across nodes, among the ranks of local index i
        state.codec.decode(sent, chunk, index)
    if g.local is not None:
        dist.all_gather_into_tensor(padded, chunk, group=g.local)
    if padded is not buffer:
        buffer.copy_(padded[:n])


def _through_leaders(state: HierarchicalState, buffer: torch.Tensor, index: int) -> None:
    """Nodes of unequal size: reduce to the node's first rank, all-reduce among first ranks, broadcast."""
    g = state.groups
    buffer.div_(state.world)
    if g.local is not None:
        dist.reduce(buffer, dst=g.leader, group=g.local)
    if g.cross is not None:
        sent = state.codec.encode(buffer, index)
        dist.all_reduce(sent, group=g.cross)
        state.codec.decode(sent, buffer, index)
    if g.local is not None:
        dist.broadcast(buffer, src=g.leader, group=g.local)


def _bytes(state: HierarchicalState, buffer: torch.Tensor) -> tuple[int, int]:
    """(bytes this rank sends, of which to other nodes), as the collectives are modelled: ring reduce-scatter
    and all-gather, (L - 1) chunks each; the cross-node ring all-reduce, 2 (N - 1) / N of the encoded chunk;
    with uneven nodes, a follower sends its bucket once to the leader (the reduce), the leader its result once
    to each follower (the broadcast) and the cross-node all-reduce's share."""
    g, element = state.groups, buffer.element_size()
    nodes = g.map.nodes
    if g.map.even:
        per = math.ceil(buffer.numel() / g.local_size)
        cross = ring_allreduce_bytes(state.codec.wire_bytes(buffer[:per]), nodes)
        return 2 * (g.local_size - 1) * per * element + cross, cross
    if state.rank_is_leader:
        cross = ring_allreduce_bytes(state.codec.wire_bytes(buffer), nodes)
        return (g.local_size - 1) * buffer.numel() * element + cross, cross
    return buffer.numel() * element, 0


def hierarchical(ctx, kind: str | None) -> tuple[HierarchicalState, Callable]:
    """The state and hook for a job's DDP: its groups, from the placement's node map (one node where the
    context has none: a job on one machine)."""
    nodes = NodeMap.of(ctx.nodes or ["local"] * ctx.world_size)
    return HierarchicalState(ctx.comm, HierarchicalGroups(nodes, ctx.rank), CROSS_NODE[kind]()), hierarchical_hook

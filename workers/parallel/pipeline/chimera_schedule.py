"""Chimera's bidirectional schedule (Li & Hoefler, SC'21, arXiv:2107.06925), as per-rank operation lists.

Two pipelines of P stages run over the same P ranks in opposite directions: the "down" pipeline has
stage s on rank s, the "up" pipeline stage s on rank P-1-s, so every rank holds one stage of each
(two model replicas in all, each stage's pair of copies synchronized by a gradient all-reduce). A
flush's M micro-batches alternate: even ones go down, odd ones up. Each rank interleaves the two
pipelines' work so that one fills the other's bubbles.

The order is found by simulating the flush with per-operation costs (forward F, backward B): every
rank takes, whenever it is free, the ready operation that can start first, a backward before a
forward, and at most P-s forwards in flight per pipeline at stage s (1F1B's bound, which spreads
activation memory evenly: rank r holds down stage r and up stage P-1-r, P+1 micro-batches at most).
Executing each rank's list in order with sends that do not block cannot deadlock: every receive's
sender runs earlier in the simulation. The messages between two ranks are also given one order both
sides issue them in (by simulated send time), which NCCL's per-pair streams need.

The paper's bubble ratio for D stages and N micro-batches, counting F = B, is (D-2) / (2N + D-2)
(its Table 2). This schedule reaches it exactly at F = B when N is a multiple of D (tested for D up to
8); `simulated_bubble` gives its bubble for other costs (B = 2F: 0.25 at D = N = 4 against 0.2).
No torch here: the strategy (chimera.py) runs the lists.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import IntEnum


class Pipe(IntEnum):
    DOWN = 0
    UP = 1


@dataclass(frozen=True, order=True)
class Op:
    kind: str  # "F" (forward, and the loss on the last stage) or "B" (backward)
    pipe: Pipe
    stage: int
    micro: int  # the micro-batch's index in the flush


@dataclass(frozen=True)
class Message:
    """An activation (after F) or an input gradient (after B) from one rank to a neighbour."""

    producer: Op
    src: int
    dst: int
    time: float  # simulated send time (the producer's finish): orders a pair's messages on both sides

    @property
    def tag(self) -> int:
        """A tag unique between two ranks within a flush (gloo matches by it)."""
        p = self.producer
        return ((p.micro * 2 + int(p.pipe)) * 2 + (p.kind == "B")) * 1024 + p.stage


@dataclass(frozen=True)
class ChimeraPlan:
    pp: int
    microbatches: int
    ops: tuple[tuple[Op, ...], ...]  # per rank, in execution order
    start: dict[Op, float]  # simulated start of each op
    finish: dict[Op, float]
    makespan: float

    def sends_after(self, op: Op) -> Message | None:
        return _message(self, op)

    def in_flight_peaks(self) -> list[int]:
        """Per rank, the most micro-batches (of either direction) between their forward and backward there."""
        peaks = []
        for ops in self.ops:
            held = peak = 0
            for op in ops:
                held += 1 if op.kind == "F" else -1
                peak = max(peak, held)
            peaks.append(peak)
        return peaks

    def needs(self, op: Op) -> Op | None:
        """The op on another rank whose message `op` waits for (None: its input is local)."""
        before = _depends_on(op, self.pp)
        return before if before is not None and rank_of(before, self.pp) != rank_of(op, self.pp) else None


def rank_of(op: Op, pp: int) -> int:
    return op.stage if op.pipe == Pipe.DOWN else pp - 1 - op.stage


def pipe_of(micro: int) -> Pipe:
    """Alternating (not halves): the greedy order then reaches the paper's bubble; halves do not."""
    return Pipe(micro % 2)


def paper_bubble(pp: int, microbatches: int) -> float:
    """(D-2) / (2N + D-2): Chimera's bubble ratio, F = B (Li & Hoefler 2021, Table 2)."""
    return (pp - 2) / (2 * microbatches + pp - 2) if pp > 1 else 0.0


def _depends_on(op: Op, pp: int) -> Op | None:
    """The one op whose output `op` consumes (a backward also needs its own forward, on its rank)."""
    if op.kind == "F":
        return Op("F", op.pipe, op.stage - 1, op.micro) if op.stage > 0 else None
    return Op("B", op.pipe, op.stage + 1, op.micro) if op.stage < pp - 1 else Op("F", op.pipe, op.stage, op.micro)


def _message(plan: ChimeraPlan, op: Op) -> Message | None:
    pp = plan.pp
    if op.kind == "F" and op.stage < pp - 1:
        nxt = Op("F", op.pipe, op.stage + 1, op.micro)
    elif op.kind == "B" and op.stage > 0:
        nxt = Op("B", op.pipe, op.stage - 1, op.micro)
    else:
        return None
    src, dst = rank_of(op, pp), rank_of(nxt, pp)
    return Message(op, src, dst, plan.finish[op]) if src != dst else None


@functools.lru_cache(maxsize=64)  # the planner and every step of a job ask for the same few plans
def build(pp: int, microbatches: int, forward_cost: float = 1.0, backward_cost: float = 2.0) -> ChimeraPlan:
    if pp < 2 or pp % 2:
        raise ValueError(f"chimera needs an even number of pipeline stages >= 2 (pp={pp})")
    if microbatches < 2 or microbatches % 2:
        raise ValueError(f"chimera needs an even number of micro-batches per flush (got {microbatches})")
    todo = {Op(kind, pipe_of(m), s, m)
            for m in range(microbatches) for s in range(pp) for kind in ("F", "B")}
    finish: dict[Op, float] = {}
    start: dict[Op, float] = {}
    free = [0.0] * pp
    in_flight: dict[tuple[Pipe, int], int] = {}
    order: list[list[Op]] = [[] for _ in range(pp)]
    cost = {"F": forward_cost, "B": backward_cost}
    while todo:
        best: tuple[float, int, int, Op] | None = None
        for op in todo:
            deps = [d for d in (_depends_on(op, pp), Op("F", op.pipe, op.stage, op.micro) if op.kind == "B" else None)
                    if d is not None]
            if any(d not in finish for d in deps):
                continue
            if op.kind == "F" and in_flight.get((op.pipe, op.stage), 0) >= pp - op.stage:
                continue
            rank = rank_of(op, pp)
            begin = max([free[rank], *(finish[d] for d in deps)])
            key = (begin, op.kind != "B", op.micro, op)
            if best is None or key < best:
                best = key
        assert best is not None, "chimera schedule: no operation is ready (a dependency cycle)"
        begin, _, _, op = best
        rank = rank_of(op, pp)
        start[op], finish[op] = begin, begin + cost[op.kind]
        free[rank] = finish[op]
        place = (op.pipe, op.stage)
        in_flight[place] = in_flight.get(place, 0) + (1 if op.kind == "F" else -1)
        order[rank].append(op)
        todo.remove(op)
    return ChimeraPlan(pp, microbatches, tuple(tuple(ops) for ops in order), start, finish, max(finish.values()))


def simulated_bubble(pp: int, microbatches: int, forward_cost: float, backward_cost: float) -> float:
    """The idle fraction of this schedule's makespan, averaged over ranks, for the given op costs."""
    plan = build(pp, microbatches, forward_cost, backward_cost)
    busy = microbatches * (forward_cost + backward_cost)  # every rank runs one stage of each micro-batch
    return (plan.makespan - busy) / plan.makespan


def pair_order(plan: ChimeraPlan) -> dict[tuple[int, int], list[Message]]:
    """Every message between two ranks (key: the pair, low rank first), in the order both issue them."""
    pairs: dict[tuple[int, int], list[Message]] = {}
    for ops in plan.ops:
        for op in ops:
            msg = plan.sends_after(op)
            if msg is not None:
                pairs.setdefault((min(msg.src, msg.dst), max(msg.src, msg.dst)), []).append(msg)
    for messages in pairs.values():  # a receiver posts early, never late: sorting by send time is
        messages.sort(key=lambda m: (m.time, m.tag))  # consistent with what either side must do first
    return pairs

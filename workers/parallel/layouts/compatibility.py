"""Which parallel features compose: one table of data. A pair listed here is refused (its reason says
why); a pair not listed is supported. The context-parallel refusals (the 422s) come from it
(`compatibility_violations`); the older layouts' own rules refuse the same pairs with their own messages
(tests/workers/test_compatibility.py checks both directions), and docs/parallel.md's matrix is
`matrix_markdown()` (the same test checks the page holds it)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from workers.spec import JobSpec, Violation

# feature -> (the field that turns it on, whether a spec has it)
FEATURES: dict[str, tuple[str, Callable[[JobSpec], bool]]] = {
    "zero1": ("parallel.zero", lambda s: s.parallel.zero == 1),
    "zero2": ("parallel.zero", lambda s: s.parallel.zero == 2),
    "fsdp": ("parallel.zero", lambda s: s.parallel.zero == 3 and s.parallel.dp_shard is None),
    "hsdp": ("parallel.dp_shard", lambda s: s.parallel.zero == 3 and s.parallel.dp_shard is not None),
    "tp": ("parallel.tp", lambda s: s.parallel.tp > 1),
    "sequence_parallel": ("parallel.sequence_parallel", lambda s: s.parallel.sequence_parallel),
    "pp": ("parallel.pp", lambda s: s.parallel.pp > 1),
    "cp": ("parallel.cp", lambda s: s.parallel.cp > 1),
    "ep": ("parallel.ep", lambda s: s.parallel.ep > 1),
    "compression": ("parallel.compression", lambda s: s.parallel.compression is not None),
    "hierarchical": ("parallel.collectives", lambda s: s.parallel.collectives == "hierarchical"),
    "local_sgd": ("parallel.local_sgd", lambda s: s.parallel.local_sgd is not None),
    "sdp": ("parallel.sdp", lambda s: s.parallel.sdp is not None),
    "activation_checkpointing": ("parallel.activation_checkpointing", lambda s: s.parallel.activation_checkpointing),
    "mixed_precision": ("parallel.mixed_precision", lambda s: s.parallel.mixed_precision != "fp32"),
    "compile": ("train.compile", lambda s: s.train.compile),
    # the straggler policy that re-splits the batch: it needs a step that takes uneven shares
    "rebalance": ("supervisor.straggler.policy", lambda s: s.supervisor.straggler.needs_uneven_shares),
}

_DDP_HOOK = "compression is a DDP communication hook: plain data parallelism only"
_AVERAGES = "local SGD averages parameters of whole replicas: plain data parallelism only"
_SHARES = "straggler rebalancing gives data-parallel ranks uneven micro-batch counts"
_STAGES = ("pipeline stages pass replicated fp32 activations; their replicas hold whole stages or, under zero 3 "
           "(gpipe, 1f1b), FSDP shards over all of dp")
_SUBNETS = "each SDP worker trains its own subnetwork of whole blocks"
_EP_DP = "expert shards are reduced beside the data-parallel step's gradients: DDP, FSDP and tp only so far"
_CP_DP = "context-parallel ranks reduce gradients with data parallelism over dp x cp: DDP, FSDP/HSDP and tp so far"
_METERED = ("tp's collectives are counted by a TorchDispatchMode, under which compiled blocks would silently run "
            "eager")
_UNCOMPILED = "its blocks are not built by parallelize, which compiles them"
_HIERARCHICAL = ("hierarchical collectives are DDP's communication hook over every rank: plain data parallelism "
                 "only")

UNSUPPORTED: dict[frozenset[str], str] = {frozenset(pair): why for pair, why in {
    **{("compression", f): _DDP_HOOK for f in ("zero1", "zero2", "fsdp", "hsdp", "tp", "pp", "local_sgd", "sdp",
                                                "cp")},
    **{("local_sgd", f): _AVERAGES for f in ("zero1", "zero2", "fsdp", "hsdp", "tp", "pp", "sdp", "cp")},
    ("zero1", "tp"): "ZeRO-1/2 shard over dp only: zero 3 is FSDP x TP",
    ("zero2", "tp"): "ZeRO-1/2 shard over dp only: zero 3 is FSDP x TP",
    **{("rebalance", f): _SHARES + " (their collectives would not match)" for f in (
        "zero2", "fsdp", "hsdp", "pp", "sdp", "tp", "local_sgd", "cp")},
    **{("pp", f): _STAGES for f in ("zero1", "zero2", "hsdp", "mixed_precision", "sequence_parallel",
                                    "activation_checkpointing", "sdp")},
    **{("sdp", f): _SUBNETS for f in ("tp", "zero1", "zero2", "sequence_parallel")},
    ("sdp", "fsdp"): "SDP with zero 3 shards each subnetwork over parallel.dp_shard ranks: set it (HSDP)",
    ("cp", "zero1"): _CP_DP, ("cp", "zero2"): _CP_DP, ("cp", "sdp"): _CP_DP,
    ("cp", "sequence_parallel"): "Megatron sequence parallelism splits the sequence over tp ranks already",
    **{("ep", f): _EP_DP for f in ("zero1", "zero2", "pp", "cp", "compression", "local_sgd", "sdp", "rebalance")},
    ("ep", "hsdp"): "HSDP splits dp into replicate x shard, ep into dp_mod_ep x ep: the mesh splits it one way so far",
    ("ep", "sequence_parallel"): "tp ranks must route the same tokens: sequence parallelism splits them over tp",
    ("compile", "tp"): _METERED,
    **{("compile", f): f"{f}: {_UNCOMPILED}" for f in ("pp", "sdp")},
    **{("hierarchical", f): _HIERARCHICAL for f in ("zero1", "zero2", "fsdp", "hsdp", "tp", "pp", "cp", "ep",
                                                    "local_sgd", "sdp")},
}.items()}

# Features that are one choice of the same field: never together.
EXCLUSIVE: tuple[frozenset[str], ...] = (frozenset({"zero1", "zero2", "fsdp", "hsdp"}),)
# Features that need another to mean anything: a pair is refused when what either needs is refused.
REQUIRES: dict[str, tuple[str, ...]] = {"sequence_parallel": ("tp",)}

# Pairs whose refusal comes from this table (the others are refused by the layouts' own rules, and
# rebalance's by the data-parallel step's capabilities: layouts/__init__.step_need_violations), and the
# feature whose field it names.
NEW_AXES = ("hierarchical", "ep", "cp", "compile")
REFUSED_HERE = frozenset(pair for pair in UNSUPPORTED if pair & set(NEW_AXES) and "rebalance" not in pair)


def features_of(spec: JobSpec) -> list[str]:
    return [name for name, (_, on) in FEATURES.items() if on(spec)]


def compatibility_violations(spec: JobSpec) -> Iterator[Violation]:
    """One violation per refused pair this table enforces, naming the newer feature's field."""
    on = features_of(spec)
    for a, b in itertools.combinations(on, 2):
        pair = frozenset((a, b))
        if pair in REFUSED_HERE:
            new = next(axis for axis in NEW_AXES if axis in pair)
            other = b if a == new else a
            field, other_field = FEATURES[new][0], FEATURES[other][0]
            yield Violation(field, f"{field} is not available with {other_field} ({other}): {UNSUPPORTED[pair]} "
                                   f"({field}={_value(spec, field)})")


def _value(spec: JobSpec, field: str) -> object:
    """The spec's value at a dotted field (`parallel.cp`, `train.compile`)."""
    value: object = spec
    for part in field.split("."):
        value = getattr(value, part)
    return value


def composes(a: str, b: str) -> bool | None:
    """Whether two features run together (None: one choice of the same field, never together)."""
    if any({a, b} <= group for group in EXCLUSIVE):
        return None
    both = {a, b, *REQUIRES.get(a, ()), *REQUIRES.get(b, ())}
    return not any(frozenset(pair) in UNSUPPORTED for pair in itertools.combinations(sorted(both), 2))


def matrix_markdown() -> str:
    """The table as a markdown grid: ✓ composes, ✗ refused, · one choice of the same field."""
    names = list(FEATURES)
    head = "| | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    mark = {True: "✓", False: "✗", None: "·"}
    rows = "".join(f"| {a} | " + " | ".join("" if a == b else mark[composes(a, b)] for b in names) + " |\n"
                   for a in names)
    return head + rows

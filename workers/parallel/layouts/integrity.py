"""`fault_tolerance.integrity_check_every` needs state at rest between steps: a rank's own checksums verify
it there (and replicas, where the layout has them, are compared too)."""

from __future__ import annotations

from collections.abc import Iterator

from workers.spec import JobSpec, Violation, sdp_workers

# Layouts whose state changes between an update and the next forward (a parameter server's pushes, say),
# where a checksum sealed after the update would flag its own writes: none today. Every layout is
# checked at rest on each rank (workers/training/shard_integrity.py), replicas or not.
CHANGES_AT_REST: frozenset[str] = frozenset()


def replica_count(spec: JobSpec, layout: str) -> int:
    """How many ranks hold each replicated tensor of the layout (1: nothing is replicated)."""
    if layout == "fsdp" or (layout == "pipeline" and spec.parallel.zero == 3):
        return spec.dims.dp_replicate  # HSDP's replicas; 1 when fully sharded (pp x FSDP2 too)
    if layout == "sdp":
        return sdp_workers(spec)  # the embeddings, attention and head are held by every worker
    return spec.dp


def integrity_rules(spec: JobSpec) -> Iterator[Violation]:
    from workers.parallel.layouts import strategy_name  # the package imports this module

    layout = strategy_name(spec)
    if spec.fault_tolerance.integrity_check_every and layout in CHANGES_AT_REST:
        yield Violation("fault_tolerance.integrity_check_every",
            f"fault_tolerance.integrity_check_every needs a layout whose state rests between an update and the "
            f"next forward, so that each rank can verify its own checksums; layout {layout!r} changes it "
            f"there (replicas={replica_count(spec, layout)}): set it to 0")

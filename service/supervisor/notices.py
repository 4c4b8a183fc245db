"""What ranks report one by one, told once: per-rank notices of one cause merged into one event.

A storage outage on a 4,096-rank job made every rank report every retry: ~74,000 events. The
notices a poll brings are merged here: the ones that count ranks (StoreRetryEvent, StoreRecoveredEvent:
their `ranks` field) into one per kind and retry attempt, kept as the lowest rank's with the count of
ranks that reported it; the others (the same CheckpointIncompleteEvent from every rank) once each.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from workers.events import RunEvent


def merged(notices: list[RunEvent]) -> list[RunEvent]:
    """One event per cause, in the order each cause first appeared."""
    groups: dict[Any, list[RunEvent]] = {}
    for event in notices:
        groups.setdefault(_cause(event), []).append(event)
    out = []
    for events in groups.values():
        if _counts_ranks(events[0]):
            first = min(events, key=lambda e: getattr(e, "rank"))
            out.append(replace(first, ranks=sum(getattr(e, "ranks") for e in events)))  # type: ignore[call-arg]
        else:
            out.append(events[0])
    return out


def _counts_ranks(event: RunEvent) -> bool:
    return any(f.name == "ranks" for f in fields(event))  # type: ignore[arg-type]


def _cause(event: RunEvent) -> Any:
    if _counts_ranks(event):
        return type(event), getattr(event, "attempt", None)
    try:
        hash(event)
    except TypeError:  # an unhashable field: compared by its JSON
        return type(event), repr(event.as_json())
    return event  # identical events are one

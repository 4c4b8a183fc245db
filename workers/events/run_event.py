"""The base of every run event, and `Json`, the shape of an event's `data()`.

A run event is what the supervisor reports: its `kind`, `message` and `data()` are exactly the
`GET /v1/jobs/{id}/events` JSON (a public contract, pinned by tests/service/test_event_json.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

Json = dict[str, Any]


@dataclass(frozen=True)
class RunEvent:
    kind: ClassVar[str]

    @property
    def message(self) -> str:
        raise NotImplementedError

    def data(self) -> Json:
        raise NotImplementedError

    def as_json(self) -> Json:
        return {"kind": self.kind, "message": self.message, "data": self.data()}

"""What a finished training has done of its phases after the last step, so that a restart resumes into the
ones left instead of redoing them (and, if one of them keeps failing, redoing all of them every time).

After the last step a rank has three phases left: the final checkpoint, the final validation, the export.
The final checkpoint is its own record (a complete checkpoint at the last step: a rank resumed from it
does not write it again). The other two are recorded here by rank 0, in `final/step-<N>.json` under the
job's storage, once each is done: the validation's figures, the export's path and hash. Every rank of a
later attempt reads the record before the phase's first collective, so all agree on what to skip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from workers.storage import Storage


@dataclass
class FinalPhases:
    storage: Storage  # the job's `final/`
    step: int
    done: dict[str, Any] = field(default_factory=dict)  # phase -> what it produced

    @classmethod
    def load(cls, job: Storage, step: int) -> FinalPhases:
        ledger = cls(job / "final", step)
        if ledger.storage.exists(ledger.name):
            try:
                ledger.done = dict(json.loads(ledger.storage.read_text(ledger.name)))
            except (ValueError, OSError):  # a record cut short: redo what it would have said
                ledger.done = {}
        return ledger

    @property
    def name(self) -> str:
        return f"step-{self.step}.json"

    def get(self, phase: str) -> Any:
        return self.done.get(phase)

    def record(self, phase: str, value: Any, writer: bool) -> None:
        """Phase `phase` produced `value`; rank 0 (`writer`) writes the record, whole, after each phase."""
        self.done[phase] = value
        if writer:
            self.storage.write_text(self.name, json.dumps(self.done, sort_keys=True))

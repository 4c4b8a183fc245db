"""What every spec section shares: unknown keys are errors, values are frozen."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ENTRYPOINT_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EntrypointSpec(Strict):
    entrypoint: str = Field(pattern=ENTRYPOINT_PATTERN, description="'package.module:factory'")
    args: dict[str, Any] = Field(default_factory=dict)


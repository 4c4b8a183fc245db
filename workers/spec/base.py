"""What every spec section shares: unknown keys are errors, values are frozen."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ENTRYPOINT_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EntrypointSpec(Strict):
    entrypoint: str = Field(pattern=ENTRYPOINT_PATTERN, description="'package.module:factory'")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments the factory is called with")



def section_kind(value: Any, keyed: tuple[str, ...]) -> str | None:
    """Which variant of a section a user wrote: the first of `keyed` present as a key (e.g. `entrypoint`,
    `hf`, `files`), else its `name` (default "gpt"); None for what is not a mapping. A discriminator
    for the pydantic unions of the model and data sections."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if not isinstance(value, dict):
        return None
    return next((key for key in keyed if key in value), None) or value.get("name", "gpt")

"""The `data` section: the built-in corpora or a user dataset factory."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Discriminator, Field, Tag

from workers.spec.base import EntrypointSpec, Strict
from workers.spec.model import name_or_entrypoint


class TextDataSpec(Strict):
    name: Literal["text:pystdlib"]
    max_bytes: int = Field(4_000_000, ge=10_000, description="corpus size cap")
    val_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    seq_len: int | None = Field(None, ge=2, le=65536, description="tokens per sample; required with a model "
                                                                 "other than the built-in gpt (default model.seq_len)")


class SyntheticDataSpec(Strict):
    name: Literal["synthetic"]
    n_samples: int = Field(4096, ge=1)
    in_features: int = Field(16, ge=1)
    out_features: int = Field(1, ge=1)
    noise: float = Field(0.01, ge=0.0)


DataSpec = Annotated[
    Union[
        Annotated[TextDataSpec, Tag("text:pystdlib")],
        Annotated[SyntheticDataSpec, Tag("synthetic")],
        Annotated[EntrypointSpec, Tag("entrypoint")],
    ],
    Discriminator(name_or_entrypoint, custom_error_type="data.name",
                  custom_error_message="data.name must be 'text:pystdlib' or 'synthetic', or give data.entrypoint"),
]


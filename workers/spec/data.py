"""The `data` section: the built-in corpora, sharded files, or a user dataset factory; each with a `loader`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag

from workers.spec.base import EntrypointSpec, Strict, section_kind
from workers.spec.model import TableSize

FILE_FORMATS = ("tokens", "jsonl", "parquet", "text")
TOKEN_DTYPES = ("uint8", "uint16", "uint32", "int32", "int64")
LOADER = "how batches are prepared: loader processes beside the training thread"


class LoaderSpec(Strict):
    """How batches are prepared: torch DataLoader workers beside the training thread."""
    num_workers: int = Field(0, ge=0, le=64, description="loader processes per rank; 0 reads on the training thread")
    prefetch_factor: int = Field(2, ge=1, le=64, description="micro-batches each loader worker prepares ahead")
    pin_memory: bool | Literal["auto"] = Field("auto", description="page-locked batches; auto: on iff CUDA")


class TextDataSpec(Strict):
    """Byte-level text built from the Python standard library's own sources: no download."""
    name: Literal["text:pystdlib"] = Field(description="the built-in text corpus")
    max_bytes: int = Field(4_000_000, ge=10_000, description="corpus size cap")
    val_fraction: float = Field(0.05, gt=0.0, lt=0.5, description="the corpus's last fraction held out for "
                                                                 "validation")
    seq_len: int | None = Field(None, ge=2, le=65536, description="tokens per sample; required with a model "
                                                                 "other than the built-in gpt (default model.seq_len)")
    loader: LoaderSpec = Field(default_factory=LoaderSpec, description=LOADER)


class SyntheticDataSpec(Strict):
    """A linear regression set y = W x + noise, fully determined by train.seed (for model 'mlp')."""
    name: Literal["synthetic"] = Field(description="the built-in regression set")
    n_samples: int = Field(4096, ge=1, description="samples generated; the last 10% are the validation split")
    in_features: int = Field(16, ge=1, description="width of x; must equal model.in_features with model 'mlp'")
    out_features: int = Field(1, ge=1, description="width of y; must equal model.out_features with model 'mlp'")
    noise: float = Field(0.01, ge=0.0, description="standard deviation of the Gaussian noise added to y")
    loader: LoaderSpec = Field(default_factory=LoaderSpec, description=LOADER)


class ClicksDataSpec(Strict):
    """Seeded click logs (workers/data/clicks.py): categorical ids drawn from a power law (Zipf), dense features,
    and a click drawn from a hidden logistic model of both, so a model can beat chance. Determined by train.seed."""
    name: Literal["synthetic:clicks"] = Field(description="the built-in click logs")
    n_samples: int = Field(16384, ge=16, le=100_000_000, description="samples generated; the last 10% are the "
                                                                      "validation split")
    dense_features: int | None = Field(None, ge=1, le=4096, description="width of the dense input; default "
                                       "model.dense_features with model 'dlrm' (which it must then equal), else 8")
    table_sizes: list[TableSize] | None = Field(None, min_length=1, max_length=64, description="ids per categorical "
                                                "feature; default model.table_sizes with model 'dlrm' (which it "
                                                "must then equal), else [1000, 1000, 500, 100]")
    zipf_exponent: float = Field(1.1, ge=0.0, le=4.0, description="id k (0-based popularity rank) is drawn with "
                                 "probability proportional to 1 / (k + 1) ** zipf_exponent; 0 is uniform")
    signal: float = Field(2.0, ge=0.0, le=100.0, description="standard deviation of the hidden logit: 0 makes "
                                                             "clicks coin flips, larger makes them predictable")
    loader: LoaderSpec = Field(default_factory=LoaderSpec, description=LOADER)


class FilesSpec(Strict):
    """Sharded files, read lazily: local paths or fsspec URIs, with glob patterns."""
    paths: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1, description="training files or patterns")
    format: Literal[FILE_FORMATS] = Field(  # type: ignore[valid-type]
        "tokens", description="tokens: flat token-id arrays of `dtype`; text: raw bytes; jsonl: a record per line; "
                              "parquet: a record per row")
    dtype: Literal[TOKEN_DTYPES] = Field("uint16", description="token-id type of `tokens` files")  # type: ignore[valid-type]
    seq_len: int = Field(ge=1, le=1_048_576, description="tokens per sample (each sample reads seq_len + 1)")
    validation: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description="validation files or patterns; default: the training files")
    field: str = Field("text", min_length=1, description="jsonl key / parquet column: a string (tokenised) or a "
                                                          "list of token ids")


class FileDataSpec(Strict):
    """Your own data in sharded files (tokens, text, jsonl or parquet)."""
    files: FilesSpec = Field(description="the files and how to read them")
    tokenizer: str | None = Field(None, description="jsonl/parquet/text: null = bytes; or a local Hugging Face "
                                                    "tokenizer directory (never a hub download)")
    loader: LoaderSpec = Field(default_factory=LoaderSpec, description=LOADER)


class DataEntrypointSpec(EntrypointSpec):
    """A user factory returning a map-style dataset, an IterableDataset, or a (train, validation) pair."""
    loader: LoaderSpec = Field(default_factory=LoaderSpec, description=LOADER)


def _data_kind(value: Any) -> str | None:
    return section_kind(value, ("entrypoint", "files"))


DataSpec = Annotated[
    Union[
        Annotated[TextDataSpec, Tag("text:pystdlib")],
        Annotated[SyntheticDataSpec, Tag("synthetic")],
        Annotated[ClicksDataSpec, Tag("synthetic:clicks")],
        Annotated[FileDataSpec, Tag("files")],
        Annotated[DataEntrypointSpec, Tag("entrypoint")],
    ],
    Discriminator(_data_kind, custom_error_type="data.name",
                  custom_error_message="data.name must be 'text:pystdlib', 'synthetic' or 'synthetic:clicks', or "
                                       "give data.files or data.entrypoint"),
]

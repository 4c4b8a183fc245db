"""Dataset registry: built-in data by name, user datasets by entrypoint."""

from __future__ import annotations

from typing import Any, Callable

from torch.utils.data import IterableDataset

from workers.data.batches import MapDataset
from workers.data.clicks import Clicks, click_splits
from workers.data.files import file_splits
from workers.data.pystdlib_text import pystdlib_splits
from workers.data.synthetic import synthetic_splits
from workers.entrypoints import EntrypointError, resolve_entrypoint
from workers.spec import (
    ClicksDataSpec,
    DataEntrypointSpec,
    FileDataSpec,
    JobSpec,
    SyntheticDataSpec,
    TextDataSpec,
    clicks_shape,
    sequence_length,
    structure_of,
)


def _text(spec: JobSpec) -> tuple[MapDataset, MapDataset]:
    d, seq_len = spec.data, sequence_length(spec)
    assert isinstance(d, TextDataSpec)  # DATA_BUILDERS dispatches on the type
    assert seq_len is not None, "the spec rules require data.seq_len unless the model is the built-in gpt"
    return pystdlib_splits(d.max_bytes, d.val_fraction, seq_len)


def _synthetic(spec: JobSpec) -> tuple[MapDataset, MapDataset]:
    d = spec.data
    assert isinstance(d, SyntheticDataSpec)  # DATA_BUILDERS dispatches on the type
    return synthetic_splits(d.n_samples, d.in_features, d.out_features, d.noise, spec.train.seed)


def _clicks(spec: JobSpec) -> tuple[Clicks, Clicks]:
    d = spec.data
    assert isinstance(d, ClicksDataSpec)  # DATA_BUILDERS dispatches on the type
    dense, tables = clicks_shape(d, spec.model)
    return click_splits(d.n_samples, dense, tables, d.zipf_exponent, d.signal, spec.train.seed)


def _files(spec: JobSpec) -> tuple[Any, Any]:
    d = spec.data
    assert isinstance(d, FileDataSpec)  # DATA_BUILDERS dispatches on the type
    return file_splits(d, structure_of(spec).vocab)


def _entrypoint(spec: JobSpec) -> tuple[Any, Any]:
    d = spec.data
    assert isinstance(d, DataEntrypointSpec)  # DATA_BUILDERS dispatches on the type
    made = resolve_entrypoint(d.entrypoint, "data.entrypoint")(**d.args)
    train, val = made if isinstance(made, tuple) else (made, made)
    for ds in (train, val):
        if not (isinstance(ds, IterableDataset) or (hasattr(ds, "__getitem__") and hasattr(ds, "__len__"))):
            raise EntrypointError(f"data.entrypoint: {d.entrypoint} must return a map-style dataset "
                                  f"(with __len__ and __getitem__) or an IterableDataset, got {type(ds).__name__}")
    return train, val


DATA_BUILDERS: dict[type, Callable] = {
    TextDataSpec: _text,
    SyntheticDataSpec: _synthetic,
    ClicksDataSpec: _clicks,
    FileDataSpec: _files,
    DataEntrypointSpec: _entrypoint,
}


def build_datasets(spec: JobSpec) -> tuple[Any, Any]:
    """(train, validation) datasets of (input, target) pairs: map-style, or IterableDatasets from an entrypoint.
    The same object twice: there is no separate validation split."""
    return DATA_BUILDERS[type(spec.data)](spec)

"""The rules of the recommendation model, its click data and the binary cross-entropy loss (torch-free)."""

from __future__ import annotations

from collections.abc import Iterator

from workers.spec.data import ClicksDataSpec, DataEntrypointSpec, FileDataSpec
from workers.spec.errors import Violation
from workers.spec.job import JobSpec
from workers.spec.model import DLRMModelSpec, MLPModelSpec, ModelEntrypointSpec


def recommendation_violations(spec: JobSpec) -> Iterator[Violation]:
    yield from _dlrm_errors(spec)
    yield from _clicks_errors(spec)
    yield from _bce_errors(spec)


def _data_name(spec: JobSpec) -> str:
    d = spec.data
    return "data.files" if isinstance(d, FileDataSpec) else "data.entrypoint" if isinstance(
        d, DataEntrypointSpec) else repr(getattr(d, "name", ""))


def _dlrm_errors(spec: JobSpec) -> Iterator[Violation]:
    m, d, p = spec.model, spec.data, spec.parallel
    if not isinstance(m, DLRMModelSpec):
        return
    if not isinstance(d, (ClicksDataSpec, DataEntrypointSpec)):
        yield Violation("data.files" if isinstance(d, FileDataSpec) else "data.name",
            f"model 'dlrm' needs click data: data.name 'synthetic:clicks', or a data.entrypoint whose samples are "
            f"({{'dense': float (dense_features,), 'sparse': int64 (tables,)}}, 0/1 float target); "
            f"got {_data_name(spec)}")
    if isinstance(d, ClicksDataSpec):
        if d.dense_features is not None and d.dense_features != m.dense_features:
            yield Violation("data.dense_features",
                f"data.dense_features must equal model.dense_features (data {d.dense_features}, "
                f"model {m.dense_features}); leave it out to take the model's")
        if d.table_sizes is not None and list(d.table_sizes) != list(m.table_sizes):
            yield Violation("data.table_sizes",
                f"data.table_sizes must equal model.table_sizes (data {list(d.table_sizes)}, "
                f"model {list(m.table_sizes)}); leave it out to take the model's")
    if spec.train.loss != "bce":
        yield Violation("train.loss", f"train.loss must be 'bce' for model 'dlrm', which outputs one click "
                                      f"logit per sample (loss={spec.train.loss!r})")
    for field, on in (("parallel.pp", p.pp > 1), ("parallel.cp", p.cp > 1), ("parallel.ep", p.ep > 1)):
        if on:
            yield Violation(field, f"{field} must be 1 for model 'dlrm': it has no blocks to stage, no sequence "
                                   f"and no experts ({field.split('.')[1]}={getattr(p, field.split('.')[1])})")
    if p.sdp is not None:
        yield Violation("parallel.sdp", "parallel.sdp needs a model with repeated blocks (model 'dlrm' has none)")


def _clicks_errors(spec: JobSpec) -> Iterator[Violation]:
    m, d = spec.model, spec.data
    if isinstance(d, ClicksDataSpec) and not isinstance(m, (DLRMModelSpec, ModelEntrypointSpec)):
        yield Violation("data.name",
            f"data.name 'synthetic:clicks' gives (dense, sparse ids) inputs for a recommendation model: use "
            f"model 'dlrm' or a model.entrypoint (model {getattr(m, 'name', None) or 'hf'!r})")


def _bce_errors(spec: JobSpec) -> Iterator[Violation]:
    m, d = spec.model, spec.data
    if spec.train.loss != "bce":
        return
    one_logit = isinstance(m, (DLRMModelSpec, ModelEntrypointSpec)) or (
        isinstance(m, MLPModelSpec) and m.out_features == 1)
    if not one_logit:
        what = f"model 'mlp' with out_features={m.out_features}" if isinstance(m, MLPModelSpec) else (
            f"model {getattr(m, 'name', None) or 'hf'!r}, which outputs a logit per class")
        yield Violation("train.loss", f"train.loss 'bce' needs a model with one logit per sample (model 'dlrm', "
                                      f"'mlp' with out_features 1, or a model.entrypoint); got {what}")
    if not isinstance(d, (ClicksDataSpec, DataEntrypointSpec)):
        yield Violation("train.loss", f"train.loss 'bce' needs 0/1 targets: data.name 'synthetic:clicks' or a "
                                      f"data.entrypoint; got {_data_name(spec)}")

"""A sample micro-batch input for the pipeline's probe forward: the training set's first samples,
so that shapes and dtypes are the ones the schedule will see (no model-specific sizes needed)."""

from __future__ import annotations

from workers.data import build_datasets
from workers.model_io import Inputs, collate
from workers.spec import JobSpec


def sample_input(spec: JobSpec) -> Inputs:
    train, _ = build_datasets(spec)
    n = min(spec.train.micro_batch_size, len(train))
    inputs, _ = collate([train[i] for i in range(n)])
    return inputs

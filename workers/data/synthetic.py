"""Synthetic linear regression: y = W x + noise, fully determined by the seed."""

import torch
from torch.utils.data import TensorDataset


def synthetic_splits(n_samples: int, in_features: int, out_features: int, noise: float,
                     seed: int) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(seed + 7919)
    weight = torch.randn(in_features, out_features, generator=g)
    x = torch.randn(n_samples, in_features, generator=g)
    y = x @ weight + noise * torch.randn(n_samples, out_features, generator=g)
    cut = max(1, int(n_samples * 0.9))
    val_x, val_y = (x[cut:], y[cut:]) if cut < n_samples else (x, y)
    return TensorDataset(x[:cut], y[:cut]), TensorDataset(val_x, val_y)

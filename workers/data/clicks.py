"""Seeded click logs for the recommendation model: `data: {name: "synthetic:clicks"}`.

Each sample is ({"dense": (dense_features,) float, "sparse": (tables,) int64}, click 0./1.). The ids of
each categorical feature follow a power law: the id of popularity rank k is drawn with probability
proportional to 1 / (k + 1) ** zipf_exponent, the ranks dealt to ids by a seeded permutation (so popular
rows are spread over every parameter-server shard, not all on the first). The click is drawn from a hidden
logistic model: logit = sum of a hidden weight per (feature, id) + w . dense + b, scaled to a standard
deviation of `signal`, so a model that learns the popular ids' weights beats chance (AUC > 0.5); the best
possible AUC is below 1 since clicks are drawn, not thresholded. All of it a pure function of the seed.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class Clicks(Dataset):
    """Samples `start` .. `stop` of the generated log, as (inputs, target) pairs."""

    def __init__(self, dense: torch.Tensor, sparse: torch.Tensor, clicks: torch.Tensor):
        self.dense, self.sparse, self.clicks = dense, sparse, clicks

    def __len__(self) -> int:
        return int(self.clicks.shape[0])

    def __getitem__(self, i: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return {"dense": self.dense[i], "sparse": self.sparse[i]}, self.clicks[i]


def zipf_ids(rows: int, n: int, exponent: float, g: torch.Generator) -> torch.Tensor:
    """n ids in [0, rows): popularity rank k with probability ~ 1 / (k + 1) ** exponent, ranks dealt to ids
    by a seeded permutation."""
    weights = torch.arange(1, rows + 1, dtype=torch.float64) ** -exponent
    ranks = torch.multinomial(weights, n, replacement=True, generator=g)
    return torch.randperm(rows, generator=g)[ranks]


def click_log(n_samples: int, dense_features: int, table_sizes: list[int], zipf_exponent: float, signal: float,
              seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dense, sparse ids, clicks) of n_samples samples."""
    g = torch.Generator().manual_seed(seed + 104729)
    dense = torch.randn(n_samples, dense_features, generator=g)
    sparse = torch.stack([zipf_ids(rows, n_samples, zipf_exponent, g) for rows in table_sizes], dim=1)
    logit = dense @ torch.randn(dense_features, generator=g) / dense_features ** 0.5
    for i, rows in enumerate(table_sizes):
        logit += torch.randn(rows, generator=g)[sparse[:, i]]
    logit = (logit - logit.mean()) / logit.std().clamp_min(1e-6) * signal
    clicks = torch.bernoulli(torch.sigmoid(logit), generator=g)
    return dense, sparse, clicks


def click_splits(n_samples: int, dense_features: int, table_sizes: list[int], zipf_exponent: float,
                 signal: float, seed: int) -> tuple[Clicks, Clicks]:
    """(train, validation): the log's first 90% and its last 10%."""
    dense, sparse, clicks = click_log(n_samples, dense_features, table_sizes, zipf_exponent, signal, seed)
    cut = max(1, int(n_samples * 0.9))
    return Clicks(dense[:cut], sparse[:cut], clicks[:cut]), Clicks(dense[cut:], sparse[cut:], clicks[cut:])

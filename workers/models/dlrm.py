"""DLRM (Naumov et al., 2019), small: an embedding table per categorical feature, a bottom MLP that maps the
dense features to the embedding width, the pairwise dot products of those vectors (their interaction), and a
top MLP from the dense vector and the interactions to one click logit.

The tables are `tables` (an nn.ModuleList of nn.Embedding) and the lookup is `embed`: a parameter server
(workers/parallel/parameter_server/) replaces the lookup with rows it pulled from its shards, and the rest of
the model, the dense part, is what the trainers all-reduce."""

from __future__ import annotations

import torch
from torch import nn


class DLRM(nn.Module):
    def __init__(self, dense_features: int, table_sizes: list[int], embedding_dim: int,
                 bottom_hidden: int, top_hidden: int):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(rows, embedding_dim) for rows in table_sizes)
        for rows_of in self.embedding_tables():
            # small rows: dot products start near 0, so early logits are near 0 too
            nn.init.normal_(rows_of.weight, std=embedding_dim ** -0.5)
        self.bottom = nn.Sequential(nn.Linear(dense_features, bottom_hidden), nn.ReLU(),
                                    nn.Linear(bottom_hidden, embedding_dim), nn.ReLU())
        vectors = len(table_sizes) + 1
        pairs = vectors * (vectors - 1) // 2
        self.top = nn.Sequential(nn.Linear(embedding_dim + pairs, top_hidden), nn.ReLU(), nn.Linear(top_hidden, 1))
        self.pair_rows: torch.Tensor
        self.pair_cols: torch.Tensor
        rows, cols = torch.triu_indices(vectors, vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)

    def embedding_tables(self) -> list[nn.Embedding]:
        return [t for t in self.tables if isinstance(t, nn.Embedding)]

    def embed(self, sparse: torch.Tensor) -> list[torch.Tensor]:
        """The embedding rows of each categorical feature: `sparse` is (batch, tables) int64 ids."""
        return [table(sparse[:, i]) for i, table in enumerate(self.tables)]

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor,
                rows: list[torch.Tensor] | None = None) -> torch.Tensor:
        """One logit per sample, shape (batch,). `rows`: the embedding rows, when they come from elsewhere."""
        x = self.bottom(dense)
        vectors = torch.stack([x, *(self.embed(sparse) if rows is None else rows)], dim=1)  # (batch, n, dim)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pair_rows, self.pair_cols]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)

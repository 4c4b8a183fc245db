"""Which shard holds which embedding row: row r of every table lives on shard r % shards, at local index
r // shards. Round-robin rather than ranges: the click data's popular ids are spread by a permutation, and
a user's ids are often popularity-ordered (id 0 the most frequent), which ranges would pile onto shard 0."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSharding:
    shards: int

    def rows_on(self, shard: int, table_rows: int) -> int:
        """How many of a table's rows shard `shard` holds."""
        return len(range(shard, table_rows, self.shards))

    def split(self, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """For each shard: (positions in `ids` it holds, their local indexes there). `ids`: 1-D global row ids."""
        owner = ids % self.shards
        out = []
        for shard in range(self.shards):
            positions = torch.nonzero(owner == shard, as_tuple=True)[0]
            out.append((positions, ids[positions] // self.shards))
        return out

    def local_part(self, table: torch.Tensor, shard: int) -> torch.Tensor:
        """The rows of a whole table that shard `shard` holds, in local order."""
        return table[shard::self.shards].clone()

    def whole(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """A whole table from each shard's local rows (local_part's inverse)."""
        rows = sum(int(p.shape[0]) for p in parts)
        table = torch.empty(rows, *parts[0].shape[1:], dtype=parts[0].dtype)
        for shard, part in enumerate(parts):
            table[shard::self.shards] = part
        return table

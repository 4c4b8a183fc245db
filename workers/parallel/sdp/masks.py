"""Mask assignment: which worker holds which maskable components.

Components are transformer blocks (mode "block") or, per MLP, hidden units
(mode "neuron", one assignment per layer). Each of the K workers holds
k = round(C x n) of the n components of a layer, chosen as a window of k
consecutive positions on a seeded random circular order of the components,
the windows starting at evenly spaced offsets floor(w x n / K). Hence:
  - balanced: every worker holds exactly k per layer;
  - covered: every component is held when no gap between window starts exceeds k;
  - connected: when at most one pair of neighbouring windows fails to overlap,
    the worker-component graph is a ring (or a path) of shared components;
  - every component is held by floor or ceil of about K x k / n workers.
The method's convergence analysis depends on the spectral gap of the worker
graph (workers linked by the components they share): `spectral_gap` reports
the second-smallest eigenvalue of its normalised Laplacian (0 = disconnected).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from workers.parallel.sdp.feasibility import held_count, offsets


@dataclass(frozen=True)
class Assignment:
    mode: str  # "block" | "neuron"
    workers: int
    layers: int  # assignments: 1 for block mode, one per MLP for neuron mode
    n: int  # components per layer
    k: int  # components each worker holds per layer
    held: tuple  # held[layer][worker] = sorted tuple of component indices

    def holders(self, layer: int, component: int) -> tuple[int, ...]:
        return self._holders[layer][component]

    @cached_property
    def _holders(self) -> list[list[tuple[int, ...]]]:
        out = []
        for layer in range(self.layers):
            h: list[list[int]] = [[] for _ in range(self.n)]
            for w in range(self.workers):
                for c in self.held[layer][w]:
                    h[c].append(w)
            out.append([tuple(x) for x in h])
        return out

    def held_fraction(self, worker: int) -> float:
        return sum(len(self.held[layer][worker]) for layer in range(self.layers)) / (self.layers * self.n)

    def shared_counts(self) -> torch.Tensor:
        """K x K matrix: components held by both workers (diagonal zeroed)."""
        incidence = torch.zeros(self.workers, self.layers * self.n, dtype=torch.float64)
        for layer in range(self.layers):
            for w in range(self.workers):
                incidence[w, [layer * self.n + c for c in self.held[layer][w]]] = 1.0
        a = incidence @ incidence.T
        return a.fill_diagonal_(0.0)

    def is_connected(self) -> bool:
        """Worker-component bipartite graph connected (every component held, workers linked)."""
        if any(not hs for layer in self._holders for hs in layer):
            return False
        a, seen, todo = self.shared_counts(), {0}, [0]
        while todo:
            u = todo.pop()
            for v in range(self.workers):
                if a[u, v] > 0 and v not in seen:
                    seen.add(v)
                    todo.append(v)
        return len(seen) == self.workers

    @cached_property
    def spectral_gap(self) -> float:
        """Second-smallest eigenvalue of I - D^-1/2 A D^-1/2 of the worker graph (1 worker: 1.0).

        0 when the worker-component graph is disconnected, unheld components included."""
        if any(not hs for layer in self._holders for hs in layer):
            return 0.0
        if self.workers == 1:
            return 1.0
        a = self.shared_counts()
        deg = a.sum(dim=1)
        if (deg == 0).any():
            return 0.0
        d = deg.rsqrt()
        lap = torch.eye(self.workers, dtype=torch.float64) - d[:, None] * a * d[None, :]
        return max(0.0, float(torch.linalg.eigvalsh(lap)[1]))

    def report(self) -> dict:
        return {"mode": self.mode, "workers": self.workers, "components_per_layer": self.n,
                "held_per_worker": self.k, "spectral_gap": round(self.spectral_gap, 6),
                "held_fraction_per_rank": [self.held_fraction(w) for w in range(self.workers)]}


def assign(mode: str, workers: int, layers: int, n: int, coverage: float, seed: int) -> Assignment:
    """The deterministic assignment for (mode, K workers, layers x n components, C, seed)."""
    k = min(n, max(1, held_count(n, coverage)))
    gen = torch.Generator().manual_seed(seed * 7919 + {"block": 1, "neuron": 2}[mode])
    held = []
    for _ in range(layers):
        order = torch.randperm(n, generator=gen).tolist()
        starts = offsets(n, workers)
        held.append(tuple(tuple(sorted(order[(o + j) % n] for j in range(k))) for o in starts))
    return Assignment(mode, workers, layers, n, k, tuple(held))

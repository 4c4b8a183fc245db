"""An actor that reports what its node sees: its address, its files, and a gloo all-reduce with its peers."""

from __future__ import annotations

import os
from pathlib import Path

import ray


@ray.remote(num_cpus=1)
class NodeProbe:
    def node_ip(self) -> str:
        return ray.util.get_node_ip_address()

    def write(self, path: str, text: str) -> bool:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
        return os.path.exists(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def fetch(self, url: str) -> str:
        """The body at `url` (a service on the host, through the node's default route)."""
        import urllib.request

        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.read().decode()

    def free_port(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def all_reduce(self, master: str, port: int, rank: int, world: int) -> list[float]:
        """One gloo group over the bridge (MASTER_ADDR is a node's IP): the sum of (rank + 1) * [1, 2]."""
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
        try:
            t = torch.tensor([1.0, 2.0]) * (rank + 1)
            dist.all_reduce(t)
            return t.tolist()
        finally:
            dist.destroy_process_group()

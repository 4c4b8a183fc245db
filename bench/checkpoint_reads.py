"""What a resuming rank reads from an object store, and what each save plans, on moto's S3 server.

    .venv/bin/python bench/checkpoint_reads.py [--ranks 4] [--mib 16] [--saves 3]

`--ranks` gloo ranks (spawned, no Ray) hold an FSDP-like state: --mib MiB of float32 weights in 8
tensors sharded by rows (DTensor, Shard(0)) plus a replicated step scalar per tensor, as DCP saves an
FSDP model with its optimiser. They save it --saves times through a SavePlans planner (DCP plan
caching, workers/checkpointing/save_plans.py) and once through DCP's default planner, then each loads
it back with the same layout through StoreReader (workers/checkpointing/store_reader.py).

Printed: per rank, the bytes read vs the whole checkpoint (what every rank downloaded before: the
whole directory), and per save, the local plans sent and the global plans built.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402

from bench.table import print_markdown_table  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402
from workers.checkpointing.retry import RetryPolicy  # noqa: E402
from workers.checkpointing.save_plans import SavePlans  # noqa: E402
from workers.checkpointing.store_reader import StoreReader  # noqa: E402
from workers.checkpointing.writer import writer_for  # noqa: E402
from workers.storage import Storage  # noqa: E402

TENSORS = 8


def state(mesh, mib: int, fill: float) -> dict:
    rows = max(mesh.size(), (mib << 20) // 4 // TENSORS // 256)
    rows -= rows % mesh.size()
    out: dict = {}
    for i in range(TENSORS):
        full = torch.full((rows, 256), fill + i) if fill else torch.zeros(rows, 256)
        out[f"w{i}"] = distribute_tensor(full, mesh, [Shard(0)])
        out[f"w{i}.step"] = torch.tensor(float(fill))  # replicated: saved once, by one rank
    return out


def rank_main(rank: int, world: int, port: int, uri: str, mib: int, saves: int, queue) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    job = Storage.at(uri)
    plans = SavePlans()
    for n in range(saves):  # the same layout each time: the cache answers after the first
        writer = writer_for(job / f"cached-{n}", f"save {n}", rank, RetryPolicy(limit_s=30), print)
        dcp.save(state(mesh, mib, 1.0 + n), storage_writer=writer, planner=plans.planner())
    plain = SavePlans()
    planner = plain.planner()
    planner._enable_plan_caching = False  # DCP's default: plans every save
    writer = writer_for(job / "plain", "plain", rank, RetryPolicy(limit_s=30), print)
    dcp.save(state(mesh, mib, 1.0), storage_writer=writer, planner=planner)
    target = state(mesh, mib, 0.0)
    reader = StoreReader(job / f"cached-{saves - 1}")
    dcp.load(target, storage_reader=reader)
    assert float(target["w0"].to_local()[0, 0]) == float(saves), "loaded values are the last save's"
    queue.put((rank, reader.bytes_read, reader.checkpoint_bytes(), plans.counts.local_plans_sent,
               plans.counts.global_plans, plain.counts.local_plans_sent, plain.counts.global_plans))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mib", type=int, default=16, help="the whole checkpoint's weights, MiB")
    parser.add_argument("--saves", type=int, default=3)
    args = parser.parse_args()
    server = S3Server(Path(tempfile.mkdtemp(prefix="trainyard-bench-s3-"))).start()
    os.environ.update(server.env)
    try:
        uri = server.create_bucket(f"reads-{uuid.uuid4().hex[:8]}") + "/ckpt"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = mp.get_context("spawn").Queue()
        mp.start_processes(rank_main, args=(args.ranks, port, uri, args.mib, args.saves, queue),
                           nprocs=args.ranks, start_method="spawn")
        rows = sorted(queue.get(timeout=600) for _ in range(args.ranks))
    finally:
        server.stop()
    whole = rows[0][2]
    print("rank, bytes read, checkpoint bytes, cached: local plans sent, global plans; plain: the same", rows)
    print(f"\n{args.ranks} ranks, {args.mib} MiB of weights sharded by rows; checkpoint {whole / 2**20:.2f} MiB "
          "(shard files)\n")
    print_markdown_table(["rank", "before: bytes read (whole directory)",
                          "now: bytes read (its load plan, metadata included)", "now / whole"],
                         [[str(r), f"{whole / 2**20:.2f} MiB", f"{got / 2**20:.2f} MiB", f"{got / whole:.3f}"]
                          for r, got, *_ in rows])
    print()
    print_markdown_table(["planner", "saves", "local plans sent per rank", "global plans built (rank 0)"],
                         [["DCP default (no cache)", "1", str(rows[0][5]), str(rows[0][6])],
                          ["SavePlans (cached)", str(args.saves), str(rows[0][3]), str(rows[0][4])]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A resume from an object store (a real S3 API: moto's server over HTTP) reads only what each rank's load
plan needs: a 2-rank ZeRO-3 (FSDP) job resumed from its step-4 checkpoint fetches about half of the
checkpoint per rank, and still ends bit-identical to the uninterrupted run. Real gloo ranks, no Ray."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from tests.helpers import spec_of
from tests.workers.gloo_ranks import spawn_ranks
from workers.checkpointing import RetryPolicy
from workers.checkpointing.layout import checkpoint_root, step_name
from workers.checkpointing.store_reader import GAP, StoreReader, needed_ranges
from workers.checkpointing.writer import writer_for
from workers.storage import Storage

# Shards of a weight (128 KiB) larger than store_reader.GAP: a rank's ranges do not merge into its peer's.
SPEC = {"resources.workers": 2, "train.steps": 8, "checkpoint.every_steps": 4, "checkpoint.keep": 3,
        "model.d_model": 256, "model.n_heads": 4}


def _train(spec, rank: int, world: int, job: Storage) -> tuple[dict, int]:
    from workers.training.control import RankControl
    from workers.training.trainer import Trainer

    trainer = Trainer(spec, rank, world, torch.device("cpu"), job)
    resumed = trainer.resume_from_latest()
    return trainer.run(lambda event: None, RankControl()), resumed


def _uninterrupted_then_resumed(rank, world, port, queue, clean: str, resumed: str, layout: dict):
    from workers.checkpointing import loading

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    spec = spec_of(**SPEC, **layout)
    whole, _ = _train(spec, rank, world, Storage.at(clean))
    dist.barrier()
    if rank == 0:  # the resumed job starts from the clean run's step-4 checkpoint, as after a crash
        src, dst = checkpoint_root(clean) / step_name(4), checkpoint_root(resumed) / step_name(4)
        for name in src.list():
            dst.write_bytes(name, src.read_bytes(name))
    dist.barrier()
    again, step = _train(spec, rank, world, Storage.at(resumed))
    read = dataclasses.asdict(loading.last_read)
    queue.put((rank, whole.get("params_sha256"), again.get("params_sha256"), step, read))  # the hash: rank 0's
    dist.destroy_process_group()


def _jobs(s3_server, name: str) -> tuple[str, str]:
    bucket = s3_server.create_bucket(f"{name}-{uuid.uuid4().hex[:8]}")
    return f"{bucket}/jobs/clean", f"{bucket}/jobs/resumed"


@pytest.mark.parametrize("store", ["s3_server", "gcs_store"])
def test_a_load_fetches_only_the_items_its_state_dict_asks_for(store, request):
    """One process: the plan of a state dict that asks for one of two saved tensors reads that one."""
    server = request.getfixturevalue(store)
    job = Storage.at(server.create_bucket(f"items-{uuid.uuid4().hex[:8]}") + "/jobs/j")
    checkpoint = checkpoint_root(job) / step_name(1)
    saved = {"a": torch.arange(1 << 16, dtype=torch.float32), "b": torch.ones(1 << 16)}  # 256 KiB each
    dcp.save(saved, storage_writer=writer_for(checkpoint, "checkpoint 1", 0, RetryPolicy(limit_s=5), print),
             no_dist=True)
    state = {"a": torch.zeros(1 << 16)}
    reader = StoreReader(checkpoint)
    dcp.load(state, storage_reader=reader, no_dist=True)
    assert torch.equal(state["a"], saved["a"])
    whole = reader.checkpoint_bytes()
    assert whole == sum(n for name, n in checkpoint.sizes().items() if name != ".metadata")
    assert (1 << 18) < reader.bytes_read < 0.55 * whole, (reader.bytes_read, whole)  # "a" and the metadata


@pytest.mark.exhaustive  # two gloo ranks train 8 steps twice: 20-50 s on a loaded 2-core host
def test_a_sharded_resume_reads_about_its_share_and_stays_bit_identical(s3_server):
    rows = spawn_ranks(_uninterrupted_then_resumed, 2, *_jobs(s3_server, "zero3"), {"parallel.zero": 3})
    for rank, clean_sha, resumed_sha, step, read in rows:
        assert step == 4 and resumed_sha == clean_sha, rank
        share = read["bytes_read"] / read["checkpoint_bytes"]
        print(f"rank {rank}: read {read['bytes_read']} of {read['checkpoint_bytes']} bytes ({share:.2f})")
        assert 0.3 < share < 0.7, (rank, read)  # its half (the metadata and replicated scalars on top)


@pytest.mark.exhaustive  # as above
def test_ddp_replicas_each_read_the_whole_replicated_state(s3_server):
    """Replicas hold the same tensors: each reads all of them (saved once, by rank 0), as before."""
    rows = spawn_ranks(_uninterrupted_then_resumed, 2, *_jobs(s3_server, "ddp"), {})
    for rank, clean_sha, resumed_sha, step, read in rows:
        assert step == 4 and resumed_sha == clean_sha, rank
        assert read["bytes_read"] >= read["checkpoint_bytes"] * 0.9, (rank, read)


def test_needed_ranges_merge_close_items_of_a_file_and_keep_far_ones_apart():
    info = {i: _Info(f, o, n) for i, (f, o, n) in enumerate([("a", 0, 10), ("a", 10, 5), ("a", 20 + GAP, 4),
                                                              ("b", 7, 3)])}
    plan = _Plan([_Item(i) for i in (2, 0, 1, 3)])
    assert needed_ranges(plan, info) == {"a": [(0, 15), (20 + GAP, 24 + GAP)], "b": [(7, 10)]}


@dataclasses.dataclass
class _Info:
    relative_path: str
    offset: int
    length: int


@dataclasses.dataclass
class _Item:
    storage_index: int


@dataclasses.dataclass
class _Plan:
    items: list

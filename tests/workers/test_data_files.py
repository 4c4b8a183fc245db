"""File datasets, loader workers and streams without a cluster: contents, exact batches, bad files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fixtures.data_files import CountingStream, jsonl_file, parquet_file, token_shards
from tests.helpers import spec_of
from workers.data import build_datasets
from workers.data.batches import GlobalBatches
from workers.data.errors import DataError
from workers.data.loader import MapFeed
from workers.data.stream import StreamFeed
from workers.spec import LoaderSpec

CPU = torch.device("cpu")


def files_spec(files: dict, **overrides):
    return spec_of(data={"files": {"seq_len": 16, **files}}, **overrides)


def test_token_shards_are_windows_of_the_files_read_lazily(tmp_path):
    pattern = token_shards(tmp_path, shards=3, tokens_per_shard=1000)
    train, val = build_datasets(files_spec({"paths": [pattern]}))
    assert val is train and len(train) == 3 * (999 // 16)
    raw = np.fromfile(tmp_path / "train-001.bin", dtype=np.uint16)
    x, y = train[62 + 5]  # shard 1 starts at sample 62
    assert torch.equal(x, torch.from_numpy(raw[80:96].astype(np.int64)))
    assert torch.equal(y, torch.from_numpy(raw[81:97].astype(np.int64)))
    assert all(f._array is None or isinstance(f._array, np.memmap) for f in train.files)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_workers_give_the_pure_batches_of_each_step(tmp_path, num_workers):
    train, _ = build_datasets(files_spec({"paths": [token_shards(tmp_path, 2, 2000)]}))
    batches = GlobalBatches(train, 16, seed=3, skip=[[1, 3]])
    feed = MapFeed(batches, LoaderSpec(num_workers=num_workers, prefetch_factor=2), CPU, 1, 2, 4)
    resumed = MapFeed(batches, LoaderSpec(num_workers=num_workers), CPU, 1, 2, 4)
    try:
        for step in range(4):
            got = feed.micro_batches(step)
            expected = list(batches.rank_microbatches(step, 1, 2, 4))
            assert len(got) == 2 and all(torch.equal(a[0], b[0]) for a, b in zip(got, expected))
        restarted = resumed.micro_batches(2)  # a restart at step 2 reads what step 2 read
        assert all(torch.equal(a[0], b[0]) for a, b in zip(restarted, batches.rank_microbatches(2, 1, 2, 4)))
        uneven = feed.micro_batches(4, shares=[10, 6])  # a straggler rebalance restarts the iterator
        assert [len(b[0]) for b in uneven] == [4, 2]
    finally:
        feed.close()
        resumed.close()


def test_a_resize_from_4_to_2_ranks_keeps_every_global_batch(tmp_path):
    train, _ = build_datasets(files_spec({"paths": [token_shards(tmp_path, 2, 2000)]}))
    batches = GlobalBatches(train, 16, seed=0)

    def global_batch(step: int, dp: int, micro: int) -> torch.Tensor:
        feeds = [MapFeed(batches, LoaderSpec(num_workers=1), CPU, r, dp, micro) for r in range(dp)]
        out = torch.cat([b[0] for f in feeds for b in f.micro_batches(step)])
        for f in feeds:
            f.close()
        return out

    for step in (0, 7):
        four = global_batch(step, 4, 2)
        assert four.shape == (16, 16) and torch.equal(four, global_batch(step, 2, 4))


def test_jsonl_and_parquet_records_are_padded_samples(tmp_path):
    path = jsonl_file(tmp_path / "a.jsonl", 30)
    with open(path, "a") as f:
        f.write("\n" + '{"text": "hi"}' + "\n")  # a blank line is no record
    train, _ = build_datasets(files_spec({"paths": [path], "format": "jsonl", "seq_len": 64}, **{"model.seq_len": 64}))
    assert len(train) == 31
    x, y = train[30]  # 'hi': one target, then the ignored padding
    assert x[:2].tolist() == [104, 0] and y[:2].tolist() == [105, -100] and (y[1:] == -100).all()
    x, y = train[0]
    assert (y != -100).sum() == 39 and torch.equal(x[1:39], y[:38])

    pq_path = parquet_file(tmp_path / "b.parquet", 50, row_group_size=8)
    ptrain, _ = build_datasets(files_spec({"paths": ["file://" + pq_path], "format": "parquet", "seq_len": 16}))
    assert len(ptrain) == 50 and len(ptrain.files[0].row_starts) == 8  # 7 row groups
    assert torch.equal(ptrain[3][0], train[3][0][:16])  # the same records in both files
    ptrain[49]
    assert list(ptrain.files[0]._groups) == [0, 6]  # only the row groups read are held


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_keeps_its_order_with_workers_and_resumes_from_its_state(num_workers):
    loader = LoaderSpec(num_workers=num_workers)
    reference = [list(CountingStream(100))[k][0] for k in range(48)]
    feed = StreamFeed(CountingStream(100), 16, loader, CPU, 0, 1, 2, 4)
    first = [feed.micro_batches(s) for s in range(2)]
    assert torch.equal(torch.cat([b[0] for b in first[1]]), torch.stack(reference[24:32]))  # rank 1's half
    state = feed.state_dict()
    assert state == {"samples": 32}
    third = feed.micro_batches(2)
    feed.close()
    resumed = StreamFeed(CountingStream(100), 16, loader, CPU, 0, 1, 2, 4)
    resumed.load_state_dict(state)
    again = resumed.micro_batches(2)
    resumed.close()
    assert all(torch.equal(a[0], b[0]) for a, b in zip(third, again))
    assert torch.equal(torch.cat([b[0] for b in again]), torch.stack(reference[40:48]))


def test_a_token_beyond_the_vocabulary_names_the_file_and_offset(tmp_path):
    pattern = token_shards(tmp_path, 1, 500)
    raw = np.fromfile(tmp_path / "train-000.bin", dtype=np.uint16)
    raw[100] = 300  # the gpt's vocabulary is 256
    raw.tofile(tmp_path / "train-000.bin")
    train, _ = build_datasets(files_spec({"paths": [pattern]}))
    with pytest.raises(DataError, match=r"train-000.bin at offset 200: token id 300 .* vocabulary of 256"):
        train[6]  # tokens 96..112
    feed = MapFeed(GlobalBatches(train, 16, 0), LoaderSpec(num_workers=1), CPU, 0, 1, 4)
    with pytest.raises(DataError) as raised:  # from a loader worker: the same type, the message alone
        for step in range(4):  # 31 windows: every one is read within 2 steps
            feed.micro_batches(step)
    feed.close()
    assert str(raised.value).startswith(f"data: {tmp_path}/train-000.bin at offset 200: token id 300")


def test_short_damaged_and_unreadable_files_are_job_errors_naming_them(tmp_path):
    spec = files_spec({"paths": [token_shards(tmp_path, 1, 500)]})
    (tmp_path / "train-000.bin").write_bytes(b"\0" * 20)  # after submit: 10 tokens, fewer than 17
    with pytest.raises(DataError, match="train-000.bin at offset 0: the shard holds 10 tokens"):
        build_datasets(spec)
    bad = tmp_path / "bad.parquet"
    parquet_file(bad, 10)
    spec = files_spec({"paths": [str(bad)], "format": "parquet"})
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="bad.parquet at offset 0: unreadable parquet"):
        build_datasets(spec)
    lines = tmp_path / "c.jsonl"
    lines.write_text('{"text": "fine"}\n{broken\n')
    train, _ = build_datasets(files_spec({"paths": [str(lines)], "format": "jsonl"}))
    with pytest.raises(DataError, match="c.jsonl at offset 17: line 2 is not JSON"):
        train[1]



def test_large_datasets_use_a_constant_memory_permutation_with_the_same_contract(tmp_path):
    from workers.data.permutation import FeistelPermutation

    for n in (1, 3, 1000, 4099):
        assert sorted(FeistelPermutation(n, 5)[i] for i in range(n)) == list(range(n))
    train, _ = build_datasets(files_spec({"paths": [token_shards(tmp_path, 2, 2000)]}))
    big = GlobalBatches(train, 16, seed=1, randperm_limit=10)  # 248 samples: above the limit
    epoch = [i for step in range(16) for i in big.indices(step, 0, 16)][:len(train)]
    assert sorted(epoch) == list(range(len(train)))  # every sample once per epoch
    assert epoch != sorted(epoch)
    feed = MapFeed(big, LoaderSpec(num_workers=0), CPU, 1, 2, 4)
    first = feed.micro_batches(3)[0][0]  # rank 1's first micro-batch: positions 8..11 of step 3
    assert torch.equal(first, torch.stack([train[i][0] for i in big.indices(3, 8, 4)]))


def test_text_files_are_byte_windows(tmp_path):
    text = b"the quick brown fox jumps over the lazy dog " * 4
    (tmp_path / "book.txt").write_bytes(text)
    train, _ = build_datasets(files_spec({"paths": [str(tmp_path / "book.txt")], "format": "text"}))
    assert len(train) == (len(text) - 1) // 16
    x, y = train[1]
    assert bytes(x.tolist()) == text[16:32] and bytes(y.tolist()) == text[17:33]


def test_a_local_hugging_face_tokenizer_tokenises_records(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2, "again": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words).save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "r.jsonl").write_text('{"text": "hello world again hello"}\n{"text": [3, 2, 1]}\n')
    train, _ = build_datasets(spec_of(data={"files": {"paths": [str(tmp_path / "r.jsonl")], "format": "jsonl",
                                                      "seq_len": 4}, "tokenizer": str(tmp_path / "tok")}))
    assert train[0][0].tolist() == [1, 2, 3, 0] and train[0][1].tolist() == [2, 3, 1, -100]
    assert train[1][0].tolist() == [3, 2, 0, 0]  # a list of ids is taken as it is

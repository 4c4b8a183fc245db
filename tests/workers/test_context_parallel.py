"""Context parallelism (workers/parallel/context): a sequence sharded over cp ranks in load-balanced causal
chunks, attention as ring attention. Each ring case runs on real gloo ranks in spawned processes (no Ray)
and is compared with the single-process computation, which every rank repeats from the same seed."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.workers.gloo_ranks import spawn_ranks
from workers.parallel.context import (
    all_reduce_gradients,
    apply_context_parallel,
    cp_mean_loss,
    ring_attention,
    sequence_positions,
    shard_sequence,
    unshard_sequence,
)


def test_shards_are_chunks_r_and_mirror_and_round_trip():
    x = torch.arange(2 * 16 * 3).view(2, 16, 3)  # sequence dim 1
    parts = [shard_sequence(x, 1, r, 4) for r in range(4)]
    assert [p[0, :, 0].tolist() for p in parts][1] == [6, 9, 36, 39]  # chunks 1 and 6 (of 8, 2 tokens each)
    assert torch.equal(unshard_sequence(parts, 1), x)
    for r, part in enumerate(parts):
        positions = sequence_positions(16, r, 4)
        assert torch.equal(part, x[:, positions])  # the positions are where the tokens came from
    # every rank gets the same causal work: the keys its queries see sum to the same count
    work = [int((sequence_positions(16, r, 4) + 1).sum()) for r in range(4)]
    assert len(set(work)) == 1, work
    assert torch.equal(shard_sequence(x, 1, 0, 1), x)


def test_a_sequence_that_2cp_does_not_divide_is_refused_by_name():
    with pytest.raises(ValueError, match=r"data\.seq_len 12 .*2 x parallel\.cp = 8"):
        shard_sequence(torch.zeros(1, 12), 1, 0, 4)
    with pytest.raises(ValueError, match="2 x cp to divide the sequence length"):
        sequence_positions(10, 1, 3)


def test_attention_dropout_is_refused():
    from workers.models.description import describe
    from workers.models.gpt import GPT

    with pytest.raises(ValueError, match="context parallelism needs model.dropout 0"):
        ring_attention(*(torch.zeros(1, 1, 2, 4) for _ in range(3)), dropout_p=0.1)
    model = GPT(vocab_size=16, seq_len=8, n_layers=1, d_model=8, n_heads=2, dropout=0.1)
    with pytest.raises(ValueError, match="context parallelism needs model.dropout 0"):
        apply_context_parallel(model, describe(model), None)


def _init(rank, world, port):
    torch.set_num_threads(1)  # the ranks share the host's cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _ring(rank, world, port, queue, tile_rows=None):
    """Largest difference from causal SDPA, output and q/k/v grads, with and without grouped kv heads;
    `tile_rows`: query rows per tile (below a rank's 16 local rows: several tiles, some skipped)."""
    from workers.parallel.context import ring_attention as module

    _init(rank, world, port)
    if tile_rows is not None:
        module.TILE_ROWS = tile_rows
    errors = []
    for kv_heads in (4, 2):
        torch.manual_seed(kv_heads)
        q = torch.randn(2, 4, 8 * world, 8, dtype=torch.float64, requires_grad=True)
        k, v = (torch.randn(2, kv_heads, 8 * world, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
        grad = torch.randn_like(q)
        reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != 4)
        reference.backward(grad)
        reference = reference.detach()
        mine = [shard_sequence(t.detach(), 2, rank, world).requires_grad_() for t in (q, k, v)]
        out = ring_attention(*mine)
        out.backward(shard_sequence(grad, 2, rank, world))
        errors.append(float((out.detach() - shard_sequence(reference, 2, rank, world)).abs().max()))
        errors += [float((m.grad - shard_sequence(t.grad, 2, rank, world)).abs().max())
                   for m, t in zip(mine, (q, k, v), strict=True)]
    queue.put((rank, errors))
    dist.destroy_process_group()


@pytest.mark.parametrize(("cp", "tile_rows"), [(2, None), (4, None), (2, 3), (4, 4)])
def test_ring_attention_forward_and_backward_equal_causal_sdpa(cp, tile_rows):
    for rank, errors in spawn_ranks(_ring, cp, tile_rows):
        assert max(errors) < 1e-10, (rank, errors)


def _gpt(seq_len, n_layers=2):
    from workers.models.gpt import GPT

    torch.manual_seed(0)
    return GPT(vocab_size=256, seq_len=seq_len, n_layers=n_layers, d_model=32, n_heads=4)


def _train_gpt(rank, world):
    """Per step: the single-process loss and the cp group's (the ranks' shares summed)."""
    from workers.models.description import describe

    reference = _gpt(32)
    sharded = apply_context_parallel(copy.deepcopy(reference), describe(reference), None)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (reference, sharded)]
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(12):
        starts = torch.randint(0, 256, (2, 1), generator=data)
        tokens = (starts + torch.arange(33)) % 256  # learnable: each token's successor
        inputs, targets = tokens[:, :-1], tokens[:, 1:]  # shifted before sharding
        loss = F.cross_entropy(reference(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        logits = sharded(shard_sequence(inputs, 1, rank, world))
        mine = shard_sequence(targets, 1, rank, world)
        share = cp_mean_loss(F.cross_entropy(logits.flatten(0, 1), mine.flatten(), reduction="sum"), mine.numel())
        share.backward()
        all_reduce_gradients(sharded.parameters())
        total = share.detach().clone()
        dist.all_reduce(total)
        for opt in optimizers:
            opt.step()
            opt.zero_grad()
        losses.append((loss.item(), total.item()))
    return losses


def saved_bytes(run) -> int:
    """Bytes of the distinct tensors autograd saves for the backward while `run()` builds the graph."""
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(storages.values())


def _gpt_saved_bytes(rank, world):
    from workers.models.description import describe

    model = _gpt(1024, n_layers=1)
    tokens = torch.randint(0, 256, (1, 1025), generator=torch.Generator().manual_seed(2))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    whole = saved_bytes(lambda: F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten()))
    apply_context_parallel(model, describe(model), None)
    mine = shard_sequence(targets, 1, rank, world)
    part = saved_bytes(lambda: cp_mean_loss(F.cross_entropy(
        model(shard_sequence(inputs, 1, rank, world)).flatten(0, 1), mine.flatten(), reduction="sum"), mine.numel()))
    return whole, part


def _llama_grads(rank, world):
    """Largest differences from the single-process Llama: loss (group sum) and parameter gradients."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from workers.models.description import describe

    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False,
                         initializer_range=0.2)  # weights large enough that positions matter
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    sharded = apply_context_parallel(copy.deepcopy(reference), describe(reference), None)
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(3))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    loss = F.cross_entropy(reference(input_ids=inputs).logits.flatten(0, 1), targets.flatten())
    loss.backward()
    mine = shard_sequence(targets, 1, rank, world)
    logits = sharded(input_ids=shard_sequence(inputs, 1, rank, world)).logits
    share = cp_mean_loss(F.cross_entropy(logits.flatten(0, 1), mine.flatten(), reduction="sum"), mine.numel())
    share.backward()
    all_reduce_gradients(sharded.parameters())
    total = share.detach().clone()
    dist.all_reduce(total)
    grad_error = max(float((a.grad - b.grad).abs().max())
                     for a, b in zip(reference.parameters(), sharded.parameters(), strict=True))
    return abs(loss.item() - total.item()), grad_error, sharded.config._attn_implementation


def _models(rank, world, port, queue):
    _init(rank, world, port)
    queue.put((rank, {"gpt": _train_gpt(rank, world), "memory": _gpt_saved_bytes(rank, world),
                      "llama": _llama_grads(rank, world)}))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def cp2_models():
    """The model cases share one spawn of two ranks (spawning and importing dominate their time)."""
    return dict(spawn_ranks(_models, 2))


def test_gpt_trains_under_cp2_as_in_one_process(cp2_models):
    for rank, results in cp2_models.items():
        losses = results["gpt"]
        assert all(abs(a - b) < 1e-4 for a, b in losses), (rank, losses)
        assert losses[-1][0] < losses[0][0] - 0.1, losses  # it learned: the steps were not all the same


def test_llama_loss_and_grads_under_cp2_equal_one_process(cp2_models):
    for rank, results in cp2_models.items():
        loss_error, grad_error, attention = results["llama"]
        assert attention == "trainyard_ring", attention
        assert loss_error < 1e-4 and grad_error < 1e-4, (rank, loss_error, grad_error)


def test_cp2_saves_at_most_three_quarters_of_the_activations_per_rank(cp2_models):
    for rank, results in cp2_models.items():
        whole, part = results["memory"]
        assert part <= 0.75 * whole, (rank, part, whole, part / whole)

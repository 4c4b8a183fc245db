"""Expert parallelism for Hugging Face MoE models (tiny Mixtral and Qwen3-MoE, built from configs) on real gloo
ranks, against one process that runs every micro-batch with all experts; their telemetry and aux loss."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn import functional as F

from tests.workers.expert_ranks import one_thread, train_shared_averaged  # noqa: F401 - autouse fixture
from tests.workers.gloo_ranks import spawn_ranks
from tests.workers.test_expert_parallel import ep_mesh, hand_over, init, local_grads, taken
from workers.models.hf_moe import hf_experts_modules
from workers.models.moe_loss import with_aux_loss
from workers.parallel.expert_parallel import all_to_all_bytes, apply_expert_parallel, expert_parameters

VOCAB, SEQ, WORLD = 64, 8, 2
EXPERT = (".gate_up_proj", ".down_proj")




def build(family: str, experts: int = 4, dtype=torch.float64):
    """A tiny model; the eager experts forward because transformers' default (grouped_mm) has no float64."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    config: Any
    cls: Any
    common: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, num_experts_per_tok=2, use_cache=False,
                                  router_aux_loss_coef=0.1)
    if family == "mixtral":
        config, cls = MixtralConfig(intermediate_size=24, num_local_experts=experts, **common), MixtralForCausalLM
    else:
        config = Qwen3MoeConfig(intermediate_size=24, moe_intermediate_size=12, num_experts=experts,
                                norm_topk_prob=True, **common)
        cls = Qwen3MoeForCausalLM
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    return cls(config).to(dtype)


def micro_batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ + 1), generator=torch.Generator().manual_seed(100 * step + rank))


def ce(out, batch):
    return F.cross_entropy(out.logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))


def forward_backward(model, batch, scale: float = 1.0):
    loss_fn = with_aux_loss(ce, model)  # before the forward, as the trainer does: its hooks record the routers
    out = model(input_ids=batch[:, :-1])
    loss = loss_fn(out, batch)
    (loss * scale).backward()
    return out.logits.detach(), loss.detach()


def refusal(family: str):
    try:
        apply_expert_parallel(build(family, experts=3), ep_mesh(WORLD))
    except ValueError as e:
        return str(e)
    return None


def train(model, steps: int, rank: int, world: int) -> list[float]:
    return train_shared_averaged(model, steps, rank, world, forward_backward, micro_batch)


STEPS = 12


def hf_rank(rank, world, port, queue, out_dir):
    init(rank, world, port)
    results = {}
    for family in ("mixtral", "qwen3"):
        model = apply_expert_parallel(build(family), ep_mesh(world))
        out, loss = forward_backward(model, micro_batch(0, rank))
        layers = [m for m, _ in hf_experts_modules(model)]
        results[family] = dict(out=out, loss=loss, grads=local_grads(model),
                               offsets=[m.expert_offset for m in layers],
                               routed=[m.tokens_per_expert for m in layers], bytes=all_to_all_bytes(model),
                               experts=len(expert_parameters(model)),
                               # global shape and placement of each shard (DCP reshards by these)
                               sharding=[(tuple(p.shape), str(p.placements)) for p in expert_parameters(model)])
        results[family + " refused"] = refusal(family)
        if family == "mixtral":  # a distributed checkpoint of the ep2 shards, loaded whole in the test
            import torch.distributed.checkpoint as dcp

            results["dcp"] = f"{out_dir}/dcp"
            dcp.save(model.state_dict(), checkpoint_id=results["dcp"])
    model = apply_expert_parallel(build("mixtral", dtype=torch.float32), ep_mesh(world))
    results["losses"] = train(model, STEPS, rank, world)
    hand_over(queue, rank, out_dir, results)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """One spawn for every check here: each rank imports transformers, the slow part on this host."""
    return taken(spawn_ranks(hf_rank, WORLD, str(tmp_path_factory.mktemp("hf_ep"))))


@pytest.mark.parametrize("family", ["mixtral", "qwen3"])
def test_ep2_matches_one_process_with_all_experts(ranks, family):
    model = build(family)
    runs = [forward_backward(model, micro_batch(0, r)) for r in range(WORLD)]
    per_rank = [ranks[r][family] for r in range(WORLD)]
    for r in range(WORLD):
        torch.testing.assert_close(per_rank[r]["out"], runs[r][0], rtol=0, atol=1e-10)
        torch.testing.assert_close(per_rank[r]["loss"], runs[r][1], rtol=0, atol=1e-10)
        assert per_rank[r]["offsets"] == [2 * r, 2 * r]
        assert per_rank[r]["experts"] == 4  # 2 layers x (gate_up_proj, down_proj)
        assert all(shape[0] == 4 and placements == "(Shard(dim=0),)" for shape, placements in per_rank[r]["sharding"])
    for name, p in model.named_parameters():
        if name.endswith(EXPERT):  # each owner holds its slice, gathered in rank order
            assert per_rank[0]["grads"][name].shape[0] == 2
            got = torch.cat([per_rank[r]["grads"][name] for r in range(WORLD)])
        else:  # replicated: the caller sums (or averages) them over the group
            got = sum(per_rank[r]["grads"][name] for r in range(WORLD))
        torch.testing.assert_close(got, p.grad, rtol=0, atol=1e-10, msg=name)
    for r, other in ((0, 1), (1, 0)):  # counts of the 2 remote experts and the rows both ways, 2 layers
        rows = sum(int(per_rank[r]["routed"][i][2 * other:2 * other + 2].sum()
                       + per_rank[other]["routed"][i][2 * r:2 * r + 2].sum()) for i in range(2))
        assert per_rank[r]["bytes"] == 2 * 2 * 8 + rows * 16 * 8


@pytest.mark.parametrize("family", ["mixtral", "qwen3"])
def test_tokens_per_expert_counts_every_assignment(ranks, family):
    for r in range(WORLD):
        for routed in ranks[r][family]["routed"]:
            assert routed.shape == (4,) and routed.dtype == torch.int64
            assert int(routed.sum()) == 2 * SEQ * 2  # tokens * top_k
    model = build(family)  # without ep too
    forward_backward(model, micro_batch(0, 0))
    assert all(int(m.tokens_per_expert.sum()) == 2 * SEQ * 2 for m, _ in hf_experts_modules(model))


@pytest.mark.parametrize("family, field", [("mixtral", "num_local_experts"), ("qwen3", "num_experts")])
def test_experts_not_divisible_by_ep_is_refused(ranks, family, field):
    for r in range(WORLD):
        refused = ranks[r][family + " refused"]
        assert refused is not None and f"model.hf.config.{field}=3" in refused and "parallel.ep=2" in refused


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_ep2_checkpoint_loads_into_the_whole_model(ranks):
    import torch.distributed.checkpoint as dcp

    want = build("mixtral").state_dict()
    state = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp.load(state, checkpoint_id=ranks[0]["dcp"])  # one process: every expert from its owner's shard
    for name, value in want.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=name)


def test_ep2_training_follows_one_process(ranks):
    model = build("mixtral", dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(STEPS):
        opt.zero_grad()
        want = sum(forward_backward(model, micro_batch(step, r), scale=0.5)[1].item() for r in range(WORLD)) / 2
        got = (ranks[0]["losses"][step] + ranks[1]["losses"][step]) / 2
        assert got == pytest.approx(want, abs=1e-3), f"step {step}"
        opt.step()
    assert ranks[0]["losses"][-1] < ranks[0]["losses"][0]  # it learns


@pytest.mark.parametrize("family", ["mixtral", "qwen3"])
def test_with_aux_loss_adds_the_router_aux_loss(family):
    import importlib

    lbl = importlib.import_module(f"transformers.models.{family}_moe.modeling_{family}_moe" if family == "qwen3"
                                  else "transformers.models.mixtral.modeling_mixtral").load_balancing_loss_func
    model = build(family)
    batch = micro_batch(0, 0)
    plus = with_aux_loss(ce, model)
    out = model(input_ids=batch[:, :-1], output_router_logits=True)
    aux = plus(out, batch) - ce(out, batch)
    want = 0.1 * lbl(out.router_logits, 4, 2)
    assert want.item() > 0.05  # the coefficient times about top_k: a real term
    torch.testing.assert_close(aux, want.to(aux.dtype), rtol=1e-6, atol=0)
    assert aux.requires_grad  # it trains the routers
    # the model's own loss (labels and router logits) already carries it: not added twice
    own = model(input_ids=batch[:, :-1], labels=batch[:, :-1], output_router_logits=True)
    assert with_aux_loss(lambda o, _: o.loss, model)(own, None).item() == own.loss.item()


def test_hf_expert_parameters_only_once_sharded():
    """Without ep an HF model's experts are ordinary replicated parameters: DDP (which leaves
    expert_parameters to the ep reduction, run only under ep > 1) must all-reduce them."""
    assert expert_parameters(build("mixtral")) == []

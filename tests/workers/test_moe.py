"""The MoE layer against a per-token reference, its aux loss, counts and capacity; the dense GPT unchanged."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch.nn import functional as F

from workers.models.gpt import GPT, MLP
from workers.models.moe import MoE, MoEConfig
from workers.models.moe_loss import moe_aux_loss, with_aux_loss


def naive(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token at a time: softmax, top-k, renormalised gates, the chosen experts summed."""
    out, counts = torch.zeros_like(x), torch.zeros(moe.experts, dtype=torch.long)
    for t in range(x.shape[0]):
        probs = F.softmax(moe.router(x[t]), -1)
        top, chosen = probs.topk(moe.top_k)
        for gate, e in zip(top / top.sum(), chosen.tolist()):
            out[t] += gate * (F.gelu(x[t] @ moe.w1[e] + moe.b1[e]) @ moe.w2[e] + moe.b2[e])
            counts[e] += 1
    return out, counts


def moe64(experts=4, top_k=2, capacity_factor=None, d=8, seed=0) -> MoE:
    torch.manual_seed(seed)
    moe = MoE(d, experts, top_k, capacity_factor).double()
    with torch.no_grad():  # larger than the 0.02 init, so routing and gates are far from ties
        for p in moe.parameters():
            p.normal_(0, 0.5)
    return moe


@pytest.mark.parametrize("experts,top_k", [(4, 1), (4, 2), (3, 3)])
def test_routing_equals_a_per_token_loop(experts, top_k):
    moe = moe64(experts, top_k)
    x = torch.randn(2, 7, 8, dtype=torch.float64, requires_grad=True)
    got = moe(x)
    want, counts = naive(moe, x.detach().reshape(-1, 8))
    torch.testing.assert_close(got.reshape(-1, 8), want, rtol=0, atol=1e-12)
    assert torch.equal(moe.tokens_per_expert, counts)
    assert moe.tokens_per_expert.sum().item() == 14 * top_k and moe.tokens_dropped.item() == 0
    # the gradients agree too (router through the gates, experts through their rows)
    got.pow(2).sum().backward()
    mine = [p.grad.clone() for p in moe.parameters()]
    moe.zero_grad()
    naive(moe, x.detach().reshape(-1, 8))[0].pow(2).sum().backward()
    for a, b in zip(mine, (p.grad for p in moe.parameters())):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_aux_loss_by_hand():
    """3 tokens, 2 experts, top-1: probabilities (3/4, 1/4), (1/4, 3/4), (3/4, 1/4).
    f = (2/3, 1/3), P = (7/12, 5/12): aux = 2 * (2/3 * 7/12 + 1/3 * 5/12) = 19/18."""
    moe = MoE(4, 2, 1).double()
    ln3 = torch.log(torch.tensor(3.0, dtype=torch.float64))
    with torch.no_grad():
        moe.router.weight.copy_(torch.tensor([[ln3, 0, ln3, 0], [0, ln3, 0, 0]], dtype=torch.float64))
    moe(torch.eye(4, dtype=torch.float64)[:3])
    assert moe.aux_loss.item() == pytest.approx(19 / 18, abs=1e-12)
    assert moe.tokens_per_expert.tolist() == [2, 1]
    # uniform routing probabilities give 1 whatever the assignment
    with torch.no_grad():
        moe.router.weight.zero_()
    moe(torch.randn(5, 4, dtype=torch.float64))
    assert moe.aux_loss.item() == pytest.approx(1.0, abs=1e-12)


def test_capacity_drops_the_latest_overflow_to_the_residual():
    """Every token prefers expert 0; capacity ceil(1.0 * 4 * 1 / 2) = 2 keeps tokens 0 and 1 only."""
    x = torch.randn(4, 8, dtype=torch.float64).abs() + 0.1
    outs = {}
    for cf in (None, 1.0, 2.0):
        moe = moe64(experts=2, top_k=1, capacity_factor=cf)
        with torch.no_grad():
            moe.router.weight.copy_(torch.stack([torch.ones(8), -torch.ones(8)]).double())
        outs[cf] = (moe(x), moe.tokens_per_expert.tolist(), moe.tokens_dropped.item())
    full, counts, dropped = outs[None]
    assert counts == [4, 0] and dropped == 0 and bool((full.abs().sum(1) > 0).all())
    capped, counts, dropped = outs[1.0]
    assert counts == [4, 0] and dropped == 2  # counts are routed assignments, before the drops
    torch.testing.assert_close(capped[:2], full[:2], rtol=0, atol=1e-12)
    assert bool((capped[2:] == 0).all())  # the block adds nothing: the residual passes them on
    roomy, _, dropped = outs[2.0]  # capacity 4: nothing dropped, same as no capacity
    assert dropped == 0
    torch.testing.assert_close(roomy, full, rtol=0, atol=1e-12)


def test_capacity_keeps_the_other_slot_of_a_token():
    moe = moe64(experts=4, top_k=2, capacity_factor=0.5)  # capacity ceil(0.5 * 12 * 2 / 4) = 3
    x = torch.randn(12, 8, dtype=torch.float64)
    out = moe(x)
    kept = moe.tokens_per_expert.clamp(max=3)
    assert moe.tokens_dropped.item() == (moe.tokens_per_expert - kept).sum().item() > 0
    full = moe64(experts=4, top_k=2)(x)  # same weights, no capacity
    assert not torch.allclose(out, full)


DENSE_KEYS = ["tok_emb.weight", "pos_emb.weight"] + [
    f"blocks.{i}.{k}" for i in range(2) for k in (
        "ln1.weight", "ln1.bias", "attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias", "attn.v.weight",
        "attn.v.bias", "attn.proj.weight", "attn.proj.bias", "ln2.weight", "ln2.bias", "mlp.fc.weight",
        "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias")] + ["ln_f.weight", "ln_f.bias", "head.weight"]
# recorded from the dense GPT before MoE existed (commit 4bec6fb), seed 0, GPT(256, 8, 2, 16, 2)
DENSE_WEIGHTS_SHA256 = "a13808726d4985d6ba6b9d15420bd99a2e0a2779db11c0be30357eea2c9f6eab"
DENSE_OUT_SUM, DENSE_OUT_00 = -7.045678615570068, [-0.01084909401834011, -0.026263872161507607,
                                                   -0.01583503559231758, 0.03807540982961655]


def test_dense_gpt_is_unchanged():
    torch.manual_seed(0)
    m = GPT(256, 8, 2, 16, 2)
    assert list(m.state_dict()) == DENSE_KEYS
    digest = hashlib.sha256()
    for k, v in m.state_dict().items():
        digest.update(k.encode())
        digest.update(v.numpy().tobytes())
    assert digest.hexdigest() == DENSE_WEIGHTS_SHA256  # same init order, bit for bit
    with torch.no_grad():
        out = m(torch.arange(16).view(2, 8) * 7 % 256)
    assert out.sum().item() == pytest.approx(DENSE_OUT_SUM, abs=1e-4)
    torch.testing.assert_close(out[0, 0, :4], torch.tensor(DENSE_OUT_00), rtol=0, atol=1e-6)
    assert all(isinstance(b.mlp, MLP) for b in m.blocks) and moe_aux_loss(m) is None


def test_moe_gpt_and_its_loss_hook():
    torch.manual_seed(0)
    m = GPT(256, 8, 2, 16, 2, moe=MoEConfig(experts=4, top_k=2, aux_loss_weight=0.5))
    keys = list(m.state_dict())
    assert [k for k in keys if ".mlp." in k][:5] == ["blocks.0.mlp.w1", "blocks.0.mlp.b1", "blocks.0.mlp.w2",
                                                     "blocks.0.mlp.b2", "blocks.0.mlp.router.weight"]
    assert m.blocks[0].mlp.w1.shape == (4, 16, 64) and m.blocks[0].mlp.w2.shape == (4, 64, 16)
    assert [k for k in keys if ".mlp." not in k] == [k for k in DENSE_KEYS if ".mlp." not in k]
    idx = torch.randint(0, 256, (2, 8))
    out = m(idx)

    def ce(o, t):
        return F.cross_entropy(o.reshape(-1, o.shape[-1]), t.reshape(-1))

    aux = 0.5 * (m.blocks[0].mlp.aux_loss + m.blocks[1].mlp.aux_loss)
    loss = with_aux_loss(ce, m)(out, idx)
    assert loss.item() == pytest.approx(ce(out, idx).item() + aux.item(), abs=1e-6)
    loss.backward()
    assert m.blocks[0].mlp.router.weight.grad.abs().sum() > 0
    dense = GPT(256, 8, 1, 16, 2)
    assert with_aux_loss(ce, dense) is ce  # a dense model's loss is untouched

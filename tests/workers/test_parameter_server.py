"""The parameter server (workers/parallel/parameter_server/) on real Ray actors: sync is data parallelism
with dense embedding gradients (1e-4), bounded keeps a trainer within `staleness` steps of the slowest, async
never waits, only touched rows travel, shards save/restore and die with their owner (issue 50)."""

from __future__ import annotations

import copy
import math
import threading
import time

import pytest
import torch
from torch.nn import functional as F

from tests.helpers import alive_actors, wait_until
from workers.data.clicks import click_log
from workers.models.dlrm import DLRM
from workers.parallel.parameter_server import ParameterServer, RowSharding
from workers.spec.parameter_server import ParameterServerSpec

TABLES, LR = [30, 20], 0.05


def batches(step: int, trainers: int, per_trainer: int = 16):
    """Each trainer's half of step `step`'s global batch of click logs."""
    dense, sparse, clicks = click_log(2048, 4, TABLES, 1.1, 2.0, seed=1)
    start = step * trainers * per_trainer
    return [(dense[start + i * per_trainer:start + (i + 1) * per_trainer],
             sparse[start + i * per_trainer:start + (i + 1) * per_trainer],
             clicks[start + i * per_trainer:start + (i + 1) * per_trainer]) for i in range(trainers)]


def dense_params(model: DLRM) -> list[torch.Tensor]:
    return [p for name, p in model.named_parameters() if not name.startswith("tables.")]


def test_row_sharding_deals_rows_round_robin_and_back():
    sharding = RowSharding(3)
    table = torch.arange(10.0).unsqueeze(1)
    parts = [sharding.local_part(table, s) for s in range(3)]
    assert [p.shape[0] for p in parts] == [sharding.rows_on(s, 10) for s in range(3)] == [4, 3, 3]
    assert torch.equal(sharding.whole(parts), table)
    (pos0, local0), _, (pos2, local2) = sharding.split(torch.tensor([0, 5, 3, 8]))
    assert pos0.tolist() == [0, 2] and local0.tolist() == [0, 1] and pos2.tolist() == [1, 3]
    assert local2.tolist() == [1, 2]


def test_sync_matches_data_parallelism_with_dense_embedding_gradients(ray_cluster):
    torch.manual_seed(0)
    model = DLRM(4, TABLES, 8, 16, 16)
    reference = copy.deepcopy(model)
    ref_opt = [torch.optim.Adagrad(reference.tables.parameters(), lr=LR),
               torch.optim.SGD(dense_params(reference), lr=LR)]
    trainers = [copy.deepcopy(model) for _ in range(2)]
    opts = [torch.optim.SGD(dense_params(t), lr=LR) for t in trainers]
    ps = ParameterServer.start([t.weight for t in model.tables], ParameterServerSpec(shards=2, mode="sync"), 2)
    clients = [ps.client(i) for i in range(2)]
    try:
        for step in range(10):
            halves = batches(step, 2)
            # The reference: one model, dense gradients of the global batch's mean loss.
            ref_loss = sum(F.binary_cross_entropy_with_logits(reference(d, s), c) for d, s, c in halves) / 2
            ref_loss.backward()
            for opt in ref_opt:
                opt.step()
                opt.zero_grad()
            pulled, losses = [], []
            for client, trainer, (d, s, c) in zip(clients, trainers, halves):
                rows = client.pull(step, [s])
                assert rows.staleness == 0
                loss = F.binary_cross_entropy_with_logits(trainer(d, s, rows=rows.lookup(s)), c)
                loss.backward()
                pulled.append(rows)
                losses.append(loss.item())
            for params in zip(*(dense_params(t) for t in trainers)):  # the dense all-reduce (mean)
                mean = sum(p.grad for p in params) / 2
                for p in params:
                    p.grad = mean.clone()
            for opt in opts:
                opt.step()
                opt.zero_grad()
            for client, rows in zip(clients, pulled):
                client.push(step, rows, LR)
            assert sum(losses) / 2 == pytest.approx(float(ref_loss), abs=1e-4)
        for got, want in zip(ps.tables(), reference.tables):
            assert torch.allclose(got, want.weight.detach(), atol=1e-4), (got - want.weight).abs().max()
        for got, want in zip(dense_params(trainers[0]), dense_params(reference)):
            assert torch.allclose(got, want, atol=1e-4)
        stats = ps.stats()
        touched = sum(len(torch.unique(s[:, t])) for step in range(10) for _, s, _ in batches(step, 2)
                      for t in range(len(TABLES)))
        assert sum(s["rows_pushed"] for s in stats) == touched  # only the rows a batch touched travel
        assert touched < 10 * 2 * sum(TABLES)
    finally:
        ps.shutdown()


def run_trainers(ps: ParameterServer, steps: int, delays: list[float]) -> tuple[list[list[int]], list[list[float]]]:
    """Trainers in threads, each with its own dense copy, trainer i sleeping delays[i] per step: their
    observed staleness and loss per step."""
    torch.manual_seed(0)
    model = DLRM(4, TABLES, 8, 16, 16)
    stale: list[list[int]] = [[] for _ in delays]
    losses: list[list[float]] = [[] for _ in delays]

    def trainer(i: int) -> None:
        local = copy.deepcopy(model)
        opt = torch.optim.Adam(dense_params(local), lr=1e-2)
        client = ps.client(i)
        for step in range(steps):
            d, s, c = batches(step % 30, len(delays))[i]
            rows = client.pull(step, [s])
            loss = F.binary_cross_entropy_with_logits(local(d, s, rows=rows.lookup(s)), c)
            loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(delays[i])
            client.push(step, rows, 0.2)
            stale[i].append(rows.staleness)
            losses[i].append(float(loss))

    threads = [threading.Thread(target=trainer, args=(i,)) for i in range(len(delays))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return stale, losses


@pytest.mark.parametrize("mode", ["bounded", "async"])
def test_bounded_waits_within_its_staleness_and_async_never_waits_and_both_train(ray_cluster, mode):
    spec = ParameterServerSpec(shards=2, mode=mode, staleness=2 if mode == "bounded" else None)
    torch.manual_seed(0)
    ps = ParameterServer.start([t.weight for t in DLRM(4, TABLES, 8, 16, 16).tables], spec, 2)
    try:
        stale, losses = run_trainers(ps, 60, delays=[0.0, 0.03])
    finally:
        ps.shutdown()
    assert all(len(x) == 60 for x in stale), "a trainer did not finish"
    fast = max(stale[0])
    if mode == "bounded":
        assert fast == 2, stale[0]  # it ran ahead as far as allowed, and no further
    else:
        assert fast > 2, stale[0]  # nothing held it back
    for trainer in losses:
        assert sum(trainer[-10:]) / 10 < sum(trainer[:10]) / 10, trainer


def test_shards_save_restore_and_die_with_shutdown(ray_cluster):
    pg = ray_cluster.util.placement_group([{"CPU": 1}], strategy="PACK")
    ray_cluster.get(pg.ready(), timeout=60)
    tables = [torch.randn(n, 4) for n in TABLES]
    ps = ParameterServer.start(tables, ParameterServerSpec(shards=3, mode="async"), 1, name="ps-test",
                               placement_group=pg)
    try:
        assert {a["Name"] for a in alive_actors() if a["Name"].startswith("ps-test")} == \
            {f"ps-test-shard-{i}" for i in range(3)}
        client = ps.client(0)
        sparse = torch.tensor([[1, 2], [4, 2]])
        rows = client.pull(0, [sparse])
        rows.lookup(sparse)[0].sum().backward()
        assert client.push(0, rows, 0.5) == 2 + 1  # the distinct ids of each table: {1, 4} and {2}
        saved, blob = ps.tables(), ps.save()
        rows = client.pull(1, [sparse])
        (rows.lookup(sparse)[1] ** 2).sum().backward()
        client.push(1, rows, 0.5)
        assert not torch.equal(ps.tables()[1], saved[1])
        ps.restore(blob)
        assert all(torch.equal(a, b) for a, b in zip(ps.tables(), saved))
        assert not torch.equal(saved[0], tables[0])  # the first push changed the rows it touched ...
        assert torch.equal(saved[0][[0, 3, 5]], tables[0][[0, 3, 5]])  # ... and no other
    finally:
        ps.shutdown()
        ray_cluster.util.remove_placement_group(pg)
    assert wait_until(lambda: not [a for a in alive_actors() if a["Name"].startswith("ps-test")], 30)


def test_a_lost_trainer_holds_no_clock_up_and_finishing_waits_for_the_live_ones():
    from workers.parallel.parameter_server.clock import StepClock

    clock = StepClock(3, "async", clocks=[7, 2, 5])
    assert clock.slowest == 2 and clock.staleness_of(7) == 5
    clock.leave(1)  # async: the supervisor says trainer 1 is lost
    assert clock.live == [0, 2] and clock.slowest == 5 and clock.staleness_of(7) == 2
    assert not clock.finished(7) and (clock.advance(2, 6) or clock.finished(7))


def test_async_shards_let_a_trainer_leave_and_rejoin_and_end_with_their_placement_group(ray_cluster):
    from workers.parallel.parameter_server.names import named_shards

    pg = ray_cluster.util.placement_group([{"CPU": 1}], strategy="PACK")
    ray_cluster.get(pg.ready(), timeout=60)
    tables = [torch.randn(n, 4) for n in TABLES] + [torch.randn(1, 6)]  # a dense parameter: one row, on shard 0
    ps = ParameterServer.start(tables, ParameterServerSpec(shards=2, mode="async"), 2, name="ps-elastic",
                               placement_group=pg)
    sparse = torch.tensor([[1, 2], [4, 3]])
    clients = [ps.client(0), ps.client(1)]
    for step in range(3):
        rows = clients[0].pull(step, [sparse], whole=1)
        (rows.lookup(sparse)[0].sum() + rows.whole(2)[0].sum()).backward()
        clients[0].push(step, rows, 0.1)
    assert rows.whole(2)[0].shape == (1, 6) and not torch.equal(ps.tables()[2], tables[2])  # trained too
    assert ps.lead() == 0
    ps.leave(0)  # trainer 0 lost: trainer 1 leads, and finishing waits for it only
    assert ps.lead() == 1
    for step in range(3):
        clients[1].push(step, clients[1].pull(step, [sparse], whole=1), 0.1)
    assert ps.finished(3) == 1
    assert ps.rejoin(0) == 3  # joins at the slowest live trainer's step: the shards' rows as they are
    assert ps.stats()[0]["left"] == []
    assert len(named_shards("ps-elastic")) == 2
    ray_cluster.util.remove_placement_group(pg)  # detached, they end with the group
    assert wait_until(lambda: not [a for a in alive_actors() if a["Name"].startswith("ps-elastic")], 30)


def test_async_clips_what_it_pushes_to_train_grad_clip_and_zeroes_a_non_finite_push():
    from workers.parallel.parameter_server.client import PulledRows

    rows = [torch.ones(3, 4, requires_grad=True), torch.ones(1, 5, requires_grad=True)]
    (rows[0].sum() * 3 + rows[1].sum() * 4).backward()  # gradients 3 (12 entries) and 4 (5 entries)
    pulled = PulledRows([torch.arange(3), torch.zeros(1, dtype=torch.long)], rows, 0)
    before = (12 * 9 + 5 * 16) ** 0.5
    assert pulled.clip_gradients(1.0) == pytest.approx(before)
    after = torch.cat([r.grad.reshape(-1) for r in rows]).norm().item()
    assert after == pytest.approx(1.0, rel=1e-4)
    assert rows[0].grad[0, 0] / rows[1].grad[0, 0] == pytest.approx(3 / 4)  # scaled together, direction kept
    assert pulled.clip_gradients(10.0) == pytest.approx(1.0, rel=1e-4)  # under the bound: left alone
    assert torch.cat([r.grad.reshape(-1) for r in rows]).norm().item() == pytest.approx(1.0, rel=1e-4)
    rows[1].grad[0, 0] = float("nan")
    assert math.isnan(pulled.clip_gradients(1.0))  # reported as is: the loop skips the step as non-finite
    assert all(float(r.grad.abs().sum()) == 0.0 for r in rows)  # nothing pushed changes a row

"""The storage tracker (workers/storage_tracker.py) on hand-made allocations: it counts each storage an op
allocates once, sees it freed, ignores views and in-place ops, follows `UntypedStorage.resize_`, and keeps
what each category held at the peak."""

from __future__ import annotations

import torch

from workers.storage_tracker import ACTIVATIONS, GRADS, OPTIMIZER, PARAMS, StorageTracker


def test_peak_is_the_high_water_mark_of_live_storages():
    tracker = StorageTracker()
    with tracker:
        a = torch.empty(250)  # 1000 bytes
        b = torch.empty(500)  # 2000 bytes: 3000 live
        del a
        c = torch.empty(100)  # 2400 live
        view = b.view(10, 50)  # no new storage
        b.add_(1.0)
        del b, c, view
        d = torch.empty(50)
        assert tracker.live_bytes == 200
    peak = tracker.peak()
    assert peak.peak_bytes == 3000
    assert peak.breakdown == {PARAMS: 0, GRADS: 0, OPTIMIZER: 0, ACTIVATIONS: 3000}
    del d


def test_registered_and_reclassified_storages_keep_their_category_at_the_peak():
    weight = torch.zeros(100)  # 400 bytes, made before the region
    tracker = StorageTracker()
    tracker.register([weight, weight.view(10, 10)], PARAMS)  # one storage, counted once
    with tracker:
        grad = weight * 2  # 400 bytes, an activation until said otherwise
        tracker.classify(grad, GRADS)
        tracker.category = OPTIMIZER
        state = torch.zeros(200)  # 800 bytes
        tracker.category = ACTIVATIONS
        scratch = torch.ones(50)  # 200 bytes: the peak, 1800
        del scratch
    peak = tracker.peak()
    assert peak.peak_bytes == 1800
    assert peak.breakdown == {PARAMS: 400, GRADS: 400, OPTIMIZER: 800, ACTIVATIONS: 200}
    assert peak.category_peaks[ACTIVATIONS] == 400  # `grad` before it was classified
    del grad, state


def test_a_storage_resized_outside_the_dispatcher_is_followed():
    """FSDP2 frees and re-allocates its unsharded parameters with UntypedStorage.resize_."""
    unsharded = torch.empty(1000)
    unsharded.untyped_storage().resize_(0)
    original = torch.UntypedStorage.resize_
    tracker = StorageTracker()
    with tracker:
        unsharded.untyped_storage().resize_(4000)
        unsharded.untyped_storage().resize_(0)
        again = torch.empty(500)  # 2000 bytes: below the 4000 of the gathered parameter
        assert tracker.live_bytes == 2000
    assert tracker.peak().peak_bytes == 4000
    assert torch.UntypedStorage.resize_ is original  # restored on exit
    del again


def test_autograd_saves_activations_the_tracker_sees():
    """A chain of 4 linear layers with ReLU keeps each layer's output for backward: the activations'
    high-water mark is at least their bytes, and backward frees them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(4)])
    x = torch.randn(32, 64)
    tracker = StorageTracker()
    tracker.register(model.parameters(), PARAMS)
    with tracker:
        model(x).sum().backward()
    peak = tracker.peak()
    layer_output = 32 * 64 * 4
    assert peak.category_peaks[ACTIVATIONS] >= 4 * layer_output
    assert peak.breakdown[PARAMS] == sum(p.numel() * 4 for p in model.parameters())


def test_views_and_writes_of_storages_made_before_are_not_allocations():
    dataset = torch.arange(10_000)  # 80 KB of int64, loaded before the step
    tracker = StorageTracker()
    with tracker:
        batch = dataset[:100].view(10, 10)  # a view: no allocation
        dataset[:5].add_(1)  # in place
        torch.mul(dataset[:5], 2, out=dataset[5:10])  # into an existing storage
        copy = batch.clone()  # 800 bytes: the one allocation
    assert tracker.peak().peak_bytes == 800
    del copy

"""The share-nothing cluster as a module-scoped fixture: one cluster per test module, stopped and checked after."""

from __future__ import annotations

import pytest

from tests.sharenothing.cluster import ShareNothingCluster


@pytest.fixture(scope="module")
def share_nothing(tmp_path_factory):
    """A head and two workers, each in its own network and mount namespaces (tests/sharenothing/cluster.py).
    Teardown asserts that no process, namespace or link of it is left."""
    bed = ShareNothingCluster(tmp_path_factory.mktemp("bed"), workers=2).start()
    yield bed
    bed.stop()


@pytest.fixture(scope="module")
def bed_client(share_nothing):
    """A Ray Client context on the bed (`with bed_client: ...`), beside any local Ray this process holds."""
    import ray
    import ray.util.client

    ctx = None
    for attempt in range(3):
        own = ray.util.client.ray.get_context()
        try:
            ctx = ray.init(share_nothing.client_address, allow_multiple=True, namespace="bed")
            break
        except ConnectionAbortedError:
            # Ray's client proxy can lose the specific server it forks for a client, intermittently (Ray issue
            # 63202: "specific_server intermittently dies during fork()"). A failed connect leaves this thread on
            # the dead client's context, so every later ray call of the process fails: put ours back, try again.
            ray.util.client.ray.set_context(own)
            if attempt == 2:
                raise
    assert ctx is not None
    # Disconnected by the cluster's stop, before the nodes go (a client left behind waits for a gone head),
    # and only once: a second disconnect may shut down this process's own local Ray.
    share_nothing.on_stop(ctx.disconnect)
    yield ctx

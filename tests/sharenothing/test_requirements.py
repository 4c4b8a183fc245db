"""Where the bed cannot be built, it fails and says why: never a silent skip."""

from __future__ import annotations

import pytest

from tests.sharenothing import network
from tests.sharenothing.network import BedUnavailable, require_netns


def test_without_root_the_bed_fails_by_name(monkeypatch):
    monkeypatch.setattr(network.os, "geteuid", lambda: 1000)
    with pytest.raises(BedUnavailable, match="needs root"):
        require_netns()


def test_without_iproute2_the_bed_fails_by_name(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BedUnavailable, match="iproute2"):
        require_netns()


def test_here_network_namespaces_are_available():
    require_netns()  # this machine runs the bed: root, iproute2, util-linux

"""The test bed's network: one Linux bridge in the root namespace and one network namespace per node,
joined to it by a veth pair, on a private /24 that no other interface of the machine uses.

The root namespace holds the bridge's address (`host_ip`): the control plane and the services the
tests start (an S3 server, ...) listen there, and every node reaches it through its default route.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field


class BedUnavailable(RuntimeError):
    """This machine cannot build the test bed (no root, no iproute2, no network namespaces)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def require_netns() -> None:
    """Fail, by name, where network namespaces cannot be made: the bed never skips itself."""
    if os.geteuid() != 0:
        raise BedUnavailable("the share-nothing test bed needs root (network and mount namespaces)")
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            raise BedUnavailable(f"the share-nothing test bed needs `{tool}` (Debian: iproute2, util-linux; "
                                 "`make netns-tools` installs them)")
    probe = f"typrobe{os.getpid() % 100000}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        raise BedUnavailable(f"network namespaces are unavailable here: `ip netns add` said {made.stderr.strip()}")
    ip("netns", "del", probe, check=False)


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.231.x.0/24 that no address or route of the root namespace overlaps (another bed may be running)."""
    used = ip("-4", "-o", "addr").stdout + ip("-4", "route").stdout
    for third in range(1, 255):
        net = ipaddress.IPv4Network(f"10.231.{third}.0/24")
        if f"10.231.{third}." not in used:
            return net
    raise BedUnavailable("no free 10.231.x.0/24 subnet for the test bed")


@dataclass
class Network:
    """Bridge `<tag>br` (host side) and namespaces `<tag>-<node>`; interface names stay under 15 characters."""

    tag: str
    subnet: ipaddress.IPv4Network = field(default_factory=free_subnet)
    namespaces: dict[str, str] = field(default_factory=dict)  # node name -> namespace
    addresses: dict[str, str] = field(default_factory=dict)  # node name -> its IP

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    @property
    def host_ip(self) -> str:
        return str(self.subnet.network_address + 1)

    def create_bridge(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.host_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add_node(self, name: str) -> str:
        """A namespace with loopback, one veth on the bridge and a default route to the host; returns its IP."""
        index = len(self.namespaces)
        ns, address = f"{self.tag}-{name}", str(self.subnet.network_address + 10 + index)
        host_end, node_end = f"{self.tag}h{index}", f"{self.tag}n{index}"
        ip("netns", "add", ns)
        self.namespaces[name], self.addresses[name] = ns, address
        ip("link", "add", host_end, "type", "veth", "peer", "name", node_end)
        ip("link", "set", host_end, "master", self.bridge, "up")
        ip("link", "set", node_end, "netns", ns)
        inside = ("netns", "exec", ns, "ip")
        ip(*inside, "link", "set", "lo", "up")
        ip(*inside, "link", "set", node_end, "name", "eth0")  # one name on every node (GLOO_SOCKET_IFNAME=eth0)
        ip(*inside, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip(*inside, "link", "set", "eth0", "up")
        ip(*inside, "route", "add", "default", "via", self.host_ip)
        return address

    def delete(self, timeout_s: float = 15) -> list[str]:
        """Remove every namespace (its veth end goes with it, and so the peer) and the bridge; idempotent.
        The kernel frees a deleted namespace's links asynchronously: wait, and return what is left."""
        for ns in self.namespaces.values():
            ip("netns", "del", ns, check=False)
        ip("link", "del", self.bridge, check=False)
        deadline = time.monotonic() + timeout_s
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def leftovers(self) -> list[str]:
        """What of this network still exists: namespaces and links carrying the tag."""
        spaces = [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]
        links = [line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link").stdout.splitlines()]
        return [n for n in spaces + links if n.startswith(self.tag)]

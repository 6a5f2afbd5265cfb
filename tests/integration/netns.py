"""Several "hosts" on one machine: Linux network namespaces joined by a bridge (needs root).

Each node is a namespace with one veth link (`eth0`, an address in a private 10.x/24) to a bridge
that lives in its own "switch" namespace, so the host's firewall never sees the traffic. The root
namespace (where the test runs) gets a port on the bridge too, so tests talk to every node directly.
Cutting a node's link sets the switch side of its veth down: the node's sockets stay open but no
packet gets through in either direction, as when a cable is pulled or a host freezes.

All names carry a random suffix; `close()` deletes every namespace and link it made, and is safe to
call after a partial set-up.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def netns_unavailable() -> str | None:
    """Why namespaces cannot be used here, or None when they can (a namespace is made and deleted)."""
    name = f"omni-probe-{secrets.token_hex(3)}"
    try:
        made = ip("netns", "add", name, check=False)
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed"
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    try:
        up = ip("-n", name, "link", "set", "lo", "up", check=False)
        if up.returncode != 0:
            return f"cannot configure a network namespace: {up.stderr.strip()}"
        pair = ip(
            "link", "add", f"vp{name[-6:]}", "type", "veth", "peer", "name", f"vq{name[-6:]}", check=False
        )
        if pair.returncode != 0:
            return f"cannot create veth pairs: {pair.stderr.strip()}"
        ip("link", "del", f"vp{name[-6:]}", check=False)
    finally:
        ip("netns", "del", name, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.x.y.0/24 that no route or address of the root namespace touches."""
    used = [
        ipaddress.ip_network(word, strict=False)
        for line in ip("-4", "route", "show", "table", "all").stdout.splitlines()
        + ip("-4", "-o", "addr").stdout.splitlines()
        for word in line.split()
        if word[:1].isdigit() and ("/" in word or word.count(".") == 3)
    ]
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{random.randint(128, 254)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet")


@dataclass
class Node:
    name: str
    netns: str
    address: str
    switch_port: str  # the switch side of its veth: set down to cut the node off

    def wrap(self) -> list[str]:
        """Prefix for a command that should run on this node."""
        return ["ip", "netns", "exec", self.netns]


class Network:
    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.subnet = _free_subnet()
        self._hosts = self.subnet.hosts()
        self.switch = f"omni-sw-{self.tag}"
        self.nodes: dict[str, Node] = {}
        self._namespaces: list[str] = []
        self._root_links: list[str] = []
        self.root_address = ""

    def _next_address(self) -> str:
        return str(next(self._hosts))

    def start(self) -> None:
        self._add_namespace(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        # The root namespace's own port on the bridge: the test reaches every node through it.
        root_link, switch_port = f"or{self.tag}", f"sr{self.tag}"
        ip("link", "add", root_link, "type", "veth", "peer", "name", switch_port)
        self._root_links.append(root_link)
        self._plug(switch_port)
        self.root_address = self._next_address()
        ip("addr", "add", f"{self.root_address}/{self.subnet.prefixlen}", "dev", root_link)
        ip("link", "set", root_link, "up")

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self._namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _plug(self, switch_port: str) -> None:
        ip("link", "set", switch_port, "netns", self.switch)
        ip("-n", self.switch, "link", "set", switch_port, "master", "br0")
        ip("-n", self.switch, "link", "set", switch_port, "up")

    def add_node(self, name: str) -> Node:
        index = len(self.nodes)
        netns = f"omni-{name}-{self.tag}"
        self._add_namespace(netns)
        inside, switch_port = f"oi{index}{self.tag}", f"os{index}{self.tag}"
        ip("link", "add", inside, "type", "veth", "peer", "name", switch_port)
        self._root_links.append(inside)  # until it moves into its namespace
        ip("link", "set", inside, "netns", netns)
        self._root_links.remove(inside)
        self._plug(switch_port)
        address = self._next_address()
        ip("-n", netns, "link", "set", inside, "name", "eth0")
        ip("-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip("-n", netns, "link", "set", "eth0", "up")
        node = Node(name, netns, address, switch_port)
        self.nodes[name] = node
        return node

    def cut(self, name: str) -> None:
        ip("-n", self.switch, "link", "set", self.nodes[name].switch_port, "down")

    def restore(self, name: str) -> None:
        ip("-n", self.switch, "link", "set", self.nodes[name].switch_port, "up")

    def close(self) -> None:
        # Deleting a namespace deletes the veth ends inside it, and with them their peers.
        for netns in reversed(self._namespaces):
            ip("netns", "del", netns, check=False)
        for link in self._root_links:
            with contextlib.suppress(Exception):
                ip("link", "del", link, check=False)
        self._namespaces.clear()
        self._root_links.clear()

    def leftovers(self) -> list[str]:
        """Namespaces or links of this network that still exist (empty after close())."""
        names = ip("netns", "list").stdout + ip("-o", "link").stdout
        return sorted({word for word in names.split() if self.tag in word})


@contextlib.contextmanager
def network_of(*names: str) -> Iterator[Network]:
    """A started Network with a node per name, closed afterwards (also when set-up or the body
    failed), and nothing of it left behind."""
    net = Network()
    try:
        net.start()
        for name in names:
            net.add_node(name)
        yield net
    finally:
        net.close()
    assert not net.leftovers(), f"left behind: {net.leftovers()}"

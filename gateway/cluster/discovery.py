"""Where a stage's replicas are: a configured entry parsed as a fixed address or a DNS name, and
the look-up of a name's addresses (what `gateway.cluster.replicas.Replicas` re-runs every discovery round).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

# (host, port) -> ["ip:port", ...]; raises OSError when the name cannot be looked up right now.
Resolver = Callable[[str, int], Awaitable[list[str]]]

DNS_SCHEME = "dns:"


@dataclass(frozen=True)
class Target:
    """One configured entry of a stage: a fixed address, or a DNS name to look up periodically."""

    stage: str
    entry: str
    host: str
    port: int
    dynamic: bool

    @classmethod
    def parse(cls, stage: str, entry: str) -> Target:
        text = entry.strip()
        explicit_dns = text.startswith(DNS_SCHEME)
        if explicit_dns:
            # dns:///name:port, or dns://authority/name:port (the authority is the system's resolver)
            text = text[len(DNS_SCHEME) :].lstrip("/")
            if "/" in text:
                text = text.split("/", 1)[1]
        elif text.startswith("unix:"):
            return cls(stage, entry, text, 0, False)
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{stage} replica {entry!r}: expected host:port")
        host = host.strip("[]")
        try:
            ipaddress.ip_address(host)
            is_ip = True
        except ValueError:
            is_ip = False
        if explicit_dns and is_ip:
            raise ValueError(f"{stage} replica {entry!r}: dns: needs a name, not an address")
        return cls(stage, entry, host, int(port), not is_ip)

    @property
    def address(self) -> str:
        """The address to dial for a static entry."""
        if self.port == 0:
            return self.host
        return format_address(self.host, self.port)


def format_address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def resolve_addresses(host: str, port: int) -> list[str]:
    """All addresses of `host` (getaddrinfo in the loop's thread pool), IPv4 ones when there are any.

    A dual-stack name lists each pod under both families: taking one family keeps one replica per
    pod. A name that does not exist (a headless Service with no ready pod) resolves to no address.
    """
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_NAME:
            return []
        raise
    v4 = {str(info[4][0]) for info in infos if info[0] == socket.AF_INET}
    v6 = {str(info[4][0]) for info in infos if info[0] == socket.AF_INET6}
    return [format_address(ip, port) for ip in sorted(v4 or v6)]


_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}

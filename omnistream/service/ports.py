"""Listening ports: is one taken, and the one-line error a user sees when it is.

A busy port is an operator's problem, not a bug: the usual cause is a stack from an earlier
`omnistream up` still running. So every server turns a failed bind into `BindError`, whose message is
the whole story (which port, the likely cause, what to do), and the CLI prints it as one line
instead of a stack trace.
"""

from __future__ import annotations

import errno
import socket

LISTEN_BACKLOG = 2048  # uvicorn's default


class BindError(Exception):
    """A server could not listen on its address; the message is meant for the operator as is."""


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on `host:port`.

    Probed by binding with SO_REUSEADDR, as uvicorn and gRPC bind: that ignores sockets lingering in
    TIME_WAIT after a clean stop (they do not stop a server either) and fails only on a listener.
    Port 0 is never in use; a host that does not resolve is left for the server to report.
    """
    if port == 0:
        return False
    try:
        addresses = socket.getaddrinfo(
            _bare(host) or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return False
    for family, kind, proto, _name, sockaddr in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def in_use_message(port: int, flags: str, who: str = "omnistream") -> str:
    """The one line for a busy port: which one, the likely culprit, and the way out."""
    return f"port {port} is already in use (another {who} still running?): stop it or pass {flags}"


def bind_error(address: str, flag: str) -> BindError:
    """The error for a failed bind of `address` ("host:port", "[v6]:port"), naming the flag to change."""
    host, _, port_text = address.rpartition(":")
    port = int(port_text) if port_text.isdigit() else 0
    if port_in_use(host, port):
        return BindError(in_use_message(port, f"another {flag}"))
    return BindError(f"cannot listen on {address}: check the address and {flag}")


def listen_socket(host: str, port: int, flag: str) -> socket.socket:
    """A TCP socket bound and listening on `host:port` (port 0: any free one), or BindError.

    Bound the way uvicorn binds (SO_REUSEADDR), but listening at once: between a bare bind and the
    server's listen(), another process binding with SO_REUSEADDR could still take the port.
    """
    family = socket.AF_INET6 if ":" in _bare(host) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((_bare(host), port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise BindError(in_use_message(port, f"another {flag}")) from exc
        reason = f"cannot listen on {host}:{port} ({exc.strerror})"
        raise BindError(f"{reason}: check the address and {flag}") from exc
    return sock


def _bare(host: str) -> str:
    """`[::1]` -> `::1`: brackets belong to "host:port" strings, not to socket calls."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host

"""Throwaway network namespaces for tests, and a little traffic inside them.

    from cnichain.netns import throwaway

    with throwaway("host", "ctr") as (host, ctr):
        host.sysctl("net.ipv4.ip_forward", "1")
        print(ctr.run("ip", "-br", "link"))
    # both namespaces are gone here, also when the block raised

A namespace is a named one (`ip netns add`, under /run/netns), so `ip netns exec NAME`,
`ip -n NAME` and a CNI runtime's CNI_NETNS=/run/netns/NAME all reach it. Deleting it
removes every veth end, bridge, ifb, qdisc, nftables table and iptables rule made inside it.
Needs root and the `ip` tool (iproute2).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator

from common.netns import entered

__all__ = [
    "DEFAULT_PREFIX",
    "Netns",
    "NetnsError",
    "create",
    "delete",
    "leftovers",
    "tcp_echo_server",
    "tcp_request",
    "throwaway",
]

NETNS_DIR = "/run/netns"
DEFAULT_PREFIX = "cnit"
_created: set[str] = set()  # names this process made: what `leftovers` checks


class NetnsError(RuntimeError):
    """A command about a namespace failed (its stderr is in the message)."""


def _run(argv: list[str], check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


class Netns:
    """A named network namespace."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Netns({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Netns) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def path(self) -> str:
        """What a runtime passes as CNI_NETNS."""
        return f"{NETNS_DIR}/{self.name}"

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def run(self, *argv: str, check: bool = True) -> str:
        """Run a command (no shell) inside the namespace; its stdout. NetnsError when it
        exits non-zero and `check`."""
        return _run(["ip", "netns", "exec", self.name, *argv], check)

    def ip(self, *args: str, check: bool = True) -> str:
        """`ip -n NAME ARGS...`; its stdout."""
        return _run(["ip", "-n", self.name, *args], check)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Run the block's calling thread inside the namespace (sockets made here stay in
        it after the block)."""
        with entered(self.path):
            yield

    def socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket that lives in this namespace, usable from any thread."""
        with self.entered():
            return socket.socket(family, kind)

    def sysctl(self, key: str, value: str | None = None) -> str:
        """Read (and first write, when `value` is given) a sysctl of the namespace."""
        from common.sysctl import read_sysctl, write_sysctl

        path = "/proc/sys/" + key.replace(".", "/")
        with self.entered():
            if value is not None:
                write_sysctl(path, value)
            return read_sysctl(path).strip()


def create(role: str = "ns", prefix: str = DEFAULT_PREFIX) -> Netns:
    """A new namespace named PREFIX-ROLE-<random>, with its loopback up."""
    ns = Netns(f"{prefix}-{role}-{uuid.uuid4().hex[:10]}")
    _run(["ip", "netns", "add", ns.name])
    _created.add(ns.name)
    try:
        ns.ip("link", "set", "lo", "up")
    except NetnsError:
        delete(ns)
        raise
    return ns


def delete(ns: Netns) -> None:
    """Remove the namespace; nothing happens when it is already gone."""
    if ns.exists():
        _run(["ip", "netns", "del", ns.name], check=False)


@contextlib.contextmanager
def throwaway(*roles: str, prefix: str = DEFAULT_PREFIX) -> Iterator[list[Netns]]:
    """One fresh namespace per role for the block, all deleted afterwards (also after an
    exception, and when creating a later one failed)."""
    made: list[Netns] = []
    try:
        for role in roles:
            made.append(create(role, prefix))
        yield made
    finally:
        for ns in made:
            delete(ns)


def leftovers() -> list[str]:
    """Namespaces this process created that still exist (a leak when a test is done)."""
    return sorted(name for name in _created if os.path.exists(f"{NETNS_DIR}/{name}"))


# ---------------------------------------------------------------------------- traffic


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


@contextlib.contextmanager
def tcp_echo_server(ns: Netns, port: int, tag: bytes = b"") -> Iterator[list[str]]:
    """A TCP server in `ns` on every address (IPv4 and IPv6), port `port`, answering each
    connection's first message with `tag + message`; yields the peers' addresses as
    they connect."""
    sock = ns.socket(socket.AF_INET6, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", port))
    sock.listen(16)
    peers: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, peer = sock.accept()
            except OSError:
                return
            peers.append(str(peer[0]).removeprefix("::ffff:"))
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.sendall(tag + conn.recv(65536))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield peers
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(5)


def tcp_request(ns: Netns, addr: str, port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    """Connect from `ns` to addr:port, send `payload`, return the reply (OSError when
    nothing answers)."""
    with ns.socket(_family(addr), socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect((addr, port))
        sock.sendall(payload)
        return sock.recv(65536)

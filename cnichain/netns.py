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
    "udp_echo_server",
    "udp_request",
]

NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
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
        try:
            target = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise NetnsError(f"cannot open network namespace {self.path}: {e}") from None
        origin = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                _setns(target)
            except OSError as e:
                raise NetnsError(f"cannot enter network namespace {self.path}: {e}") from None
            try:
                yield
            finally:
                # Staying in the wrong namespace would send the rest of the process's
                # traffic and kernel changes there: nothing sensible can continue.
                try:
                    _setns(origin)
                except OSError:  # pragma: no cover - the kernel refusing our own ns
                    os._exit(70)
        finally:
            os.close(target)
            os.close(origin)

    def socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket that lives in this namespace, usable from any thread."""
        with self.entered():
            return socket.socket(family, kind)

    def sysctl(self, key: str, value: str | None = None) -> str:
        """Read (and first write, when `value` is given) a sysctl of the namespace."""
        path = "/proc/sys/" + key.replace(".", "/")
        with self.entered():
            if value is not None:
                # One write(2) for the whole value: a sysctl handler parses what a
                # single write gives it.
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, value.encode())
                finally:
                    os.close(fd)
            with open(path, "rb") as f:
                return f.read().decode("utf-8", "replace").strip()


def _setns(fd: int) -> None:
    """setns(2) of the calling thread into the network namespace `fd` (Python 3.11 has no
    os.setns)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


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


@contextlib.contextmanager
def udp_echo_server(ns: Netns, port: int, tag: bytes = b"") -> Iterator[list[str]]:
    """A UDP server in `ns` on every address (IPv4 and IPv6), port `port`, answering each
    datagram with `tag + datagram` to its sender; yields the senders' addresses as they
    arrive."""
    sock = ns.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", port))
    sock.settimeout(0.2)
    peers: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                data, peer = sock.recvfrom(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            peers.append(str(peer[0]).removeprefix("::ffff:"))
            with contextlib.suppress(OSError):
                sock.sendto(tag + data, peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield peers
    finally:
        stop.set()
        thread.join(5)
        sock.close()


def udp_request(ns: Netns, addr: str, port: int, payload: bytes, timeout: float = 5.0) -> bytes:
    """Send one datagram from `ns` to addr:port and return the first reply; OSError when
    none comes: ConnectionRefusedError when the port is closed (ICMP port unreachable),
    TimeoutError when nothing answers within `timeout`."""
    with ns.socket(_family(addr), socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.connect((addr, port))
        sock.send(payload)
        return sock.recv(65536)

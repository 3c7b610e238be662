"""Real traffic between namespaces, without leaving the test process.

A socket belongs to the network namespace it was created in, so we create it inside
`Netns.entered()` and use it from an ordinary thread afterwards: servers and clients in
any namespace, no helper processes to clean up.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cnichain.netns import tcp_echo_server, udp_echo_server
from tests.harness.netns import Netns


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


@contextmanager
def echo_server(ns: Netns, port: int, proto: str = "tcp", tag: str = "ctr") -> Iterator[list[str]]:
    """cnichain's echo server (TCP or UDP) in `ns` on every address, port `port`: it answers
    with `tag:payload` and yields the peers' addresses as they come."""
    serve = tcp_echo_server if proto == "tcp" else udp_echo_server
    with serve(ns, port, tag.encode() + b":") as peers:
        yield peers


def request(
    ns: Netns,
    dst: str,
    port: int,
    proto: str = "tcp",
    payload: bytes = b"ping",
    *,
    src: str | None = None,
    timeout: float = 3.0,
) -> bytes:
    """Send payload from `ns` to dst:port and return the reply; raises OSError on failure."""
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    with ns.entered():
        sock = socket.socket(_family(dst), kind)
    with sock:
        sock.settimeout(timeout)
        if src:
            sock.bind((src, 0))
        if proto == "tcp":
            sock.connect((dst, port))
            sock.sendall(payload)
            return sock.recv(65536)
        sock.sendto(payload, (dst, port))
        return sock.recvfrom(65536)[0]


def reaches(
    ns: Netns,
    dst: str,
    port: int,
    proto: str = "tcp",
    payload: bytes = b"ping",
    *,
    src: str | None = None,
    timeout: float = 3.0,
) -> bytes | None:
    """The reply, or None when nothing answered (refused, dropped, timed out)."""
    try:
        return request(ns, dst, port, proto, payload, src=src, timeout=timeout)
    except OSError:
        return None


def _checksum(header: bytes) -> int:
    total: int = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def localhost_datagram_arrives(
    host: Netns, sender: Netns, via: str, to: str, src: str, port: int = 7777
) -> bool:
    """Whether a UDP datagram to 127.0.0.1:`port` reaches a socket the host bound there
    when `sender` crafts it (a packet socket on its `via`, as a neighbour or a container
    with CAP_NET_RAW can; its own stack would keep 127.0.0.1 on its loopback) with source
    `src` and puts it on the link to the host's interface `to`, addressed to its MAC."""
    with host.entered():
        server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sender.entered():
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    host_mac = bytes.fromhex(
        json.loads(host.ip("-j", "link", "show", to))[0]["address"].replace(":", "")
    )
    with server, raw:
        server.bind(("127.0.0.1", port))
        server.settimeout(1.0)
        raw.bind((via, 0))
        own_mac = raw.getsockname()[4]
        payload = b"to-the-node-localhost"
        udp = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0x4000, 64, 17, 0,
                         socket.inet_aton(src), socket.inet_aton("127.0.0.1"))  # fmt: skip
        ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
        raw.send(host_mac + own_mac + b"\x08\x00" + ip + udp)
        try:
            return bool(server.recvfrom(100)[0] == payload)
        except TimeoutError:
            return False


@dataclass
class Throughput:
    bits_per_second: float
    bytes_received: int
    seconds: float


def measure_throughput(
    sender: Netns, receiver: Netns, dst: str, port: int, seconds: float = 3.0, warmup: float = 0.5
) -> Throughput:
    """TCP bulk transfer sender -> receiver; rate measured at the receiver after warmup."""
    with receiver.entered():
        lsock = socket.socket(_family(dst), socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if _family(dst) == socket.AF_INET6:
        lsock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    lsock.bind(("::" if _family(dst) == socket.AF_INET6 else "0.0.0.0", port))
    lsock.listen(1)
    counted = {"bytes": 0, "start": 0.0, "end": 0.0}
    deadline = time.monotonic() + warmup + seconds

    def receive() -> None:
        conn, _ = lsock.accept()
        with conn:
            conn.settimeout(seconds + warmup + 5)
            t_warm = time.monotonic() + warmup
            while True:
                try:
                    chunk = conn.recv(1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                now = time.monotonic()
                if now >= t_warm:
                    if not counted["start"]:
                        counted["start"] = now
                    counted["bytes"] += len(chunk)
                    counted["end"] = now

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    with sender.entered():
        csock = socket.socket(_family(dst), socket.SOCK_STREAM)
    block = b"\0" * (1 << 16)
    try:
        csock.settimeout(5)
        csock.connect((dst, port))
        while time.monotonic() < deadline:
            try:
                csock.send(block)
            except TimeoutError:
                continue
    finally:
        csock.close()
        t.join(10)
        lsock.close()
    duration = max(counted["end"] - counted["start"], 1e-6)
    return Throughput(counted["bytes"] * 8 / duration, int(counted["bytes"]), duration)

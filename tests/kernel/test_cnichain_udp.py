"""cnichain.netns's UDP helpers: a datagram from one throwaway namespace to another over a
veth pair, answered by the echo server, which reports who sent it."""

from __future__ import annotations

import pytest

from cnichain.netns import throwaway, udp_echo_server, udp_request

pytestmark = pytest.mark.root


def test_udp_request_reaches_the_echo_server_in_another_namespace() -> None:
    with throwaway("udpa", "udpb", prefix="cmpt") as (a, b):
        a.ip("link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b.name)
        a.ip("addr", "add", "10.77.0.1/24", "dev", "va")
        a.ip("addr", "add", "fd77::1/64", "dev", "va", "nodad")
        b.ip("addr", "add", "10.77.0.2/24", "dev", "vb")
        b.ip("addr", "add", "fd77::2/64", "dev", "vb", "nodad")
        a.ip("link", "set", "va", "up")
        b.ip("link", "set", "vb", "up")
        with udp_echo_server(b, 5353, tag=b"b:") as peers:
            assert udp_request(a, "10.77.0.2", 5353, b"four") == b"b:four"
            assert udp_request(a, "fd77::2", 5353, b"six") == b"b:six"
        assert peers == ["10.77.0.1", "fd77::1"]
        with pytest.raises(ConnectionRefusedError):  # closed: the kernel's port unreachable
            udp_request(a, "10.77.0.2", 5353, b"late", timeout=0.5)

"""A bandwidth-limited container: this package's bandwidth plugin after its flatnet.

The shaping is checked where it lives (the qdiscs and the ifb device in the host
namespace), not by timing transfers.
"""

import os

import pytest

from cnichain.netns import tcp_echo_server, tcp_request

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")

CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "example-bandwidth",
    "plugins": [
        {
            "type": "flatnet",
            "bridge": "ex-br1",
            "isGateway": True,
            "ipam": {"type": "flatnet-ipam", "ranges": [[{"subnet": "10.78.0.0/24"}]]},
        },
        {"type": "bandwidth", "capabilities": {"bandwidth": True}},
    ],
}

RATES = {
    "ingressRate": 10_000_000,  # bit/s into the container
    "ingressBurst": 1_000_000,  # bits
    "egressRate": 5_000_000,
    "egressBurst": 1_000_000,
}


def test_limits_are_installed_and_traffic_flows(cni_chain):
    net = cni_chain.network(CONFLIST)
    att = cni_chain.attach(net, capability_args={"bandwidth": RATES})
    qdiscs = cni_chain.host.run("tc", "qdisc", "show")
    assert "tbf" in qdiscs
    assert "rate 10Mbit" in qdiscs and "rate 5Mbit" in qdiscs
    assert cni_chain.host.ip("link", "show", "type", "ifb").strip()  # egress goes through it

    (address,) = [ip["address"].split("/")[0] for ip in att.result["ips"]]
    with tcp_echo_server(cni_chain.ctr, 5000):
        assert tcp_request(cni_chain.host, address, 5000, b"still there") == b"still there"

    cni_chain.detach(att)
    assert not cni_chain.host.ip("link", "show", "type", "ifb").strip()

"""Port forwarding from the host into a container, with real TCP.

The chain is this package's flatnet (with flatnet-ipam in-process), then its portmap. The
plugins run inside the fixture's throwaway "host" namespace; the container is another
throwaway namespace.
"""

import os

import pytest

from cnichain.netns import tcp_echo_server, tcp_request

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")

CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "example-portmap",
    "plugins": [
        {
            "type": "flatnet",
            "bridge": "ex-br0",
            "isGateway": True,
            "ipam": {"type": "flatnet-ipam", "ranges": [[{"subnet": "10.77.0.0/24"}]]},
        },
        {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    ],
}


def test_host_port_reaches_the_container(cni_chain):
    net = cni_chain.network(CONFLIST)
    mapping = {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}
    att = cni_chain.attach(net, capability_args={"portMappings": [mapping]})
    gateway = att.result["ips"][0]["gateway"]  # the bridge's address: one of the host's own
    with tcp_echo_server(cni_chain.ctr, 80, tag=b"ctr:"):
        assert tcp_request(cni_chain.host, gateway, 8080, b"hello") == b"ctr:hello"
    cni_chain.detach(att)  # DEL now (the fixture would do it after the test anyway)
    with tcp_echo_server(cni_chain.ctr, 80, tag=b"ctr:"), pytest.raises(OSError):
        tcp_request(cni_chain.host, gateway, 8080, b"hello", timeout=1)

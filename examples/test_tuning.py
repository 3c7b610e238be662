"""A container interface with a tuned MTU and sysctl: this package's tuning plugin."""

import os

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")

CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "example-tuning",
    "plugins": [
        {
            "type": "flatnet",
            "bridge": "ex-br2",
            "isGateway": True,
            "ipam": {"type": "flatnet-ipam", "ranges": [[{"subnet": "10.79.0.0/24"}]]},
        },
        {
            "type": "tuning",
            "mtu": 1400,
            "sysctl": {"net.ipv4.conf.eth0.accept_redirects": "0"},
            "capabilities": {"mac": True},
        },
    ],
}


def test_mtu_mac_and_sysctl_of_eth0(cni_chain):
    cni_chain.ctr.sysctl("net.ipv4.conf.default.accept_redirects", "1")  # eth0 starts at 1
    net = cni_chain.network(CONFLIST)
    mac = "02:42:ac:11:00:07"
    cni_chain.attach(net, capability_args={"mac": mac})
    link = cni_chain.ctr.ip("link", "show", "eth0")
    assert "mtu 1400" in link
    assert mac in link
    assert cni_chain.ctr.sysctl("net.ipv4.conf.eth0.accept_redirects") == "0"

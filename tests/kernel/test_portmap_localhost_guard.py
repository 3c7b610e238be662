"""No container reaches the node's localhost through the route_localnet that
127.0.0.1:hostPort needs (Kubernetes CVE-2020-8558), on a real kernel.

route_localnet on the bridge lets the kernel route a packet that arrives there to
127.0.0.1. A container with CAP_NET_RAW (a default capability of containerd and podman)
can put such a packet on its link by hand: a crafted frame to the bridge's MAC, source
its own address, destination 127.0.0.1:7777, where the host has a service bound to its
localhost. portmap's localhost guard drops it on input; 127.0.0.1:hostPort still
reaches the pod (its packets are DNAT'd, the pod's replies ESTABLISHED).
"""

from __future__ import annotations

import struct

import pytest

from common.rtnl import NETLINK_NETFILTER, NLMSG_HDRLEN, NetlinkSocket, nlas
from portmap.kernel import Kernel
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.portmap_world import World, make_world
from tests.harness.traffic import echo_server, localhost_datagram_arrives, reaches

pytestmark = pytest.mark.root

BRIDGE = "cmppm0"  # conflists/portmap-ipv4.conflist's
GUARD_TABLE = ("ip", "cni_meta_localnet")
GUARD_CHAIN = "CNI-META-LOCALNET"


def container_reaches_localhost(lab: Lab, w: World, ctr: Netns) -> bool:
    return localhost_datagram_arrives(lab.host, ctr, "eth0", BRIDGE, w.ip(ctr))


def localnet(lab: Lab) -> str:
    return lab.host.sysctl(f"net.ipv4.conf.{BRIDGE}.route_localnet")


def nft_tables(lab: Lab) -> str:
    return lab.host.run("nft", "list", "tables")


def forwarding_works(lab: Lab, ctr: Netns) -> bool:
    with echo_server(ctr, 80, "tcp", "pod"):
        return reaches(lab.host, "127.0.0.1", 8080) == b"pod:ping"


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_a_container_on_the_bridge_does_not_reach_the_nodes_localhost(
    lab: Lab, backend: str
) -> None:
    w = make_world(lab, backend=backend)
    first, second = lab.ctr, lab.new_netns("second")
    w.attach(first, "8080:80/tcp")
    w.attach(second, "8081:80/tcp")
    assert localnet(lab) == "1"
    assert not container_reaches_localhost(lab, w, first)
    assert not container_reaches_localhost(lab, w, second)
    assert "table ip cni_meta_localnet" in nft_tables(lab)  # libnftables works here
    assert forwarding_works(lab, first)  # what route_localnet is for
    # the probe sees the exposure when there is one: the same switch without the guard
    lab.host.run("nft", "delete", "table", *GUARD_TABLE)
    assert container_reaches_localhost(lab, w, first)
    # the next ADD writes the guard whole again (as after a firewall reload)
    third = lab.new_netns("third")
    w.attach(third, "8082:80/tcp")
    assert not container_reaches_localhost(lab, w, first)

    w.detach(third)
    w.detach(first)
    assert not container_reaches_localhost(lab, w, second)  # the second one still needs it
    w.detach(second)
    assert localnet(lab) == "0"  # switched back first, then the guard removed
    assert "cni_meta_localnet" not in nft_tables(lab)


def guard_handle(lab: Lab) -> str:
    """The guard table's handle: a table made anew gets another one."""
    return lab.host.run("nft", "-a", "list", "table", *GUARD_TABLE).splitlines()[0]


def test_pods_behind_a_guarded_bridge_leave_the_guard_as_it_is(lab: Lab) -> None:
    """The guard is written when its interfaces change, not on every ADD (a replacing
    transaction costs an RCU grace period); it holds for every pod all the same."""
    w = make_world(lab, backend="nftables")
    first, second = lab.ctr, lab.new_netns("second")
    w.attach(first, "8080:80/tcp")
    made = guard_handle(lab)
    kernel = Kernel()
    with lab.host.entered():
        assert kernel.localnet_guarded(BRIDGE) and not kernel.localnet_guarded("cmpother0")
    w.attach(second, "8081:80/tcp")
    assert guard_handle(lab) == made
    assert not container_reaches_localhost(lab, w, first)
    assert not container_reaches_localhost(lab, w, second)
    w.detach(first)
    assert guard_handle(lab) == made  # the second one still needs it
    assert not container_reaches_localhost(lab, w, second)
    with echo_server(second, 80, "tcp", "pod"):
        assert reaches(lab.host, "127.0.0.1", 8081) == b"pod:ping"
    lab.host.run("nft", "delete", "table", *GUARD_TABLE)  # a firewall reload
    with lab.host.entered():
        assert not kernel.localnet_guarded(BRIDGE)
    w.detach(second)
    assert localnet(lab) == "0"
    assert "cni_meta_localnet" not in nft_tables(lab)


def generation(lab: Lab) -> int:
    """The host's nf_tables generation (NFT_MSG_GETGEN's NFTA_GEN_ID): one more for each
    transaction that committed."""
    with lab.host.entered(), NetlinkSocket(NETLINK_NETFILTER) as nl:
        (reply,) = nl.request(10 << 8 | 16, 0, bytes(4))  # NFNL_SUBSYS_NFTABLES, GETGEN
    (gen,) = struct.unpack("!I", dict(nlas(reply[NLMSG_HDRLEN + 4 :]))[1])
    return int(gen)


def test_the_last_del_removes_mappings_and_guard_in_one_transaction(lab: Lab) -> None:
    """Each transaction that deletes makes the plugin wait for an RCU grace period (the
    close of its netlink socket, at exit): the last pod's DEL commits one, route_localnet
    put back before it. (The bridge plugin's DEL, without ipMasq, commits none.)"""
    w = make_world(lab, backend="nftables")
    w.attach(lab.ctr, "8080:80/tcp")
    before = generation(lab)
    w.detach(lab.ctr)
    assert generation(lab) == before + 1
    assert localnet(lab) == "0"
    assert "cni_meta" not in nft_tables(lab)  # neither the mappings' table nor the guard


def test_on_an_iptables_only_host_the_guard_is_a_filter_chain(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where libnftables does not load, the guard is made with the host's iptables tools:
    a chain of ours in the filter table, jumped to first from INPUT."""
    w = make_world(lab, backend="iptables")
    w.attach(lab.ctr, "8080:80/tcp")
    lab.host.run("nft", "delete", "table", *GUARD_TABLE)  # the plugin's, with nftables
    assert container_reaches_localhost(lab, w, lab.ctr)
    kernel = Kernel()
    monkeypatch.setattr(kernel.nft, "usable", lambda: False)

    with lab.host.entered():
        kernel.guard_localnet([BRIDGE])
    saved = lab.host.run("iptables-save", "-t", "filter")
    assert f"-A {GUARD_CHAIN} -i {BRIDGE} -m conntrack" in saved
    with lab.host.entered():
        assert kernel.localnet_guarded(BRIDGE) and not kernel.localnet_guarded("cmpother0")
    assert "cni_meta_localnet" not in nft_tables(lab)
    assert not container_reaches_localhost(lab, w, lab.ctr)
    assert forwarding_works(lab, lab.ctr)
    with lab.host.entered():
        kernel.guard_localnet([BRIDGE])  # again: the chain written whole, one jump
    assert lab.host.run("iptables", "-S", "INPUT").count(GUARD_CHAIN) == 1

    with lab.host.entered():
        kernel.guard_localnet([])
        assert not kernel.localnet_guarded(BRIDGE)
    assert GUARD_CHAIN not in lab.host.run("iptables-save", "-t", "filter")
    assert container_reaches_localhost(lab, w, lab.ctr)
    w.detach(lab.ctr)

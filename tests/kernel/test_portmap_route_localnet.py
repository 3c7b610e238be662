"""route_localnet goes only on the interface that faces the container, and back off
with the last attachment that needed it (issue 29, finding 3), on a real kernel.

The host routes the container subnet by a policy rule (`to 10.77.0.0/16 lookup 100`,
the bridge's route in table 100; the main table knows only the default route via the
uplink `vext`). The proof that the uplink stays closed is a neighbour's datagram to
127.0.0.1 sent over the link (a crafted frame): it reaches a host service bound to
localhost exactly when the uplink's route_localnet is on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import our, run_plugin
from tests.harness.portmap_world import EXT4, HOST4, World, add_ext
from tests.harness.traffic import echo_server, localhost_datagram_arrives, reaches

pytestmark = pytest.mark.root

PORTMAP = our("portmap")
BRIDGE, UPLINK = "cmplo0", "vext"
SUBNET, GATEWAY = "10.77.0.0/16", "10.77.0.1"


def policy_routed_world(lab: Lab) -> World:
    """The bridge exists before the chain runs, its address without a main-table route;
    the subnet is reached through table 100 only."""
    ext = add_ext(lab)
    h = lab.host
    h.ip("link", "add", BRIDGE, "type", "bridge")
    h.ip("addr", "add", f"{GATEWAY}/16", "dev", BRIDGE, "noprefixroute")
    h.ip("link", "set", BRIDGE, "up")
    h.ip("route", "add", SUBNET, "dev", BRIDGE, "table", "100")
    h.ip("rule", "add", "to", SUBNET, "lookup", "100")
    h.ip("route", "add", "default", "via", EXT4, "dev", UPLINK)
    conflist = {
        "cniVersion": "1.0.0",
        "name": "cmp-localnet",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET}]],
                      "dataDir": str(lab.workdir / "host-local"),
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }  # fmt: skip
    path = lab.workdir / "localnet.conflist"
    path.write_text(json.dumps(conflist))
    return World(lab, ext, path)


def localnet(ns: Netns, ifname: str) -> str:
    return ns.sysctl(f"net.ipv4.conf.{ifname}.route_localnet")


def neighbour_reaches_localhost(lab: Lab, ext: Netns, port: int = 7777) -> bool:
    """Whether a datagram `ext` puts on the link to the host with destination
    127.0.0.1:port reaches a host socket bound to 127.0.0.1:port."""
    return localhost_datagram_arrives(lab.host, ext, "eth0", UPLINK, EXT4, port)


def test_policy_routed_bridge_gets_route_localnet_and_the_uplink_does_not(lab: Lab) -> None:
    w = policy_routed_world(lab)
    # the probe sees a leak when there is one
    lab.host.sysctl(f"net.ipv4.conf.{UPLINK}.route_localnet", "1")
    assert neighbour_reaches_localhost(lab, w.ext)
    lab.host.sysctl(f"net.ipv4.conf.{UPLINK}.route_localnet", "0")
    assert not neighbour_reaches_localhost(lab, w.ext)

    first, second = lab.ctr, lab.new_netns("second")
    w.attach(first, "8080:80/tcp")
    w.attach(second, "8081:80/tcp")
    assert (localnet(lab.host, BRIDGE), localnet(lab.host, UPLINK)) == ("1", "0")
    assert not neighbour_reaches_localhost(lab, w.ext)
    with echo_server(first, 80, "tcp", "first"):
        assert reaches(lab.host, "127.0.0.1", 8080) == b"first:ping"  # what it is for
        assert reaches(w.ext, HOST4, 8080) == b"first:ping"
    w.detach(first)
    assert localnet(lab.host, BRIDGE) == "1"  # the second one still needs it
    w.detach(second)
    assert (localnet(lab.host, BRIDGE), localnet(lab.host, UPLINK)) == ("0", "0")
    assert not neighbour_reaches_localhost(lab, w.ext)


def test_route_localnet_that_was_on_stays_on_after_the_last_del(lab: Lab) -> None:
    w = policy_routed_world(lab)
    lab.host.sysctl(f"net.ipv4.conf.{BRIDGE}.route_localnet", "1")  # the operator's
    w.attach(lab.ctr, "8080:80/tcp")
    w.detach(lab.ctr)
    assert localnet(lab.host, BRIDGE) == "1"


def _direct(lab: Lab, address: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0", "name": "direct", "type": "portmap", "snat": True,
        "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80}]},
        "prevResult": {"cniVersion": "1.0.0",
                       "interfaces": [{"name": "eth0", "sandbox": lab.ctr.path}],
                       "ips": [{"address": address, "interface": 0}]},
    }  # fmt: skip


def test_a_loopback_container_address_is_refused_and_opens_no_interface(lab: Lab) -> None:
    """A static IPAM handing out 127.0.0.5: the main table's longest match was the
    default route, and the uplink got route_localnet."""
    w = policy_routed_world(lab)
    before = lab.host.run("nft", "list", "ruleset")
    run = run_plugin(PORTMAP, "ADD", _direct(lab, "127.0.0.5/8"), host=lab.host, env=lab.env,
                     netns=lab.ctr.path)  # fmt: skip
    assert run.returncode != 0
    error = json.loads(run.stdout)
    assert error["code"] == 7
    assert error["msg"] == "prevResult address 127.0.0.5/8 of eth0 is a loopback address"
    assert localnet(lab.host, UPLINK) == "0"
    assert lab.host.run("nft", "list", "ruleset") == before
    assert not neighbour_reaches_localhost(lab, w.ext)


def test_a_container_address_routed_via_a_gateway_gets_no_route_localnet(lab: Lab) -> None:
    """An address the host reaches only through a router is on no link of the host:
    the mapping goes in, route_localnet nowhere."""
    w = policy_routed_world(lab)
    run = run_plugin(PORTMAP, "ADD", _direct(lab, "10.99.0.5/24"), host=lab.host, env=lab.env,
                     netns=lab.ctr.path)  # fmt: skip
    assert run.returncode == 0, run.stdout
    assert localnet(lab.host, UPLINK) == "0"
    assert not neighbour_reaches_localhost(lab, w.ext)
    log = Path(lab.env["CNI_META_LOG_FILE"]).read_text()
    assert "route_localnet left alone: 127.0.0.1:hostPort will not reach 10.99.0.5" in log


def test_a_container_on_a_plain_devices_link_gets_no_route_localnet(lab: Lab) -> None:
    """A macvlan container sits on its parent's link: the route to it is on-link via that
    device, which faces other hosts too (an ifb device stands in for the uplink)."""
    policy_routed_world(lab)
    lab.host.ip("link", "add", "cmpup0", "type", "ifb")
    lab.host.ip("addr", "add", "192.168.99.1/24", "dev", "cmpup0")
    lab.host.ip("link", "set", "cmpup0", "up")
    run = run_plugin(PORTMAP, "ADD", _direct(lab, "192.168.99.5/24"), host=lab.host,
                     env=lab.env, netns=lab.ctr.path)  # fmt: skip
    assert run.returncode == 0, run.stdout
    assert localnet(lab.host, "cmpup0") == "0"
    log = Path(lab.env["CNI_META_LOG_FILE"]).read_text()
    assert "via cmpup0, an ifb device, not a bridge or veth" in log

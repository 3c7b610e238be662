"""flatnet against a real kernel: every test makes its own host and container
namespaces (the `lab` fixture), runs the plugin inside the host one, and proves what it
did by reading the kernel back (iproute2, nft, iptables-save) and with real traffic.
The Go bridge (/usr/lib/cni/bridge) is the reference where behaviour must match."""

from __future__ import annotations

import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.harness.crash import at_crash_point, crash_points
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import Invocation, PluginRun, go, invocation, our, run_plugin
from tests.harness.traffic import echo_server, reaches, request

pytestmark = pytest.mark.root

FLATNET = our("flatnet")
BRIDGE = go("bridge")
IPAMS = ["host-local", "flatnet-ipam"]  # exec'd through CNI_PATH; in-process


def conf(
    lab: Lab,
    version: str = "1.0.0",
    ipam: dict[str, Any] | None = None,
    kind: str = "host-local",
    **keys: Any,
) -> dict[str, Any]:
    """The seed's config (bridge flatnet0, 10.42.0.0/16), its leases in the lab (never the
    machine's /var/lib/cni)."""
    ipam = ipam or {"type": kind, "subnet": "10.42.0.0/16", "gateway": "10.42.0.1"}
    if ipam.get("type") in IPAMS:
        ipam = {**ipam, "dataDir": str(lab.workdir / "leases")}
    return {"cniVersion": version, "name": "flatnet", "type": "flatnet", "bridge": "flatnet0",
            "ipam": ipam, "mtu": 1500, **keys}  # fmt: skip


def go_leases(lab: Lab, body: dict[str, Any]) -> dict[str, Any]:
    """The config's IPAM with leases of its own, so the Go bridge gets the same address."""
    return {**body["ipam"], "dataDir": str(lab.workdir / "go-leases")}


def vlan_filtering(lab: Lab) -> bool:
    probe = lab.new_netns("probe")
    probe.ip("link", "add", "br0", "type", "bridge")
    probe.ip("link", "set", "br0", "type", "bridge", "vlan_filtering", "1", check=False)
    return "vlan_filtering 1" in probe.ip("-d", "link", "show", "br0")


def dual(lab: Lab, kind: str = "host-local", **keys: Any) -> dict[str, Any]:
    ranges = [[{"subnet": "10.42.0.0/24"}], [{"subnet": "fd42::/64"}]]
    return conf(lab, ipam={"type": kind, "ranges": ranges}, **keys)


def run(lab: Lab, command: str, body: Any, ctr: Netns | None = None, cid: str = "",
        exe: str = FLATNET, **kw: Any) -> PluginRun:  # fmt: skip
    ctr = ctr if ctr is not None else lab.ctr
    netns = kw.pop("netns", ctr.path)
    env = {**lab.env, **kw.pop("env", {})}
    return run_plugin(exe, command, body, host=lab.host, netns=netns,
                      container_id=cid or ctr.name, env=env, **kw)  # fmt: skip


def add(lab: Lab, body: Any, ctr: Netns | None = None, **kw: Any) -> dict[str, Any]:
    result: dict[str, Any] = run(lab, "ADD", body, ctr, **kw).ok().json
    return result


def address(result: dict[str, Any], family: int = 4) -> str:
    for ip in result["ips"]:
        if (":" in ip["address"]) == (family == 6):
            return str(ip["address"].split("/")[0])
    raise AssertionError(f"no IPv{family} address in {result}")


def host_links(lab: Lab) -> list[str]:
    return sorted(ln.split()[0].split("@")[0] for ln in lab.host.ip("-br", "link").splitlines())


def leases(lab: Lab) -> list[str]:
    d = lab.workdir / "leases" / "flatnet"
    if not d.exists():
        return []
    return sorted(p.name for p in d.iterdir() if p.name[0].isdigit() or ":" in p.name)


def records(lab: Lab) -> list[str]:
    d = lab.state_root / "flatnet"
    return sorted(p.name for p in d.glob("*.json")) if d.exists() else []


def nft(lab: Lab) -> str:
    return lab.host.run("nft", "list", "ruleset")


def outside(lab: Lab) -> tuple[Netns, str]:
    """A namespace beyond the host (192.0.2.2), reachable from the host only: with no
    route back to the containers' subnet, it answers only what was masqueraded."""
    out = lab.new_netns("out")
    lab.host.ip("link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns", out.name)
    lab.host.ip("addr", "add", "192.0.2.1/24", "dev", "up0")
    lab.host.ip("link", "set", "up0", "up")
    out.ip("addr", "add", "192.0.2.2/24", "dev", "eth0")
    out.ip("link", "set", "eth0", "up")
    return out, "192.0.2.2"


# ---------------------------------------------------------------------------- ADD, DEL


@pytest.mark.parametrize("kind", IPAMS)
def test_seed_config_attaches_a_container_and_del_removes_everything(lab: Lab, kind: str) -> None:
    body = conf(lab, kind=kind)
    result = add(lab, body)
    names = [i["name"] for i in result["interfaces"]]
    assert names[0] == "flatnet0" and names[2] == "eth0" and names[1].startswith("veth")
    assert result["interfaces"][2]["sandbox"] == lab.ctr.path
    assert result["ips"] == [{"interface": 2, "address": "10.42.0.2/16", "gateway": "10.42.0.1"}]
    # what the result says is what the kernel has
    assert "10.42.0.2/16" in lab.ctr.ip("-br", "addr", "show", "eth0")
    assert result["interfaces"][2]["mac"] in lab.ctr.ip("-br", "link", "show", "eth0")
    assert result["interfaces"][0]["mac"] in lab.host.ip("-br", "link", "show", "flatnet0")
    assert "master flatnet0" in lab.host.ip("link", "show", names[1])
    assert leases(lab) == ["10.42.0.2"] and len(records(lab)) == 1
    run(lab, "DEL", body).ok()
    assert host_links(lab) == ["flatnet0", "lo"]  # the bridge stays, as Go's does
    assert not lab.ctr.ip("link", "show", "eth0", check=False)
    assert leases(lab) == [] and records(lab) == []
    run(lab, "DEL", body).ok()  # nothing left to delete: still a success


def test_two_containers_on_one_bridge_talk(lab: Lab) -> None:
    body = conf(lab)
    other = lab.new_netns("ctr2")
    first, second = add(lab, body), add(lab, body, other)
    with echo_server(other, 7001) as peers:
        assert reaches(lab.ctr, address(second), 7001)
        assert peers == [address(first)]
    # the bridge's MAC stays as set while ports come and go (no drift to a port's MAC)
    mac = lab.host.ip("-br", "link", "show", "flatnet0").split()[2]
    run(lab, "DEL", body, other).ok()
    assert lab.host.ip("-br", "link", "show", "flatnet0").split()[2] == mac
    run(lab, "DEL", body).ok()


def test_result_matches_the_go_bridge_in_shape(lab: Lab) -> None:
    body = conf(lab, isGateway=True, isDefaultGateway=True)
    ours = add(lab, body)
    run(lab, "DEL", body).ok()
    go_body = {**body, "type": "bridge", "bridge": "gobr0", "ipam": go_leases(lab, body)}
    theirs = add(lab, go_body, exe=BRIDGE)
    run(lab, "DEL", go_body, exe=BRIDGE).ok()

    def shape(result: dict[str, Any]) -> Any:
        return (
            [sorted(i) for i in result["interfaces"]],
            result["ips"],
            result.get("routes"),
            result["cniVersion"],
        )

    assert shape(ours) == shape(theirs)


@pytest.mark.parametrize("version", ["0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_result_in_every_version(lab: Lab, version: str) -> None:
    body = conf(lab, version=version)
    result = add(lab, body)
    assert result["cniVersion"] == version
    if version == "0.2.0":
        assert result["ip4"]["ip"] == "10.42.0.2/16"
    else:
        assert result["ips"][0]["address"] == "10.42.0.2/16"
        assert len(result["interfaces"]) == 3
    run(lab, "DEL", body).ok()


def test_is_default_gateway_routes_through_the_bridge(lab: Lab) -> None:
    body = conf(lab, isDefaultGateway=True)
    result = add(lab, body)
    assert {"dst": "0.0.0.0/0", "gw": "10.42.0.1"} in result["routes"]
    assert "default via 10.42.0.1 dev eth0" in lab.ctr.ip("route")
    assert "10.42.0.1/16" in lab.host.ip("-br", "addr", "show", "flatnet0")
    assert lab.host.sysctl("net.ipv4.ip_forward") == "1"
    run(lab, "DEL", body).ok()


@pytest.mark.parametrize("kind", IPAMS)
def test_dual_stack_ipv6_usable_at_return(lab: Lab, kind: str) -> None:
    body = dual(lab, isGateway=True, kind=kind)
    other = lab.new_netns("ctr2")
    first, second = add(lab, body), add(lab, body, other)
    assert {ip["address"] for ip in first["ips"]} == {"10.42.0.2/24", "fd42::2/64"}
    # no DAD: the address is not tentative when ADD returns, so traffic flows at once
    assert "tentative" not in lab.ctr.ip("-6", "addr", "show", "eth0")
    assert "tentative" not in lab.host.ip("-6", "addr", "show", "flatnet0")
    with echo_server(other, 7002):
        assert reaches(lab.ctr, address(second, 6), 7002)
    with echo_server(other, 7003):
        assert reaches(lab.ctr, address(second), 7003)
    run(lab, "DEL", body).ok()
    run(lab, "DEL", body, other).ok()
    assert leases(lab) == []


def test_mtu_reaches_a_bridge_that_exists(lab: Lab) -> None:
    lab.host.ip("link", "add", "flatnet0", "type", "bridge")
    body = conf(lab, mtu=9000)
    add(lab, body)
    assert "mtu 9000" in lab.host.ip("link", "show", "flatnet0")
    assert "mtu 9000" in lab.ctr.ip("link", "show", "eth0")
    run(lab, "DEL", body).ok()


def test_mac_of_a_bridge_made_elsewhere_is_pinned(lab: Lab) -> None:
    """A bridge whose MAC was never set takes its lowest port's MAC as ports come and go
    (netavark #833); ADD sets it to what it is, so it stays put."""
    lab.host.ip("link", "add", "flatnet0", "type", "bridge")
    body = conf(lab)
    mac = lab.host.ip("-br", "link", "show", "flatnet0").split()[2]
    ctrs = [lab.new_netns(f"m{i}") for i in range(4)]
    for ctr in ctrs:
        add(lab, body, ctr)
        assert lab.host.ip("-br", "link", "show", "flatnet0").split()[2] == mac
    for ctr in ctrs:
        run(lab, "DEL", body, ctr).ok()
        assert lab.host.ip("-br", "link", "show", "flatnet0").split()[2] == mac


def test_options_hairpin_isolation_mac_promisc(lab: Lab) -> None:
    mac = "02:42:0a:2a:00:09"
    body = conf(lab, hairpinMode=True, portIsolation=True, runtimeConfig={"mac": mac})
    result = add(lab, body)
    host_veth = result["interfaces"][1]["name"]
    assert result["interfaces"][2]["mac"] == mac and mac in lab.ctr.ip("link", "show", "eth0")
    port = lab.host.run("bridge", "-d", "link", "show", "dev", host_veth)
    assert "hairpin on" in port and "isolated on" in port
    run(lab, "DEL", body).ok()
    promisc = conf(lab, promiscMode=True)
    add(lab, promisc)
    assert "PROMISC" in lab.host.ip("link", "show", "flatnet0")
    run(lab, "DEL", promisc).ok()


def test_vlan_is_the_ports_untagged_pvid(lab: Lab) -> None:
    if not vlan_filtering(lab):
        pytest.skip("this kernel has no bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING)")
    body = conf(lab, vlan=42)
    host_veth = add(lab, body)["interfaces"][1]["name"]
    vlans = lab.host.run("bridge", "vlan", "show", "dev", host_veth)
    assert "42 PVID Egress Untagged" in vlans and " 1 " not in vlans
    run(lab, "DEL", body).ok()


def test_mac_from_cni_args(lab: Lab) -> None:
    body = conf(lab)
    result = add(lab, body, cni_args="IgnoreUnknown=1;MAC=02:00:00:00:00:2a")
    assert result["interfaces"][2]["mac"] == "02:00:00:00:00:2a"
    run(lab, "DEL", body).ok()


def test_force_address_replaces_another_gateway_on_the_bridge(lab: Lab) -> None:
    lab.host.ip("link", "add", "flatnet0", "type", "bridge")
    lab.host.ip("addr", "add", "10.9.9.1/24", "dev", "flatnet0")
    body = conf(lab, isGateway=True)
    refused = run(lab, "ADD", body)
    assert refused.returncode != 0 and "forceAddress" in refused.json["msg"] + refused.json.get(
        "details", ""
    )
    assert host_links(lab) == ["flatnet0", "lo"] and leases(lab) == []  # rolled back
    body = conf(lab, isGateway=True, forceAddress=True)
    add(lab, body)
    addrs = lab.host.ip("-br", "-4", "addr", "show", "flatnet0")
    assert "10.42.0.1/16" in addrs and "10.9.9.1" not in addrs
    run(lab, "DEL", body).ok()


def test_second_add_of_an_attachment_is_refused_and_keeps_the_first(lab: Lab) -> None:
    body = conf(lab)
    add(lab, body)
    again = run(lab, "ADD", body)
    assert again.returncode != 0 and again.json["code"] == 101
    assert leases(lab) == ["10.42.0.2"] and len(records(lab)) == 1
    assert "10.42.0.2/16" in lab.ctr.ip("-br", "addr", "show", "eth0")
    run(lab, "DEL", body).ok()
    assert leases(lab) == [] and records(lab) == []


def test_ipam_failure_rolls_the_add_back(lab: Lab) -> None:
    body = conf(lab, ipam={"type": "host-local", "subnet": "10.42.0.0/30"})
    add(lab, body)  # takes the only address
    other = lab.new_netns("ctr2")
    failed = run(lab, "ADD", body, other)
    assert failed.returncode != 0 and "no IP addresses available" in failed.stdout
    assert not other.ip("link", "show", "eth0", check=False)
    assert len([n for n in host_links(lab) if n.startswith("veth")]) == 1
    assert len(records(lab)) == 1
    run(lab, "DEL", body).ok()


@pytest.mark.parametrize("kind", IPAMS)
@pytest.mark.parametrize(
    "bad", [{"macspoofchk": True}, {"mtu": 10}, {"ipam": {"type": "flatnet-ipam"}}]
)
def test_del_of_a_refused_add_succeeds(lab: Lab, kind: str, bad: dict[str, Any]) -> None:
    body = {**conf(lab, kind=kind), **bad}
    refused = run(lab, "ADD", body)
    assert refused.returncode != 0 and refused.json["code"] == 7
    run(lab, "DEL", body).ok()
    run(lab, "DEL", body, netns="").ok()
    assert records(lab) == [] and leases(lab) == []


def test_any_ipam_type_is_execd_through_cni_path(lab: Lab) -> None:
    """Go's static IPAM, exec'd exactly as the Go bridge execs it."""
    ipam = {"type": "static", "addresses": [{"address": "10.42.7.9/16", "gateway": "10.42.0.1"}],
            "routes": [{"dst": "192.0.2.0/24"}]}  # fmt: skip
    body = conf(lab, ipam=ipam, args={"cni": {"mac": "02:00:00:00:07:09"}})
    result = add(lab, body)
    assert result["ips"] == [{"interface": 2, "address": "10.42.7.9/16", "gateway": "10.42.0.1"}]
    assert result["interfaces"][2]["mac"] == "02:00:00:00:07:09"
    assert "10.42.7.9/16" in lab.ctr.ip("-br", "addr", "show", "eth0")
    assert "192.0.2.0/24 via 10.42.0.1 dev eth0" in lab.ctr.ip("route")
    run(lab, "DEL", body).ok()
    assert not lab.ctr.ip("link", "show", "eth0", check=False)


def test_missing_ipam_plugin_is_named(lab: Lab) -> None:
    failed = run(lab, "ADD", conf(lab, ipam={"type": "no-such-ipam"}))
    assert failed.returncode != 0 and "no-such-ipam" in failed.json["msg"]
    assert [n for n in host_links(lab) if n.startswith("veth")] == [] and records(lab) == []


def test_no_ipam_gives_a_layer2_attachment(lab: Lab) -> None:
    body = {"cniVersion": "1.0.0", "name": "flatnet", "type": "flatnet", "bridge": "flatnet0"}
    result = add(lab, body)
    assert "ips" not in result and "UP" in lab.ctr.ip("-br", "link", "show", "eth0")
    run(lab, "DEL", body).ok()


# ---------------------------------------------------------------------------- masquerade


@pytest.mark.parametrize("kind", IPAMS)
def test_nft_masquerade_outside_sees_the_host_address(lab: Lab, kind: str) -> None:
    out, peer = outside(lab)
    body = conf(lab, isDefaultGateway=True, ipMasq=True, kind=kind)
    other = lab.new_netns("ctr2")
    add(lab, body)
    add(lab, body, other)
    with echo_server(out, 7010) as peers:
        assert request(lab.ctr, peer, 7010) == b"ctr:ping"
        assert peers == ["192.0.2.1"]
    ruleset = nft(lab)
    assert ruleset.count("masquerade") == 2  # per network (one rule per family), not per container
    assert "10.42.0.0/16" in ruleset
    run(lab, "DEL", body, other).ok()
    assert "chain n_flatnet" in nft(lab)  # the first container still needs it
    run(lab, "DEL", body).ok()
    assert "cni_flatnet" not in nft(lab)


def test_iptables_masquerade_is_the_go_bridges(lab: Lab) -> None:
    out, peer = outside(lab)
    body = conf(lab, isDefaultGateway=True, ipMasq=True, ipMasqBackend="iptables")
    add(lab, body)
    with echo_server(out, 7011) as peers:
        assert request(lab.ctr, peer, 7011) == b"ctr:ping"
        assert peers == ["192.0.2.1"]
    ours = lab.host.run("iptables-save", "-t", "nat")
    run(lab, "DEL", body).ok()
    assert "CNI-" not in lab.host.run("iptables-save", "-t", "nat")
    go_body = {**body, "type": "bridge", "ipam": go_leases(lab, body)}
    add(lab, go_body, exe=BRIDGE)
    theirs = lab.host.run("iptables-save", "-t", "nat")

    def rules(text: str) -> list[str]:
        return sorted(ln for ln in text.splitlines() if "CNI-" in ln and not ln.startswith("#"))

    assert rules(ours) == rules(theirs)
    run(lab, "DEL", body).ok()  # ours removes what Go's made
    assert "CNI-" not in lab.host.run("iptables-save", "-t", "nat")
    run(lab, "DEL", go_body, exe=BRIDGE).ok()


# ---------------------------------------------------------------------------- beyond Go


@pytest.mark.parametrize("kind", IPAMS)
@pytest.mark.parametrize("how", ["empty CNI_NETNS", "netns gone"])
def test_del_without_the_netns_removes_veth_nat_and_lease(lab: Lab, how: str, kind: str) -> None:
    body = conf(lab, isGateway=True, ipMasq=True, kind=kind)
    ctr = lab.new_netns("gone")
    add(lab, body, ctr, cid="c1")
    if how == "netns gone":
        path = ctr.path
        subprocess.run(["ip", "netns", "del", ctr.name], check=True)
        assert not os.path.exists(path)
        run(lab, "DEL", body, ctr, cid="c1").ok()
    else:
        run(lab, "DEL", body, ctr, cid="c1", netns="").ok()
    assert [n for n in host_links(lab) if n.startswith("veth")] == []
    assert "cni_flatnet" not in nft(lab)
    assert leases(lab) == [] and records(lab) == []


@pytest.mark.parametrize("kind", IPAMS)
def test_gc_removes_what_stale_attachments_left(lab: Lab, kind: str) -> None:
    body = conf(lab, version="1.1.0", isGateway=True, ipMasq=True, kind=kind)
    keep, stale = lab.new_netns("keep"), lab.new_netns("stale")
    add(lab, body, keep, cid="keep")
    add(lab, body, stale, cid="stale")
    valid = {"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]}
    run(lab, "GC", {**body, **valid}, netns="").ok()
    assert not stale.ip("link", "show", "eth0", check=False)
    assert keep.ip("link", "show", "eth0")
    assert leases(lab) == ["10.42.0.2"] and len(records(lab)) == 1
    assert "n_flatnet" in nft(lab)
    run(lab, "GC", {**body, "cni.dev/valid-attachments": []}, netns="").ok()
    assert [n for n in host_links(lab) if n.startswith("veth")] == []
    assert "cni_flatnet" not in nft(lab) and leases(lab) == [] and records(lab) == []


@pytest.mark.parametrize("kind", IPAMS)
def test_status_reports_an_unusable_bridge_or_ipam(lab: Lab, kind: str) -> None:
    body = conf(lab, version="1.1.0", kind=kind)
    run(lab, "STATUS", body, netns="").ok()
    lab.host.ip("link", "add", "flatnet0", "type", "veth", "peer", "name", "x0")
    bad = run(lab, "STATUS", body, netns="")
    assert bad.returncode != 0 and bad.json["code"] == 50 and "not a bridge" in bad.json["msg"]
    missing = run(lab, "STATUS", conf(lab, version="1.1.0", bridge="br9",
                                      ipam={"type": "no-such-ipam"}), netns="")  # fmt: skip
    assert missing.returncode != 0 and missing.json["code"] == 50


def test_check_passes_then_names_what_is_missing(lab: Lab) -> None:
    body = conf(lab, isGateway=True, ipMasq=True)
    result = add(lab, body)
    checked = {**body, "prevResult": result}
    run(lab, "CHECK", checked).ok()
    lab.ctr.ip("addr", "flush", "dev", "eth0")
    failed = run(lab, "CHECK", checked)
    assert failed.returncode != 0 and "10.42.0.2/16" in failed.json["details"]
    run(lab, "DEL", body).ok()


@pytest.mark.parametrize("kind", IPAMS)
def test_a_hundred_parallel_adds(lab: Lab, kind: str) -> None:
    body = conf(lab, ipam={"type": kind, "subnet": "10.42.0.0/24"})
    ctrs = [lab.new_netns(f"p{i}") for i in range(100)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda c: run(lab, "ADD", body, c), ctrs))
    assert all(r.returncode == 0 for r in results), [r.stdout for r in results if r.returncode]
    addresses = {address(r.json) for r in results}
    assert len(addresses) == 100
    assert len([n for n in host_links(lab) if n.startswith("veth")]) == 100
    with ThreadPoolExecutor(16) as pool:
        dels = list(pool.map(lambda c: run(lab, "DEL", body, c), ctrs))
    assert all(r.returncode == 0 for r in dels)
    assert host_links(lab) == ["flatnet0", "lo"] and leases(lab) == [] and records(lab) == []


# ---------------------------------------------------------------------------- SIGKILL


def _add(lab: Lab, body: dict[str, Any], ctr: Netns) -> Invocation:
    env = {**lab.env, "CNI_PATH": f"{Path(FLATNET).parent}:/usr/lib/cni"}
    return invocation(FLATNET, "ADD", body, host=lab.host, container_id="k1", netns=ctr.path,
                      env=env)  # fmt: skip


def _crash_points(lab: Lab, body: dict[str, Any], ctr: Netns) -> list[str]:
    points = crash_points(_add(lab, body, ctr), "flatnet", lab.workdir / "count.json")
    run(lab, "DEL", body, ctr).ok()
    return points


@pytest.mark.slow
@pytest.mark.parametrize("kind", IPAMS)
@pytest.mark.parametrize("then", ["DEL", "GC"])
def test_sigkill_at_every_step_of_add_then_del_or_gc_leaves_nothing(
    lab: Lab, then: str, kind: str
) -> None:
    body = conf(lab, version="1.1.0", isGateway=True, ipMasq=True, kind=kind)
    ctr = lab.new_netns("kill")
    points = _crash_points(lab, body, ctr)
    assert len(points) >= 20
    for point in points:
        killed = at_crash_point(_add(lab, body, ctr), "flatnet", point)
        if then == "DEL":
            run(lab, "DEL", body, ctr, cid="k1").ok()
        else:
            run(lab, "GC", {**body, "cni.dev/valid-attachments": []}, netns="").ok()
        left = (
            [n for n in host_links(lab) if n.startswith("veth")],
            ctr.ip("link", "show", "eth0", check=False),
            "cni_flatnet" in nft(lab),
            leases(lab),
            records(lab),
        )
        assert left == ([], "", False, [], []), f"{point} (exit {killed.returncode}) left {left}"
    time.sleep(0)


def test_flatnet_ipam_runs_in_process(lab: Lab) -> None:
    """No second exec: with no flatnet-ipam in CNI_PATH the ADD still gets its address."""
    body = conf(lab, kind="flatnet-ipam")
    result = add(lab, body, env={"CNI_PATH": "/nonexistent"})
    assert result["ips"][0]["address"] == "10.42.0.2/16" and leases(lab) == ["10.42.0.2"]
    run(lab, "DEL", body, env={"CNI_PATH": "/nonexistent"}).ok()
    assert leases(lab) == []


def test_bridge_address_lookup_reads_only_the_bridge(lab: Lab) -> None:
    """ADD reads the bridge's addresses with a dump the kernel filters by link: with many
    host veths (each has an IPv6 link-local address) it receives the bridge's only, so
    the lookup does not grow with the node's attachments."""
    from common import rtnl
    from flatnet.links import AF_INET6, Rtnl

    lab.host.ip("link", "add", "flatnet0", "type", "bridge")
    lab.host.ip("addr", "add", "fd42::1/64", "dev", "flatnet0", "nodad")
    for i in range(20):
        lab.host.ip("link", "add", f"vt{i}", "up", "type", "veth", "peer", "name", f"vp{i}")
        lab.host.ip("link", "set", f"vp{i}", "up")
    received: list[bytes] = []
    real = rtnl.NetlinkSocket.request

    def counting(self: Any, msg_type: int, flags: int, body: bytes) -> Any:
        for reply in real(self, msg_type, flags, body):
            received.append(reply)
            yield reply

    with lab.host.entered():
        host = Rtnl()
        try:
            bridge = host.link("flatnet0")
            assert bridge is not None
            received.clear()
            rtnl.NetlinkSocket.request = counting  # type: ignore[method-assign]
            try:
                found = host.addresses(bridge.index, AF_INET6)
            finally:
                rtnl.NetlinkSocket.request = real  # type: ignore[method-assign]
        finally:
            host.close()
    assert "fd42::1/64" in found
    assert len(received) == len(found) <= 2  # fd42::1 and, once up, the bridge's fe80

"""bandwidth against a real kernel, with real traffic.

The container is attached with the Go bridge + host-local and our bandwidth through
cnichain.Network (conflists/bandwidth.conflist), as a runtime would. Everything about the kernel
is read back with iproute2's `tc -j` / `ip -j`, never from the plugin's own report.
Throughput bounds are deliberately generous (50%..110% of the configured rate): they
prove that shaping happens and holds, while bench/bandwidth_accuracy.py measures how
precisely.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from cnichain.runner import parse_bandwidth
from tests.harness import netns as nslib
from tests.harness.bandwidth_world import (
    BANDWIDTH,
    GATEWAY,
    NETWORK,
    SECONDS,
    Attachment,
    assert_clean,
    assert_shaped,
    attach,
    links,
    qdiscs,
    rate_spec,
    redirect_targets,
    root_tbf,
    small_send_buffers,
    tc_json,
)
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import PluginRun, run_plugin
from tests.harness.traffic import echo_server, measure_throughput, request

pytestmark = pytest.mark.root

# ---------------------------------------------------------------------------- shaping


@pytest.mark.slow
@pytest.mark.parametrize("mbit", [1, 10, 100])
def test_traffic_is_shaped_in_both_directions(lab: Lab, mbit: int) -> None:
    rate = mbit * 1_000_000
    small_send_buffers(lab.host, lab.ctr)
    att = attach(lab, rate_spec(rate))
    # container ingress: host -> container, through the tbf on the host veth
    into = measure_throughput(lab.host, att.ctr, att.ip, 5201, seconds=SECONDS)
    assert_shaped(into.bits_per_second, rate, "ingress")
    # container egress: container -> host, redirected through the ifb's tbf
    out = measure_throughput(att.ctr, lab.host, GATEWAY, 5202, seconds=SECONDS)
    assert_shaped(out.bits_per_second, rate, "egress")


def test_directions_are_shaped_independently(lab: Lab) -> None:
    small_send_buffers(lab.host, lab.ctr)
    att = attach(lab, "ingressRate=2mbit,egressRate=20mbit")
    into = measure_throughput(lab.host, att.ctr, att.ip, 5201, seconds=2)
    out = measure_throughput(att.ctr, lab.host, GATEWAY, 5202, seconds=2)
    assert_shaped(into.bits_per_second, 2_000_000, "ingress")
    assert_shaped(out.bits_per_second, 20_000_000, "egress")


def test_add_sets_up_what_upstream_does(lab: Lab) -> None:
    att = attach(lab, "ingressRate=10mbit,ingressBurst=320000,egressRate=20mbit,egressBurst=400000")
    # tbf on the host veth: 10 Mbit/s = 1,250,000 B/s, burst 40,000 B, latency 25 ms
    tbf = root_tbf(lab.host, att.host_veth)
    assert tbf is not None and tbf["handle"] == "1:"
    assert (tbf["options"]["rate"], tbf["options"]["burst"]) == (1_250_000, 40_000)
    assert tbf["options"]["lat"] == 25_000
    assert any(q["kind"] == "ingress" for q in qdiscs(lab.host, att.host_veth))
    assert redirect_targets(lab.host, att.host_veth) == [att.ifb]
    ifb = links(lab.host)[att.ifb]
    veth = json.loads(lab.host.ip("-j", "link", "show", att.host_veth))[0]
    assert ifb["mtu"] == veth["mtu"] and "UP" in ifb["flags"]
    assert ifb["ifalias"] == f"cni-meta-bandwidth {NETWORK}/ctr1/eth0"
    egress = root_tbf(lab.host, att.ifb)
    assert egress is not None and egress["options"]["rate"] == 2_500_000
    # the ifb is reported like upstream does: name and MAC, no sandbox
    reported = next(i for i in att.result["interfaces"] if i["name"] == att.ifb)
    assert reported == {"name": att.ifb, "mac": ifb["address"]}


# ---------------------------------------------------------------------------- idempotence


def state_of(lab: Lab, att: Attachment) -> tuple[Any, ...]:
    return (
        qdiscs(lab.host, att.host_veth),
        tc_json(lab.host, "filter", "show", "dev", att.host_veth, "ingress"),
        qdiscs(lab.host, att.ifb),
        sorted(links(lab.host)),
    )


def test_second_add_converges_to_the_same_state(lab: Lab) -> None:
    att = attach(lab, rate_spec(10_000_000))
    before = state_of(lab, att)
    again = att.run("ADD").ok().json
    assert state_of(lab, att) == before
    assert [i["name"] for i in again["interfaces"]].count(att.ifb) == 1
    att.run("CHECK").ok()


def test_second_add_with_other_rates_updates_in_place(lab: Lab) -> None:
    att = attach(lab, rate_spec(10_000_000))
    faster = {"ingressRate": 30_000_000, "ingressBurst": 800_000}
    att.run("ADD", att.conf(runtimeConfig={"bandwidth": faster})).ok()
    tbf = root_tbf(lab.host, att.host_veth)
    assert tbf is not None and tbf["options"]["rate"] == 3_750_000
    assert links(lab.host) == {}, "egress is no longer configured: its ifb must go"
    assert redirect_targets(lab.host, att.host_veth) == []
    att.run("CHECK", att.conf(runtimeConfig={"bandwidth": faster})).ok()


# ---------------------------------------------------------------------------- CHECK


def test_check_passes_after_add(lab: Lab) -> None:
    att = attach(lab, rate_spec(10_000_000))
    lab.chain.check(att.conflist, att.ctr, container_id=att.container_id)


def test_check_fails_when_the_redirect_filter_is_deleted(lab: Lab) -> None:
    att = attach(lab, rate_spec(10_000_000))
    lab.host.run("tc", "filter", "del", "dev", att.host_veth, "ingress")
    run = att.run("CHECK")
    assert run.returncode != 0 and run.json["code"] == 102
    assert "redirect" in run.json["details"] and att.ifb in run.json["details"]


def test_check_fails_when_a_rate_is_changed(lab: Lab) -> None:
    att = attach(lab, rate_spec(10_000_000))
    lab.host.run("tc", "qdisc", "change", "dev", att.ifb, "root", "handle", "1:", "tbf",
                 "rate", "5mbit", "burst", "32kb", "latency", "25ms")  # fmt: skip
    run = att.run("CHECK")
    assert run.returncode != 0 and run.json["code"] == 102
    assert "rate is 5000000 bit/s, want 10000000" in run.json["details"]


def test_check_fails_when_the_ifb_is_gone(lab: Lab) -> None:
    att = attach(lab, rate_spec(10_000_000))
    lab.host.ip("link", "del", att.ifb)
    run = att.run("CHECK")
    assert run.json["code"] == 102 and "missing" in run.json["details"]


# ---------------------------------------------------------------------------- DEL and GC


def test_del_leaves_nothing_and_a_second_del_succeeds(lab: Lab) -> None:
    att = attach(lab, rate_spec(10_000_000))
    att.run("DEL").ok()
    # the veth is still there (its own plugin removes it): our qdiscs and filter are gone
    assert qdiscs(lab.host, att.host_veth) == []
    assert_clean(lab, att.host_veth)
    att.run("DEL").ok()
    assert list((lab.state_root / "bandwidth").glob("*.json")) == []
    lab.chain.delete(att.conflist, att.ctr, container_id=att.container_id)


def test_del_succeeds_when_the_netns_is_gone(lab: Lab) -> None:
    ctr = lab.new_netns("gone")
    att = attach(lab, rate_spec(10_000_000), ctr=ctr)
    nslib.delete(ctr)  # takes the veth pair with it
    att.run("DEL", netns=ctr.path).ok()
    att.run("DEL", netns="").ok()
    assert_clean(lab)


def test_del_without_prev_result_or_state_still_removes_the_ifb(lab: Lab) -> None:
    att = attach(lab, rate_spec(10_000_000))
    for f in (lab.state_root / "bandwidth").glob("*.json"):
        f.unlink()
    conf = att.conf()
    del conf["prevResult"]
    att.run("DEL", conf).ok()
    assert links(lab.host) == {}
    assert redirect_targets(lab.host, att.host_veth) == [], "a redirect to nowhere drops traffic"


def gc_conf(valid: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "cniVersion": "1.1.0",
        "name": NETWORK,
        "type": "bandwidth",
        "cni.dev/valid-attachments": [{"containerID": c, "ifname": i} for c, i in valid],
    }


def test_gc_removes_only_the_ifbs_of_attachments_no_longer_valid(lab: Lab) -> None:
    alive = attach(lab, rate_spec(10_000_000), cid="alive")
    dead = attach(lab, rate_spec(10_000_000), ctr=lab.new_netns("dead"), cid="dead")
    # an ifb whose state file was lost: GC still finds it by its alias
    orphan = "bwp0123456789ab"
    lab.host.ip("link", "add", orphan, "type", "ifb")
    lab.host.ip("link", "set", orphan, "alias", f"cni-meta-bandwidth {NETWORK}/orphan/eth0")
    # an ifb of another network and one that is not ours at all stay
    lab.host.ip("link", "add", "bwpothernet0000", "type", "ifb")
    lab.host.ip("link", "set", "bwpothernet0000", "alias", "cni-meta-bandwidth other/x/eth0")
    lab.host.ip("link", "add", "ifb-foreign", "type", "ifb")
    run_plugin(BANDWIDTH, "GC", gc_conf([("alive", "eth0")]), host=lab.host, env=lab.env).ok()
    assert sorted(links(lab.host)) == sorted([alive.ifb, "bwpothernet0000", "ifb-foreign"])
    assert redirect_targets(lab.host, dead.host_veth) == []
    assert redirect_targets(lab.host, alive.host_veth) == [alive.ifb]
    alive.run("CHECK").ok()


# ---------------------------------------------------------------------------- others' config


def test_foreign_ingress_filter_is_kept_and_add_fails_clearly(lab: Lab) -> None:
    att = attach(lab, "ingressRate=10mbit")  # no egress: the ingress hook is free
    lab.host.run("tc", "qdisc", "add", "dev", att.host_veth, "ingress")
    lab.host.run("tc", "filter", "add", "dev", att.host_veth, "ingress", "prio", "5",
                 "protocol", "ip", "u32", "match", "u32", "0", "0", "flowid", "1:5")  # fmt: skip
    before = tc_json(lab.host, "filter", "show", "dev", att.host_veth, "ingress")
    egress_too = {"ingressRate": 10_000_000, "ingressBurst": 262144, "egressRate": 10_000_000,
                  "egressBurst": 262144}  # fmt: skip
    run = att.run("ADD", att.conf(runtimeConfig={"bandwidth": egress_too}))
    assert run.returncode != 0 and run.json["code"] == 101
    assert "prio 5" in run.json["details"]
    assert tc_json(lab.host, "filter", "show", "dev", att.host_veth, "ingress") == before
    assert links(lab.host) == {}, "nothing half-done: no ifb"
    # DEL of the attachment keeps the foreign qdisc and filter too
    att.run("DEL").ok()
    assert tc_json(lab.host, "filter", "show", "dev", att.host_veth, "ingress") == before


def test_foreign_ingress_qdisc_is_shared_and_kept_after_del(lab: Lab) -> None:
    att = attach(lab, "ingressRate=10mbit")
    lab.host.run("tc", "qdisc", "add", "dev", att.host_veth, "ingress")
    both = {"ingressRate": 10_000_000, "ingressBurst": 262144, "egressRate": 10_000_000,
            "egressBurst": 262144}  # fmt: skip
    result = att.run("ADD", att.conf(runtimeConfig={"bandwidth": both})).ok().json
    ifb = next(i["name"] for i in result["interfaces"] if i["name"].startswith("bwp"))
    assert redirect_targets(lab.host, att.host_veth) == [ifb]
    att.run("DEL").ok()
    assert [q["kind"] for q in qdiscs(lab.host, att.host_veth)] == ["ingress"]
    assert redirect_targets(lab.host, att.host_veth) == []


def test_existing_clsact_hook_is_used_and_kept(lab: Lab) -> None:
    att = attach(lab, "ingressRate=10mbit")
    lab.host.run("tc", "qdisc", "add", "dev", att.host_veth, "clsact")
    result = att.run("ADD", att.conf(runtimeConfig={"bandwidth": parse_bandwidth("10mbit")}))
    ifb = next(i["name"] for i in result.ok().json["interfaces"] if i["name"].startswith("bwp"))
    assert redirect_targets(lab.host, att.host_veth) == [ifb]
    att.run("CHECK", att.conf(runtimeConfig={"bandwidth": parse_bandwidth("10mbit")})).ok()
    out = measure_throughput(att.ctr, lab.host, GATEWAY, 5202, seconds=1.5)
    assert_shaped(out.bits_per_second, 10_000_000, "egress")
    att.run("DEL").ok()
    assert [q["kind"] for q in qdiscs(lab.host, att.host_veth)] == ["clsact"]


def test_foreign_root_qdisc_is_not_replaced(lab: Lab) -> None:
    att = attach(lab, "egressRate=10mbit")
    lab.host.run("tc", "qdisc", "add", "dev", att.host_veth, "root", "handle", "7:", "htb")
    run = att.run("ADD", att.conf(runtimeConfig={"bandwidth": parse_bandwidth("10mbit")}))
    assert run.json["code"] == 101 and "htb 7:" in run.json["details"]
    assert [q["kind"] for q in qdiscs(lab.host, att.host_veth)][:1] == ["htb"]


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("bandwidth", "fragment"),
    [
        ({"ingressRate": 1_000_000}, "ingressBurst"),
        ({"egressBurst": 1_000_000}, "egressRate"),
        ({"ingressRate": -5, "ingressBurst": 10}, "at least 0"),
        ({"ingressRate": "fast", "ingressBurst": 10}, "integer"),
        ({"ingressRate": 16, "ingressBurst": 100_000}, "too small"),
    ],
)
def test_invalid_limits_fail_with_7_and_touch_nothing(
    lab: Lab, bandwidth: dict[str, Any], fragment: str
) -> None:
    att = attach(lab, "ingressRate=10mbit")
    lab.host.run("tc", "qdisc", "del", "dev", att.host_veth, "root")
    run = att.run("ADD", att.conf(runtimeConfig={"bandwidth": bandwidth}))
    assert run.returncode != 0 and run.json["code"] == 7, run.stdout
    assert fragment in run.stdout
    assert qdiscs(lab.host, att.host_veth) == [] and links(lab.host) == {}


def test_kubelet_huge_burst_is_clamped_not_fatal(lab: Lab) -> None:
    att = attach(lab, "ingressRate=10mbit")
    kubelet = {"ingressRate": 1_000_000, "ingressBurst": 4294967295}
    conf = att.conf(runtimeConfig={"bandwidth": kubelet})
    att.run("ADD", conf).ok()
    tbf = root_tbf(lab.host, att.host_veth)
    assert tbf is not None and tbf["options"]["rate"] == 125_000
    # 2^32-1 ticks of 64 ns = 274.9 s at 125,000 B/s = 34,359,738 bytes
    assert tbf["options"]["burst"] == 34_359_738
    assert "clamped" in (lab.workdir / "plugins.log").read_text()
    att.run("CHECK", conf).ok()


def test_40_gbit_travels_as_rate64_and_checks(lab: Lab) -> None:
    """5e9 B/s is beyond tc_ratespec's 32 bits: sent and read back as TCA_TBF_RATE64."""
    att = attach(lab, rate_spec(40_000_000_000))  # bursts 20 ms worth: 100,000,000 B
    for dev in (att.host_veth, att.ifb):
        tbf = root_tbf(lab.host, dev)
        assert tbf is not None and tbf["options"]["rate"] == 5_000_000_000, tbf
        assert tbf["options"]["burst"] == 100_000_000
        assert "rate 40Gbit" in lab.host.run("tc", "-s", "qdisc", "show", "dev", dev)
    lab.chain.check(att.conflist, att.ctr, container_id=att.container_id)
    att.run("CHECK").ok()
    # CHECK compares the real rate: 50 Gbit/s has the same U32_MAX in tc_ratespec
    faster = {"ingressRate": 50_000_000_000, "ingressBurst": 800_000_000}
    run = att.run("CHECK", att.conf(runtimeConfig={"bandwidth": faster}))
    assert run.json["code"] == 102
    assert "rate is 40000000000 bit/s, want 50000000000" in run.json["details"]
    att.run("DEL").ok()
    assert_clean(lab, att.host_veth)


def test_cni_docs_example_rate_is_refused_and_its_bursts_are_raised(lab: Lab) -> None:
    """The CNI docs' example (rates 123 bit/s, bursts 456 bits): at 15 B/s tbf passes no
    full frame, so error 7 with the least rate, nothing touched. Its 456-bit bursts with
    a workable rate are raised to one full frame (logged) and traffic passes both tbfs."""
    att = attach(lab, "ingressRate=10mbit")
    lab.host.run("tc", "qdisc", "del", "dev", att.host_veth, "root")
    docs = {"ingressRate": 123, "ingressBurst": 456, "egressRate": 123, "egressBurst": 456}
    run = att.run("ADD", att.conf(runtimeConfig={"bandwidth": docs}))
    assert run.returncode != 0 and run.json["code"] == 7, run.stdout
    assert "at least 2824 bit/s" in run.json["details"]
    assert qdiscs(lab.host, att.host_veth) == [] and links(lab.host) == {}

    bursts = {**docs, "ingressRate": 1_000_000, "egressRate": 1_000_000}
    conf = att.conf(runtimeConfig={"bandwidth": bursts})
    result = att.run("ADD", conf).ok().json
    ifb = next(i["name"] for i in result["interfaces"] if i["name"].startswith("bwp"))
    for dev in (att.host_veth, ifb):
        tbf = root_tbf(lab.host, dev)
        # 125,000 B/s = 0.125 B/us: 1514 B take exactly 12,112 us, raised to 1514 B
        assert tbf is not None and tbf["options"]["burst"] == 1514, tbf
    assert "raised to 12112 bits" in (lab.workdir / "plugins.log").read_text()
    att.run("CHECK", conf).ok()
    with echo_server(att.ctr, 7101):  # 1400-byte segments: full-size frames
        assert request(lab.host, att.ip, 7101, payload=b"x" * 1400) == b"ctr:" + b"x" * 1400
    att.run("DEL", conf).ok()
    assert_clean(lab, att.host_veth)


@pytest.mark.slow
def test_one_frame_bursts_of_1600_bits_shape_real_traffic(lab: Lab) -> None:
    """1600-bit bursts (the CNI docs' other example) at 10 Mbit/s: raised to one frame,
    full-size TCP segments pass in both directions at about the configured rate."""
    small_send_buffers(lab.host, lab.ctr)
    rate = 10_000_000
    att = attach(lab, f"ingressRate={rate},ingressBurst=1600,egressRate={rate},egressBurst=1600")
    tbf = root_tbf(lab.host, att.host_veth)
    # raised to 1515 B; tc shows 1513 (it rounds the 18,937-tick buffer down to whole us)
    assert tbf is not None and 1500 < tbf["options"]["burst"] <= 1515, tbf
    into = measure_throughput(lab.host, att.ctr, att.ip, 5201, seconds=SECONDS)
    assert_shaped(into.bits_per_second, rate, "ingress")
    out = measure_throughput(att.ctr, lab.host, GATEWAY, 5202, seconds=SECONDS)
    assert_shaped(out.bits_per_second, rate, "egress")


def test_old_cni_versions_are_served(lab: Lab) -> None:
    """Upstream refuses configs older than 0.3.0; a 0.2.0 result has no interfaces, so
    the host veth is found by the container interface's peer ifindex alone."""
    att = attach(lab, "ingressRate=10mbit")
    lab.host.run("tc", "qdisc", "del", "dev", att.host_veth, "root")
    prev = {"cniVersion": "0.2.0", "ip4": {"ip": att.ip + "/24", "gateway": GATEWAY}}
    out = att.run("ADD", att.conf(version="0.2.0", prevResult=prev)).ok().json
    assert out["ip4"]["ip"] == att.ip + "/24"
    assert root_tbf(lab.host, att.host_veth) is not None


def test_status_is_ok_without_loading_pyroute2(lab: Lab) -> None:
    """STATUS runs on every runtime status poll: netlink is asked on a plain socket."""
    conf = {"cniVersion": "1.1.0", "name": NETWORK, "type": "bandwidth"}
    trace = {**lab.env, "PYTHONPROFILEIMPORTTIME": "1"}
    run = run_plugin(BANDWIDTH, "STATUS", conf, host=lab.host, env=trace).ok()
    assert "common.skel" in run.stderr and "pyroute2" not in run.stderr


# ---------------------------------------------------------------------------- macvlan


def macvlan_pair(lab: Lab) -> tuple[Netns, Netns]:
    """Two netns with a macvlan each on one parent (bridge mode): 10.66.0.2 / .3.

    The parent is one end of a veth pair (this kernel has no dummy driver)."""
    peer = lab.new_netns("mvpeer")
    lab.host.ip("link", "add", "mvparent", "type", "veth", "peer", "name", "mvlower")
    lab.host.ip("link", "set", "mvparent", "up")
    lab.host.ip("link", "set", "mvlower", "up")
    for ns, addr in ((lab.ctr, "10.66.0.2/24"), (peer, "10.66.0.3/24")):
        name = "mv" + ns.name[-6:]
        lab.host.ip("link", "add", name, "link", "mvparent", "type", "macvlan", "mode", "bridge")
        lab.host.ip("link", "set", name, "netns", ns.name)
        ns.ip("link", "set", name, "name", "eth0")
        ns.ip("addr", "add", addr, "dev", "eth0")
        ns.ip("link", "set", "eth0", "up")
    return lab.ctr, peer


def test_macvlan_is_shaped_inside_the_container(lab: Lab) -> None:
    ctr, peer = macvlan_pair(lab)
    small_send_buffers(ctr, peer)
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": ctr.path}],
        "ips": [{"address": "10.66.0.2/24", "interface": 0}],
    }
    bandwidth = parse_bandwidth("ingressRate=4mbit,egressRate=8mbit")
    conf = {"cniVersion": "1.0.0", "name": "mvnet", "type": "bandwidth",
            "runtimeConfig": {"bandwidth": bandwidth}, "prevResult": prev}  # fmt: skip

    def call(command: str, netns: str = ctr.path) -> PluginRun:
        return run_plugin(BANDWIDTH, command, conf, host=lab.host, container_id="mv1",
                          netns=netns, env=lab.env)  # fmt: skip

    result = call("ADD").ok().json
    ifb = result["interfaces"][-1]
    assert ifb["name"].startswith("bwp") and ifb["sandbox"] == ctr.path
    assert root_tbf(ctr, "eth0") is not None
    assert redirect_targets(ctr, "eth0") == [ifb["name"]]
    assert links(lab.host) == {}, "nothing in the host netns"
    call("ADD").ok()
    call("CHECK").ok()
    into = measure_throughput(peer, ctr, "10.66.0.2", 5201, seconds=2)
    out = measure_throughput(ctr, peer, "10.66.0.3", 5202, seconds=2)
    assert_shaped(into.bits_per_second, 4_000_000, "ingress")
    assert_shaped(out.bits_per_second, 8_000_000, "egress")
    call("DEL").ok()
    assert qdiscs(ctr, "eth0") == [] and links(ctr) == {}
    call("DEL").ok()

"""One container's filters stall no other tenant's bandwidth call (issue 29 finding 5),
on the real kernel.

In container mode (here a macvlan) bandwidth shapes the container's own interface, whose
ingress filters a container with NET_ADMIN adds as it likes. A DEL read them all under
the plugin's one lock: another pod's ADD waited for it and failed at the lock deadline.
Now ADD and DEL hold a lock of their attachment (and the store's shared), and read a
bounded number of filters. The proof is by ordering, not time: attachment A's DEL is
stopped (SIGSTOP, tests.harness.crashpoint) right where it reads its device's filters,
holding its locks, and B's ADD completes meanwhile. Then A's DEL goes on and removes
bandwidth's own objects, keeping the container's filters and the qdisc they hang on.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from bandwidth.plan import ifb_name
from tests.harness.crash import Call, calls
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import PluginRun, invocation, our, run_plugin
from tests.harness.waiting import proc_state

pytestmark = pytest.mark.root

BANDWIDTH = our("bandwidth")
NETWORK = "mvnet"
FILTERS = 3000  # the container's own: far more than a call reads


def macvlan(lab: Lab, ns: Netns, address: str) -> None:
    name = "mv" + ns.name[-6:]
    lab.host.ip("link", "add", name, "link", "mvparent", "type", "macvlan", "mode", "bridge")
    lab.host.ip("link", "set", name, "netns", ns.name)
    ns.ip("link", "set", name, "name", "eth0")
    ns.ip("addr", "add", address, "dev", "eth0")
    ns.ip("link", "set", "eth0", "up")


def conf(ns: Netns, address: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0", "name": NETWORK, "type": "bandwidth",
        "runtimeConfig": {"bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 800_000,
                                        "egressRate": 8_000_000, "egressBurst": 800_000}},
        "prevResult": {"cniVersion": "1.0.0",
                       "interfaces": [{"name": "eth0", "sandbox": ns.path}],
                       "ips": [{"address": address, "interface": 0}]},
    }  # fmt: skip


def call(lab: Lab, command: str, ns: Netns, cid: str, address: str) -> PluginRun:
    return run_plugin(BANDWIDTH, command, conf(ns, address), host=lab.host, container_id=cid,
                      netns=ns.path, env=lab.env)  # fmt: skip


def filters(ns: Netns) -> list[dict[str, Any]]:
    out = ns.run("tc", "-j", "filter", "show", "dev", "eth0", "ingress")
    return json.loads(out) if out.strip() else []


def test_a_del_stopped_amid_a_containers_filters_holds_up_no_other_add(lab: Lab) -> None:
    lab.env["CNI_META_LOCK_TIMEOUT"] = "3"  # before the fix, B's ADD failed with 11 here
    lab.host.ip("link", "add", "mvparent", "type", "veth", "peer", "name", "mvlower")
    lab.host.ip("link", "set", "mvparent", "up")
    lab.host.ip("link", "set", "mvlower", "up")
    a, b = lab.ctr, lab.new_netns("ctrb")
    macvlan(lab, a, "10.66.0.2/24")
    macvlan(lab, b, "10.66.0.3/24")
    call(lab, "ADD", a, "ctr-a", "10.66.0.2/24").ok()
    # container A, root in its netns with NET_ADMIN, adds filters of its own
    batch = lab.workdir / "filters.tc"
    batch.write_text("".join(
        f"filter add dev eth0 parent ffff: prio 2 protocol ip u32 "
        f"match ip dst 10.{n >> 8}.{n & 255}.1/32 flowid 1:1\n" for n in range(FILTERS)
    ))  # fmt: skip
    a.run("tc", "-batch", str(batch))

    # A's DEL, stopped where it reads the device's filters, holding its locks
    a_del = invocation(BANDWIDTH, "DEL", conf(a, "10.66.0.2/24"), host=lab.host,
                       container_id="ctr-a", netns=a.path, env=lab.env)  # fmt: skip
    with calls() as started:
        stopped = Call(a_del, "bandwidth", "bandwidth.tc:Rtnl.device_state@1")
        started.append(stopped)
        stopped.stopped()

        # B's ADD, another tenant's, completes while A's DEL holds its locks
        result = call(lab, "ADD", b, "ctr-b", "10.66.0.3/24").ok().json
        assert result["interfaces"][-1]["name"] == ifb_name(NETWORK, "ctr-b")
        assert proc_state(stopped.proc.pid) == "T", "A's DEL was not held throughout"

        done = stopped.resume().result()
    assert done.returncode == 0, (done.stdout, done.stderr)
    # bandwidth's own objects went; the container's filters and their qdisc stay
    links = json.loads(a.ip("-j", "link", "show", "type", "ifb"))
    assert links == [], links
    assert not [f for f in filters(a) if f.get("pref") == 1]
    rules = [f for f in filters(a) if f.get("pref") == 2 and "match" in f.get("options", {})]
    assert len(rules) == FILTERS, rules[:3]
    assert '"ingress"' in a.run("tc", "-j", "qdisc", "show", "dev", "eth0")
    call(lab, "DEL", b, "ctr-b", "10.66.0.3/24").ok()
    assert json.loads(b.ip("-j", "link", "show", "type", "ifb")) == []

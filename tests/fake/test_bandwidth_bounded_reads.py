"""A container that grows its own device's filters makes no call of bandwidth's slower
than a bound (issue 29 finding 5), against the fake kernel, without root.

In container mode (macvlan, ipvlan, host-device) bandwidth shapes the container's own
interface, whose ingress filters a container with NET_ADMIN can add by the hundred
thousand. Reading them all made a DEL take a minute under the plugin's lock. Now a call
reads at most `tc.MAX_FILTER_ENTRIES` entries of the dump, and decides safely without
the rest: what it did not read is someone else's (kept), so the ingress qdisc those
filters hang on stays, and bandwidth's own redirect (prio 1, read first) still goes.
tests/kernel/test_bandwidth_many_filters.py proves the same on the real kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bandwidth import tc
from bandwidth.model import INGRESS_HANDLE
from bandwidth.plan import ifb_name
from common.errors import CONFLICT
from tests.harness.fake_kernel import FakeKernel, FakeNetns, _encoded

NET, CID = "mvnet", "ctr1"
IFB = ifb_name(NET, CID)
MANY = 1000  # the container's filters: far more than a call may read
# Replies a call may take: the filter dump's bound (tc.MAX_FILTER_ENTRIES) and the
# handful of link and qdisc replies around it. Before the bound, DEL read all MANY.
BOUND = 100


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    return FakeKernel.for_test(tmp_path, monkeypatch)


def conf(netns: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.1.0",
        "name": NET,
        "type": "bandwidth",
        "ingressRate": 800_000, "ingressBurst": 80_000,
        "egressRate": 1_600_000, "egressBurst": 160_000,
        "prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": netns}],
                       "ips": []},
    }  # fmt: skip


def containers_filters(ns: FakeNetns, device: int, count: int) -> None:
    """What the container adds on its own: u32 rules at prio 2 redirecting to its lo."""
    modules = tc.tc_modules()
    for n in range(count):
        msg = modules.tcmsg()
        msg["index"], msg["parent"] = device, INGRESS_HANDLE
        msg["handle"], msg["info"] = 0x80000800 + n, (2 << 16) | 0x0008  # prio 2, ip
        redirect = {"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": 1}
        options = modules.cls_u32.get_parameters(
            {"target": 0x10001, "keys": [f"0x{n:08x}/0xffffffff+16"], "action": redirect}
        )
        msg["attrs"] = [["TCA_KIND", "u32"], ["TCA_OPTIONS", options]]
        ns.filters.append(_encoded(msg))


def shaped_container(kernel: FakeKernel) -> tuple[str, FakeNetns, int]:
    netns = kernel.add_netns("ctr")
    ns = kernel.ns(netns)
    eth0 = kernel.add_link(ns, "eth0", "macvlan")
    code, result = kernel.run("bandwidth", "ADD", conf(netns), netns=netns, container_id=CID)
    assert code == 0, result
    containers_filters(ns, eth0.index, MANY)
    kernel.sent()
    kernel.replies_read = kernel.reopened = 0
    return netns, ns, eth0.index


def test_del_reads_a_bounded_number_of_filters_and_keeps_the_containers(
    kernel: FakeKernel,
) -> None:
    netns, ns, eth0 = shaped_container(kernel)
    code, out = kernel.run("bandwidth", "DEL", conf(netns), netns=netns, container_id=CID)
    assert code == 0, out
    assert kernel.replies_read <= BOUND, kernel.replies_read
    assert kernel.reopened == 1  # the unfinished dump's socket was not used again
    # bandwidth's own redirect and ifb went; the container's filters and the ingress
    # qdisc they hang on stay
    assert kernel.sent() == (
        "ctr: RTM_DELTFILTER dev eth0 parent ffff: prio 1 protocol all\n"
        f"ctr: RTM_DELLINK dev {IFB}\n"
        "ctr: RTM_DELQDISC dev eth0 parent root\n"
    )
    assert len(ns.filters) == MANY and all(f["info"] >> 16 == 2 for f in ns.filters)
    assert (eth0, 0xFFFFFFF1) in ns.qdiscs


def test_add_and_check_read_a_bounded_number_and_name_what_they_did_not_read(
    kernel: FakeKernel,
) -> None:
    netns, _, _ = shaped_container(kernel)
    code, out = kernel.run("bandwidth", "CHECK", conf(netns), netns=netns, container_id=CID)
    assert code != 0 and "more, not read" in out["details"], out
    assert kernel.replies_read <= BOUND, kernel.replies_read
    kernel.replies_read = 0
    code, out = kernel.run("bandwidth", "ADD", conf(netns), netns=netns, container_id=CID)
    assert code != 0 and out["code"] == CONFLICT, out
    assert "u32 filter prio 2" in out["details"] and "more, not read" in out["details"], out
    assert kernel.replies_read <= BOUND, kernel.replies_read
    assert kernel.sent() == ""  # a refused ADD changes nothing

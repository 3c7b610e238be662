"""bandwidth's verbs against a fake kernel (tests/harness/fake_kernel.py), without root.

Each test runs ADD/DEL/CHECK/GC/STATUS through common.skel as the executable would and
compares exact text: the fake's model of links, qdiscs and filters, and the changes that
were sent. tests/kernel/test_bandwidth.py proves the same on the real kernel.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path
from typing import Any

import pytest

from bandwidth.plan import ifb_name
from tests.harness.fake_kernel import FakeKernel

NET, CID = "bwnet", "ctr1"
IFB = ifb_name(NET, CID)


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    return FakeKernel.for_test(tmp_path, monkeypatch)


def conf(netns: str, host_if: str = "veth1", **body: Any) -> dict[str, Any]:
    rates = body or {"ingressRate": 800_000, "ingressBurst": 80_000,
                     "egressRate": 1_600_000, "egressBurst": 160_000}  # fmt: skip
    return {
        "cniVersion": "1.1.0",
        "name": NET,
        "type": "bandwidth",
        **rates,
        "prevResult": {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": host_if}, {"name": "eth0", "sandbox": netns}],
            "ips": [],
        },
    }


def world(kernel: FakeKernel, name: str = "ctr", host_if: str = "veth1") -> str:
    netns = kernel.add_netns(name)
    kernel.add_veth(host_if, netns, "eth0")
    return netns


TBF_IFB = f"tbf dev {IFB} parent root handle 1: rate 200000 buffer 1562500 limit 25000"
TBF_VETH = "tbf dev veth1 parent root handle 1: rate 100000 buffer 1562500 limit 12500"
REDIRECT = f"u32 dev veth1 parent ffff: prio 1 protocol all match all mirred to {IFB}"
CREATE = f"""host: RTM_NEWLINK create excl ifname {IFB} mtu 1500 kind ifb
host: RTM_NEWLINK dev {IFB} up ifalias cni-meta-bandwidth {NET}/{CID}/eth0
host: RTM_NEWQDISC create replace {TBF_IFB}
host: RTM_NEWQDISC create excl ingress dev veth1 parent ingress handle ffff:
host: RTM_NEWQDISC create replace {TBF_VETH}
host: RTM_NEWTFILTER create excl {REDIRECT}
"""
IFB_LINE = f"  5 {IFB} ifb mtu 1500 up alias cni-meta-bandwidth {NET}/{CID}/eth0"
SHAPED = f"""host
  3 veth1 veth mtu 1500 up peer ctr:4
    qdisc ingress dev veth1 parent ingress handle ffff:
    qdisc {TBF_VETH}
    filter {REDIRECT}
{IFB_LINE}
    qdisc {TBF_IFB}
ctr
  4 eth0 veth mtu 1500 up peer host:3
"""
UNSHAPED = """host
  3 veth1 veth mtu 1500 up peer ctr:4
ctr
  4 eth0 veth mtu 1500 up peer host:3
"""
# The redirect filter goes with the ingress qdisc: no request of its own, unless the
# qdisc stays (not known to be ours, or others' filters use it).
REMOVE_FILTER = "host: RTM_DELTFILTER dev veth1 parent ffff: prio 1 protocol all\n"
REMOVE = f"""host: RTM_DELQDISC dev veth1 parent ingress handle ffff:
host: RTM_DELLINK dev {IFB}
host: RTM_DELQDISC dev veth1 parent root
"""


def records(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "state").rglob("*.json"))


def add(kernel: FakeKernel, netns: str, **kw: Any) -> tuple[int, Any]:
    return kernel.run("bandwidth", "ADD", conf(netns), netns=netns, **kw)


# ---------------------------------------------------------------------------- ADD


def test_add_shapes_the_host_veth_and_an_ifb_in_one_safe_order(kernel: FakeKernel) -> None:
    netns = world(kernel)
    code, result = add(kernel, netns)
    assert code == 0, result
    assert result["interfaces"][-1] == {"name": IFB, "mac": "02:00:00:00:00:05"}
    assert kernel.dump() == SHAPED
    assert kernel.sent() == CREATE


def test_second_add_with_the_same_config_sends_nothing(kernel: FakeKernel) -> None:
    netns = world(kernel)
    add(kernel, netns)
    kernel.sent()
    assert add(kernel, netns)[0] == 0
    assert kernel.sent() == ""
    assert kernel.dump() == SHAPED


def test_add_logs_what_it_shapes_in_a_users_words(kernel: FakeKernel, tmp_path: Path) -> None:
    netns = world(kernel)
    add(kernel, netns)
    add(kernel, netns)
    lines = (tmp_path / "plugins.log").read_text().splitlines()
    shaping = [line.split(" shaping ", 1)[1] for line in lines if " shaping " in line]
    shaped = (
        f"ingress 800000 bit/s burst 10000 bytes on veth1, "
        f"egress 1600000 bit/s burst 20000 bytes on ifb {IFB} (fed by veth1)"
    )
    assert shaping == [f"{shaped}; kernel changes: 5", f"{shaped}; in place"]


def test_add_without_the_container_interface_is_error_7_and_changes_nothing(
    kernel: FakeKernel,
) -> None:
    netns = kernel.add_netns("ctr")
    before = kernel.dump()
    code, error = add(kernel, netns)
    assert (code, error["code"]) == (1, 7)
    assert "eth0 not found" in error["msg"]
    assert (kernel.dump(), kernel.sent()) == (before, "")


def test_a_failed_add_is_undone_and_leaves_no_record(kernel: FakeKernel, tmp_path: Path) -> None:
    netns = world(kernel)
    before = kernel.dump()
    kernel.on("RTM_NEWTFILTER", errno.EPERM)
    code, error = add(kernel, netns)
    assert (code, error["code"]) == (1, 100)
    # in words, naming the devices, not the planner's action class
    assert re.fullmatch(
        r"redirecting the ingress of veth1 to the ifb bwp[0-9a-f]{12} failed", error["msg"]
    )
    assert kernel.dump() == before
    assert kernel.sent() == CREATE.replace(REDIRECT, REDIRECT + " -> EPERM") + REMOVE
    assert records(tmp_path) == []


def test_a_failed_undo_keeps_the_record_and_del_finishes(
    kernel: FakeKernel, tmp_path: Path
) -> None:
    netns = world(kernel)
    before = kernel.dump()
    kernel.on("RTM_NEWTFILTER", errno.EPERM)
    kernel.on("RTM_DELLINK", errno.EBUSY)  # the undo cannot remove the ifb
    assert add(kernel, netns)[0] == 1
    assert f"  5 {IFB} ifb" in kernel.dump()
    assert len(records(tmp_path)) == 1
    kernel.sent()
    assert kernel.run("bandwidth", "DEL", conf(netns), netns=netns) == (0, None)
    assert (
        kernel.sent() == f"host: RTM_DELLINK dev {IFB}\nhost: RTM_DELQDISC dev veth1 parent root\n"
    )
    assert kernel.dump() == before
    assert records(tmp_path) == []


def test_a_macvlan_is_shaped_inside_the_container(kernel: FakeKernel) -> None:
    netns = kernel.add_netns("ctr")
    kernel.add_link(kernel.ns(netns), "eth0", "macvlan")
    code, result = kernel.run("bandwidth", "ADD", conf(netns, host_if="none"), netns=netns)
    assert code == 0, result
    dump = kernel.dump()
    assert dump.startswith("host\nctr\n  3 eth0 macvlan")
    assert f"  4 {IFB} ifb" in dump and "filter u32 dev eth0 parent ffff:" in dump
    assert {line.split(":")[0] for line in kernel.sent().splitlines()} == {"ctr"}


def test_del_without_a_record_finds_the_ifb_inside_the_container(
    kernel: FakeKernel, tmp_path: Path
) -> None:
    # The ifb of a macvlan lives in the container netns: the look for it before any
    # rtnetlink (tc.has_device) must ask there too, not only the host.
    netns = kernel.add_netns("ctr")
    kernel.add_link(kernel.ns(netns), "eth0", "macvlan")
    assert kernel.run("bandwidth", "ADD", conf(netns, host_if="none"), netns=netns)[0] == 0
    for record in (tmp_path / "state").rglob("*.json"):
        record.unlink()
    kernel.sent()
    assert kernel.run("bandwidth", "DEL", conf(netns, host_if="none"), netns=netns) == (0, None)
    assert f"ctr: RTM_DELLINK dev {IFB}\n" in kernel.sent()
    assert IFB not in kernel.dump()


# ---------------------------------------------------------------------------- CHECK


def test_check_passes_on_what_add_made_and_names_a_changed_rate(kernel: FakeKernel) -> None:
    netns = world(kernel)
    add(kernel, netns)
    kernel.sent()
    assert kernel.run("bandwidth", "CHECK", conf(netns), netns=netns) == (0, None)
    slower = conf(netns, ingressRate=400_000, ingressBurst=80_000)
    code, error = kernel.run("bandwidth", "CHECK", slower, netns=netns)
    assert (code, error["code"]) == (1, 102)
    assert "rate" in error["details"]
    assert kernel.sent() == ""  # CHECK only reads


def test_check_after_the_netns_went_is_a_finding(kernel: FakeKernel) -> None:
    netns = world(kernel)
    add(kernel, netns)
    kernel.delete_link(netns, "eth0")  # the veth pair goes, as with its netns
    code, error = kernel.run("bandwidth", "CHECK", conf(netns), netns=netns)
    assert (code, error["code"]) == (1, 102)
    assert "eth0 not found" in error["msg"]


# ---------------------------------------------------------------------------- DEL


def test_del_removes_exactly_what_add_made_and_a_second_del_sends_nothing(
    kernel: FakeKernel, tmp_path: Path
) -> None:
    netns = world(kernel)
    before = kernel.dump()
    add(kernel, netns)
    kernel.sent()
    assert kernel.run("bandwidth", "DEL", conf(netns), netns=netns) == (0, None)
    assert kernel.sent() == REMOVE
    assert kernel.dump() == before
    assert records(tmp_path) == []
    assert kernel.run("bandwidth", "DEL", conf(netns), netns=netns) == (0, None)
    assert kernel.sent() == ""


def test_del_after_the_netns_went_removes_the_ifb(kernel: FakeKernel) -> None:
    netns = world(kernel)
    add(kernel, netns)
    kernel.remove_netns(netns)  # the host veth goes with it, its qdiscs and filters too
    kernel.sent()
    assert kernel.run("bandwidth", "DEL", conf(netns), netns=netns) == (0, None)
    assert kernel.sent() == f"host: RTM_DELLINK dev {IFB}\n"
    assert kernel.dump() == "host\n"


@pytest.mark.parametrize("step", ["RTM_GETTFILTER", "RTM_DELQDISC", "RTM_DELLINK"])
def test_del_succeeds_when_the_host_veth_vanishes_midway(kernel: FakeKernel, step: str) -> None:
    netns = world(kernel)
    add(kernel, netns)
    kernel.on(step, lambda: kernel.delete_link(netns, "eth0"))
    assert kernel.run("bandwidth", "DEL", conf(netns), netns=netns) == (0, None)
    assert kernel.dump() == "host\nctr\n"


def test_del_without_a_record_finds_the_attachment_from_the_interface(
    kernel: FakeKernel, tmp_path: Path
) -> None:
    netns = world(kernel)
    add(kernel, netns)
    for record in (tmp_path / "state").rglob("*.json"):
        record.unlink()  # lost, or made by upstream's plugin
    kernel.sent()
    assert kernel.run("bandwidth", "DEL", conf(netns), netns=netns) == (0, None)
    # without a record nothing says the tbf and the ingress qdisc were ours: they stay
    _, remove_ifb, _ = REMOVE.splitlines(keepends=True)
    assert kernel.sent() == REMOVE_FILTER + remove_ifb
    kept = SHAPED.replace(f"    filter {REDIRECT}\n", "").replace(IFB_LINE + "\n", "")
    assert kernel.dump() == kept.replace(f"    qdisc {TBF_IFB}\n", "")


@pytest.mark.parametrize("first", ["unshaped", "shaped"])
def test_del_without_a_record_or_an_ifb_opens_no_rtnetlink_socket(
    kernel: FakeKernel, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    # What containerd's second DEL of every pod and any DEL of an unshaped pod find:
    # nothing to remove, learned without pyroute2 (whose message classes cost more than
    # the rest of the call; see tc.has_device).
    netns = world(kernel)
    if first == "shaped":
        add(kernel, netns)
        assert kernel.run("bandwidth", "DEL", conf(netns), netns=netns) == (0, None)
    else:
        unshaped = conf(netns, capabilities={"bandwidth": True})  # and no rates
        assert kernel.run("bandwidth", "ADD", unshaped, netns=netns)[0] == 0
    opened: list[str] = []
    real_open = kernel.open_socket

    def open_socket(netns: str = "") -> Any:
        opened.append(netns or "host")
        return real_open(netns)

    monkeypatch.setattr(kernel, "open_socket", open_socket)
    assert kernel.run("bandwidth", "DEL", conf(netns), netns=netns) == (0, None)
    assert opened == []
    assert kernel.dump() == UNSHAPED


# ---------------------------------------------------------------------------- GC / STATUS


def test_gc_removes_the_shaping_of_attachments_no_longer_valid(kernel: FakeKernel) -> None:
    first, second = world(kernel, "ctr"), world(kernel, "ctr2", host_if="veth2")
    add(kernel, first)
    kernel.run("bandwidth", "ADD", conf(second, host_if="veth2"), netns=second, container_id="ctr2")
    kernel.sent()
    gc = {"cniVersion": "1.1.0", "name": NET, "type": "bandwidth",
          "cni.dev/valid-attachments": [{"containerID": "ctr2", "ifname": "eth0"}]}  # fmt: skip
    assert kernel.run("bandwidth", "GC", gc, netns="") == (0, None)
    assert kernel.sent() == REMOVE
    assert IFB not in kernel.dump() and ifb_name(NET, "ctr2") in kernel.dump()


def test_gc_deletes_an_orphaned_ifb_by_its_alias(kernel: FakeKernel) -> None:
    kernel.add_link(kernel.host, "bwpgone", "ifb", alias=f"cni-meta-bandwidth {NET}/gone/eth0")
    kernel.add_link(kernel.host, "bwpother", "ifb", alias="cni-meta-bandwidth othernet/x/eth0")
    gc = {"cniVersion": "1.1.0", "name": NET, "type": "bandwidth"}
    assert kernel.run("bandwidth", "GC", gc, netns="") == (0, None)
    assert kernel.sent() == "host: RTM_DELLINK dev bwpgone\n"


def test_status_is_ready_here(kernel: FakeKernel) -> None:
    status = {"cniVersion": "1.1.0", "name": NET, "type": "bandwidth"}
    assert kernel.run("bandwidth", "STATUS", status, netns="") == (0, None)

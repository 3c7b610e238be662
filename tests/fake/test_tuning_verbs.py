"""tuning's verbs against a fake kernel (tests/harness/fake_kernel.py), without root.

Each test runs ADD/DEL/CHECK/GC/STATUS through common.skel as the executable would and
compares exact text: the fake's model of the container's links and sysctls, and the
changes that were sent. tests/kernel/test_tuning.py proves the same on the real kernel.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fake_kernel import FakeKernel
from tuning.config import LINK_OPTIONS

MAC = "02:42:0a:59:00:07"
PER_IF = "net/ipv4/conf/eth0/accept_redirects"
NS_WIDE = "net/ipv4/ip_unprivileged_port_start"
START = """host
ctr
  3 eth0 veth mtu 1500 up
  sysctl net/ipv4/conf/eth0/accept_redirects = 1
  sysctl net/ipv4/ip_unprivileged_port_start = 1024
"""
TUNED = """host
ctr
  3 eth0 veth mtu 1400 txqlen 500 mac 02:42:0a:59:00:07 up promisc
  sysctl net/ipv4/conf/eth0/accept_redirects = 0
  sysctl net/ipv4/ip_unprivileged_port_start = 80
"""
SET = """ctr: RTM_NEWLINK dev eth0 promisc address 02:42:0a:59:00:07 mtu 1400 txqlen 500
ctr: sysctl net/ipv4/conf/eth0/accept_redirects = 0
ctr: sysctl net/ipv4/ip_unprivileged_port_start = 80
"""
RESTORE = """ctr: sysctl net/ipv4/ip_unprivileged_port_start = 1024
ctr: sysctl net/ipv4/conf/eth0/accept_redirects = 1
ctr: RTM_NEWLINK dev eth0 nopromisc address 02:00:00:00:00:03 mtu 1500 txqlen 1000
"""


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    return FakeKernel.for_test(tmp_path, monkeypatch)


@pytest.fixture
def netns(kernel: FakeKernel) -> str:
    path = kernel.add_netns("ctr")
    ns = kernel.ns(path)
    kernel.add_link(ns, "eth0", "veth")
    ns.sysctls.update({PER_IF: "1", NS_WIDE: "1024"})
    return path


def conf(netns: str, **keys: Any) -> dict[str, Any]:
    keys = keys or {
        "mac": MAC,
        "mtu": 1400,
        "promisc": True,
        "txQLen": 500,
        "sysctl": {"net.ipv4.conf.IFNAME.accept_redirects": "0",
                   "net.ipv4.ip_unprivileged_port_start": "80"},
    }  # fmt: skip
    prev = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": netns}], "ips": []}
    return {"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning", "prevResult": prev, **keys}


def backups(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "state").rglob("*") if p.is_file()
                  and "lock" not in p.name)  # fmt: skip


def run(kernel: FakeKernel, command: str, netns: str, **keys: Any) -> tuple[int, Any]:
    return kernel.run("tuning", command, conf(netns, **keys), netns=netns)


# ---------------------------------------------------------------------------- ADD


def test_add_sets_the_link_in_one_request_then_the_sysctls(
    kernel: FakeKernel, netns: str, tmp_path: Path
) -> None:
    assert kernel.dump() == START
    code, result = run(kernel, "ADD", netns)
    assert code == 0, result
    assert kernel.dump() == TUNED
    assert kernel.sent() == SET
    assert len(backups(tmp_path)) == 1


def test_add_on_a_missing_interface_changes_nothing(kernel: FakeKernel, netns: str) -> None:
    kernel.delete_link(netns, "eth0")
    before = kernel.dump()
    code, error = run(kernel, "ADD", netns)
    assert (code, error["code"]) == (1, 100)
    assert "no interface eth0" in error["msg"]
    assert (kernel.dump(), kernel.sent()) == (before, "")


def test_a_refused_sysctl_puts_the_link_back_and_keeps_no_backup(
    kernel: FakeKernel, netns: str, tmp_path: Path
) -> None:
    kernel.on(f"sysctl {NS_WIDE} = 80", errno.EINVAL)
    code, error = run(kernel, "ADD", netns)
    assert (code, error["code"]) == (1, 7)
    assert "refused" in error["msg"]
    lines = SET.splitlines(keepends=True)
    refused = lines[2].replace("\n", " -> EINVAL\n")
    undo = RESTORE.splitlines(keepends=True)[1:]
    assert kernel.sent() == "".join([*lines[:2], refused, *undo])
    assert kernel.dump() == START
    assert backups(tmp_path) == []


def test_a_failed_undo_keeps_the_backup_and_del_restores(
    kernel: FakeKernel, netns: str, tmp_path: Path
) -> None:
    kernel.on(f"sysctl {NS_WIDE} = 80", errno.EINVAL)
    kernel.on("RTM_NEWLINK dev eth0 nopromisc", errno.EBUSY)  # the undo of the link fails
    code, error = run(kernel, "ADD", netns)
    assert (code, error["code"]) == (1, 7)
    assert "could not put back 1 value" in error["details"]
    assert len(backups(tmp_path)) == 1
    kernel.sent()
    assert run(kernel, "DEL", netns) == (0, None)
    assert kernel.dump() == START
    assert backups(tmp_path) == []


def test_an_mtu_below_1280_is_refused_while_eth0_has_ipv6(kernel: FakeKernel, netns: str) -> None:
    kernel.ns(netns).if_inet6 = "fd000089000900000000000000000005 03 40 00 80     eth0\n"
    code, error = run(kernel, "ADD", netns, mtu=1200)
    assert (code, error["code"]) == (1, 7)
    assert "fd00:89:9::5" in error["msg"]
    assert kernel.sent() == ""


# ---------------------------------------------------------------------------- CHECK


def test_check_passes_after_add_and_names_what_changed_since(
    kernel: FakeKernel, netns: str
) -> None:
    run(kernel, "ADD", netns)
    assert run(kernel, "CHECK", netns) == (0, None)
    kernel.ns(netns).sysctls[NS_WIDE] = "1024"
    kernel.ns(netns).by_name("eth0").mtu = 9000  # type: ignore[union-attr]
    code, error = run(kernel, "CHECK", netns)
    assert (code, error["code"]) == (1, 102)
    assert error["details"].endswith("eth0 MTU is 9000, configured 1400")
    assert "ip_unprivileged_port_start is '1024'" in error["details"]


@pytest.mark.parametrize(
    "sysctl",
    [{"net.ipv4.ip_unprivileged_port_start": "\ud800"},
     {"net.ipv4.conf.\udc80x.accept_redirects": "0"}],
    ids=["value", "key"],
)  # fmt: skip
def test_a_lone_surrogate_in_a_sysctl_is_error_7_before_anything_changes(
    kernel: FakeKernel, netns: str, tmp_path: Path, sysctl: dict[str, str]
) -> None:
    """JSON's "\\ud800" is no text a sysctl can take: refused at parse, so the link
    changes that come first are not made either (and no backup is written)."""
    code, error = run(kernel, "ADD", netns, mtu=1400, sysctl=sysctl)
    assert (code, error["code"]) == (1, 7), error
    assert "lone UTF-16 surrogate" in error["msg"]
    assert (kernel.dump(), kernel.sent()) == (START, "")
    assert backups(tmp_path) == []


# ---------------------------------------------------------------------------- link options

# A value for each link option (tuning.config.LINK_OPTIONS) that the fake's eth0 does not
# have yet. An option added in its three places (docs/architecture.md) gets its sample
# here, and the test below proves that the places agree.
SAMPLES = {"mac": MAC, "mtu": 1400, "promisc": True, "allmulti": True, "txQLen": 500}


def test_every_link_option_has_a_sample() -> None:
    assert set(SAMPLES) == {option.key for option in LINK_OPTIONS}


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_each_link_option_is_set_checked_backed_up_and_restored(
    kernel: FakeKernel, netns: str, tmp_path: Path, key: str
) -> None:
    option = {key: SAMPLES[key]}
    assert run(kernel, "ADD", netns, **option)[0] == 0
    assert kernel.dump() != START
    assert run(kernel, "CHECK", netns, **option) == (0, None)
    (backup,) = (tmp_path / "state").rglob("*.json")
    assert key in json.loads(backup.read_text())  # the original, under Go's key
    assert run(kernel, "DEL", netns, **option) == (0, None)
    assert (kernel.dump(), backups(tmp_path)) == (START, [])
    code, error = run(kernel, "CHECK", netns, **option)
    label = next(o.label for o in LINK_OPTIONS if o.key == key)
    assert (code, error["code"]) == (1, 102) and f"eth0 {label} is " in error["details"]


# ---------------------------------------------------------------------------- DEL


def test_del_restores_the_originals_and_a_second_del_sends_nothing(
    kernel: FakeKernel, netns: str, tmp_path: Path
) -> None:
    run(kernel, "ADD", netns)
    kernel.sent()
    assert run(kernel, "DEL", netns) == (0, None)
    assert kernel.sent() == RESTORE
    assert kernel.dump() == START
    assert backups(tmp_path) == []
    assert run(kernel, "DEL", netns) == (0, None)
    assert kernel.sent() == ""


def test_del_after_the_netns_went_forgets_the_backup(
    kernel: FakeKernel, netns: str, tmp_path: Path
) -> None:
    run(kernel, "ADD", netns)
    kernel.remove_netns(netns)
    kernel.sent()
    assert run(kernel, "DEL", netns) == (0, None)
    assert (kernel.sent(), backups(tmp_path)) == ("", [])


def test_del_succeeds_when_eth0_vanishes_midway(
    kernel: FakeKernel, netns: str, tmp_path: Path
) -> None:
    run(kernel, "ADD", netns)
    kernel.sent()
    kernel.on(f"sysctl {PER_IF}", lambda: kernel.delete_link(netns, "eth0"))
    assert run(kernel, "DEL", netns) == (0, None)
    assert kernel.sent() == RESTORE.splitlines(keepends=True)[0]
    assert backups(tmp_path) == []


# ---------------------------------------------------------------------------- GC / STATUS


def test_gc_forgets_the_backups_of_attachments_no_longer_valid(
    kernel: FakeKernel, netns: str, tmp_path: Path
) -> None:
    run(kernel, "ADD", netns)
    kernel.run("tuning", "ADD", conf(netns, mtu=1400), netns=netns, container_id="ctr2")
    assert len(backups(tmp_path)) == 2
    kernel.sent()
    gc = {"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning",
          "cni.dev/valid-attachments": [{"containerID": "ctr2", "ifname": "eth0"}]}  # fmt: skip
    assert kernel.run("tuning", "GC", gc, netns="") == (0, None)
    assert kernel.sent() == ""  # GC forgets, it does not restore: the container is gone
    assert len(backups(tmp_path)) == 1


def test_status_is_ready_with_a_writable_data_dir(kernel: FakeKernel) -> None:
    status = {"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning"}
    assert kernel.run("tuning", "STATUS", status, netns="") == (0, None)


@pytest.mark.parametrize("unsafe", ["group-writable", "symlink"])
def test_status_is_unavailable_with_a_data_dir_add_would_refuse(
    kernel: FakeKernel, tmp_path: Path, unsafe: str
) -> None:
    data_dir = tmp_path / "tuning-data"
    if unsafe == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        data_dir.symlink_to(tmp_path / "real")
    else:
        data_dir.mkdir()
        data_dir.chmod(0o770)
    status = {"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning", "dataDir": str(data_dir)}
    code, error = kernel.run("tuning", "STATUS", status, netns="")
    assert (code, error["code"]) == (1, 50), error
    assert error["msg"].startswith("tuning cannot serve ADDs: ") and str(data_dir) in error["msg"]


def test_del_puts_back_what_it_can_and_forgets_a_backup_it_cannot_use(
    kernel: FakeKernel, netns: str, tmp_path: Path
) -> None:
    """A backup edited by hand: a path outside /proc/sys/net, one with '..', a value the
    kernel refuses and a MAC that is none. DEL restores the rest, logs what it cannot put
    back and forgets the file, instead of failing on every retry."""
    assert run(kernel, "ADD", netns)[0] == 0
    [name] = backups(tmp_path)
    [path] = (tmp_path / "state").rglob(name)
    backup = json.loads(path.read_text())
    backup["sysctls"] = [
        {"path": "kernel/core_pattern", "value": "|/tmp/x"},
        {"path": "net/../kernel/modprobe", "value": "/tmp/x"},
        {"path": "net/ipv4/conf/eth0/accept_redirects", "value": "7"},
        *backup["sysctls"],
    ]
    backup["mac"] = "not a mac"
    path.write_text(json.dumps(backup))
    kernel.sent()
    kernel.on(f"sysctl {PER_IF} = 7", errno.EINVAL)
    assert run(kernel, "DEL", netns) == (0, None)
    assert backups(tmp_path) == []
    link = "RTM_NEWLINK dev eth0 nopromisc mtu 1500 txqlen 1000"
    assert kernel.sent() == (
        RESTORE.splitlines(keepends=True)[0] + RESTORE.splitlines(keepends=True)[1]
        + f"ctr: sysctl {PER_IF} = 7 -> EINVAL\nctr: {link}\n"
    )  # fmt: skip
    log = (tmp_path / "plugins.log").read_text()
    for refused in ("kernel/core_pattern", "net/../kernel/modprobe", "= '7': Invalid argument"):
        assert refused in log and "forgetting it" in log
    assert run(kernel, "DEL", netns) == (0, None)

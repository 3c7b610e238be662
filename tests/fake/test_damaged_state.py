"""State files no call can use (damaged, planted, odd values): DEL always finishes and
forgets them, GC removes them, and the log says what was dropped. Without root: the fake
kernel (tests/harness/fake_kernel.py) and the fake netfilter (fake_portmap.py).

A record used to make every DEL of its attachment fail with 999 when decoding it raised
anything but ValueError (5,000 nested arrays: RecursionError; a deviceIndex of 1e400:
OverflowError), and one that merely read as "not a record" was never removed, by DEL or
by GC.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bandwidth.plan import ifb_name
from bandwidth.record import Record
from common.identity import Attachment
from tests.harness.fake_kernel import FakeKernel
from tests.harness.fake_portmap import FakeNetfilter

NET, CID = "bwnet", "ctr1"
DEEP = "[" * 5000 + "]" * 5000
GOOD = {"network": NET, "containerID": CID, "ifname": "eth0", "mode": "host",
        "device": "veth1", "deviceIndex": 3, "netns": "", "ifb": ifb_name(NET, CID),
        "ownsDeviceTbf": True, "ownsIngressQdisc": True}  # fmt: skip


def damaged(**changes: str) -> str:
    """GOOD's text with values replaced by raw JSON text (1e400 cannot be dumped)."""
    text = json.dumps(GOOD)
    for key, raw in changes.items():
        text = text.replace(f'"{key}": {json.dumps(GOOD[key])}', f'"{key}": {raw}')
    assert all(f'"{key}": {raw}' in text for key, raw in changes.items())
    return text


DAMAGED = {
    "deep": DEEP,
    "index-1e400": damaged(deviceIndex="1e400"),
    "index-negative": damaged(deviceIndex="-1"),
    "index-huge": damaged(deviceIndex=str(10**30)),
    "index-bool": damaged(deviceIndex="true"),
    "index-text": damaged(deviceIndex='"3"'),
    "owns-text": damaged(ownsDeviceTbf='"false"'),
    "device-null": damaged(device="null"),
    "mode-other": damaged(mode='"elsewhere"'),
    "not-json": "{not json",
    "not-utf8": '{"network": "\udcff"}',
    "null": "null",
    "array": "[1, 2]",
}


def log_lines(tmp_path: Path) -> list[str]:
    return (tmp_path / "plugins.log").read_text().splitlines()


# ---------------------------------------------------------------------------- bandwidth


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
    return FakeKernel.for_test(tmp_path, monkeypatch)


def bw_conf(netns: str) -> dict[str, Any]:
    return {
        "cniVersion": "1.1.0", "name": NET, "type": "bandwidth",
        "ingressRate": 800_000, "ingressBurst": 80_000,
        "prevResult": {"cniVersion": "1.1.0", "ips": [],
                       "interfaces": [{"name": "veth1"}, {"name": "eth0", "sandbox": netns}]},
    }  # fmt: skip


def bw_added(kernel: FakeKernel) -> tuple[str, Path]:
    """An attachment ADDed, and its record's file."""
    netns = kernel.add_netns("ctr")
    kernel.add_veth("veth1", netns, "eth0")
    assert kernel.run("bandwidth", "ADD", bw_conf(netns), netns=netns)[0] == 0
    (record,) = Path(os.environ["CNI_META_STATE_ROOT"], "bandwidth").glob("*.json")
    assert Record.from_json(json.loads(record.read_text())) is not None
    return netns, record


def test_a_record_as_written_reads_back_and_a_damaged_one_says_what_is_wrong() -> None:
    rec = Record.from_json(GOOD)  # as written before records said whether committed
    assert rec is not None and rec.to_json() == {**GOOD, "committed": False}
    with pytest.raises(ValueError, match="deviceIndex is not an integer from 1 to"):
        Record.from_json(json.loads(damaged(deviceIndex="1e400")))
    with pytest.raises(ValueError, match="ownsDeviceTbf is not true or false"):
        Record.from_json(json.loads(damaged(ownsDeviceTbf='"false"')))


@pytest.mark.parametrize("content", DAMAGED.values(), ids=DAMAGED.keys())
def test_bandwidth_del_forgets_a_record_it_cannot_use_and_says_so(
    kernel: FakeKernel, tmp_path: Path, content: str
) -> None:
    netns, record = bw_added(kernel)
    record.write_bytes(content.encode("utf-8", "surrogateescape"))
    assert kernel.run("bandwidth", "DEL", bw_conf(netns), netns=netns) == (0, None)
    assert not record.exists()
    # without a usable record it finds the attachment from its interface, as ADD would
    assert ifb_name(NET, CID) not in kernel.dump()
    (warning,) = [line for line in log_lines(tmp_path) if "unusable state file" in line]
    assert f"ignoring unusable state file {record}: " in warning and "bytes: b'" in warning
    assert kernel.run("bandwidth", "DEL", bw_conf(netns), netns=netns) == (0, None)


@pytest.mark.parametrize("content", DAMAGED.values(), ids=DAMAGED.keys())
def test_bandwidth_gc_removes_records_nobody_can_use(
    kernel: FakeKernel, tmp_path: Path, content: str
) -> None:
    _, record = bw_added(kernel)
    record.write_bytes(content.encode("utf-8", "surrogateescape"))
    other = record.with_name("0" * 40 + ".json")  # its name cannot say whose it was
    other.write_bytes(content.encode("utf-8", "surrogateescape"))
    gc = {"cniVersion": "1.1.0", "name": NET, "type": "bandwidth"}
    assert kernel.run("bandwidth", "GC", gc, netns="") == (0, None)
    assert not record.exists() and not other.exists()
    assert ifb_name(NET, CID) not in kernel.dump()  # found by its alias
    removed = [line for line in log_lines(tmp_path) if "gc: removed unusable state file" in line]
    assert len(removed) == 2, removed


def test_bandwidth_gc_leaves_a_record_that_changed_since_it_started(
    kernel: FakeKernel, tmp_path: Path
) -> None:
    """A file replaced after GC took its stamps belongs to an ADD in flight."""
    from common.store import AttachmentStore

    _, record = bw_added(kernel)
    store = AttachmentStore(str(record.parent), Record)
    record.write_text("{not json")
    before = store.stamps()
    assert store.unusable(before) == [(record.name, store.unusable(before)[0][1])]
    record.unlink()
    record.write_text("{not json either")
    assert store.unusable(before) == []


# ---------------------------------------------------------------------------- portmap


class PortmapWorld:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
        monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
        monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
        self.kernel = FakeKernel(tmp_path / "netns")
        self.netns = self.kernel.add_netns("ctr")
        self.fake = FakeNetfilter()
        self.backend = backend
        self.state = tmp_path / "state" / "portmap"

    def conf(self, net: str = "pmnet", **keys: Any) -> dict[str, Any]:
        return {
            "cniVersion": "1.1.0", "name": net, "type": "portmap", "backend": self.backend,
            "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80}]},
            "prevResult": {"cniVersion": "1.1.0",
                           "interfaces": [{"name": "eth0", "sandbox": self.netns}],
                           "ips": [{"address": "10.88.0.5/16", "interface": 0}]},
            **keys,
        }  # fmt: skip

    def run(self, command: str, conf: dict[str, Any]) -> tuple[int, Any]:
        return self.kernel.run(
            "portmap", command, conf, netns=self.netns, container_id=CID, kernel=self.fake
        )

    def record(self, net: str = "pmnet", cid: str = CID) -> Path:
        return self.state / f"{Attachment(net, cid, 'eth0').tag}.json"


@pytest.fixture(params=["nftables", "iptables"])
def pm(request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PortmapWorld:
    return PortmapWorld(tmp_path, monkeypatch, request.param)


@pytest.mark.parametrize("content", [DEEP, "{not json", "null"], ids=["deep", "not-json", "null"])
def test_portmap_del_finishes_and_forgets_a_record_it_cannot_use(
    pm: PortmapWorld, tmp_path: Path, content: str
) -> None:
    assert pm.run("ADD", pm.conf())[0] == 0
    pm.record().write_text(content)
    assert pm.run("DEL", pm.conf()) == (0, None)
    assert not pm.record().exists()
    assert "8080" not in pm.fake.dump()  # found by its owner tag in the kernel
    assert any("ignoring unusable state file" in line for line in log_lines(tmp_path))


def test_portmap_gc_removes_its_networks_records_nobody_can_use(
    pm: PortmapWorld, tmp_path: Path
) -> None:
    pm.state.mkdir(parents=True, mode=0o700)
    mine, other_net = pm.record(cid="gone"), pm.record(net="othernet", cid="gone")
    for path in (mine, other_net):
        path.write_text(DEEP)
    gc = {"cniVersion": "1.1.0", "name": "pmnet", "type": "portmap", "backend": pm.backend}
    assert pm.kernel.run("portmap", "GC", gc, netns="", kernel=pm.fake) == (0, None)
    assert not mine.exists() and other_net.exists()  # another network's GC decides that one
    (line,) = [line for line in log_lines(tmp_path) if "gc: removed unusable" in line]
    assert str(mine) in line and "RecursionError" in line


# ---------------------------------------------------------------------------- tuning


def test_tuning_del_forgets_a_backup_nested_too_deep(kernel: FakeKernel, tmp_path: Path) -> None:
    netns = kernel.add_netns("ctr")
    data_dir = tmp_path / "state" / "tuning"
    data_dir.mkdir(parents=True, mode=0o700)
    backup = data_dir / f"{CID}_eth0.json"
    backup.write_text(DEEP)
    conf = {"cniVersion": "1.1.0", "name": NET, "type": "tuning",
            "prevResult": {"cniVersion": "1.1.0", "interfaces": [], "ips": []}}  # fmt: skip
    assert kernel.run("tuning", "DEL", conf, netns=netns) == (0, None)
    assert not backup.exists()

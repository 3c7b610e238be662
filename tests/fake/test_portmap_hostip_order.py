"""The iptables backend's order of jumps in CNI-HOSTPORT-DNAT against the fake netfilter:
a specific hostIP beats another attachment's wildcard on the same port, whichever came
first (issue 29, finding 2); an order that cannot give every address its owner is a
conflict. tests/kernel/test_portmap_hostip_precedence.py proves it with traffic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.identity import Attachment
from portmap.xtables import chain_name
from tests.harness.fake_kernel import FakeKernel
from tests.harness.fake_portmap import FakeNetfilter

NET = "ordnet"
HOST = "192.168.77.1"


class Host:
    def __init__(self, tmp_path: Path) -> None:
        self.kernel = FakeKernel(tmp_path / "netns")
        self.netns = self.kernel.add_netns("ctr")
        self.fake = FakeNetfilter()
        self.addresses = 5

    def add(self, cid: str, *mappings: tuple[str | None, int, str]) -> tuple[int, Any]:
        self.addresses += 1
        conf = {
            "cniVersion": "1.1.0", "name": NET, "type": "portmap", "backend": "iptables",
            "runtimeConfig": {"portMappings": [
                {"hostPort": port, "containerPort": 80, "protocol": proto}
                | ({"hostIP": ip} if ip else {})
                for ip, port, proto in mappings
            ]},
            "prevResult": {
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "sandbox": self.netns}],
                "ips": [{"address": f"10.88.0.{self.addresses}/16", "interface": 0}],
            },
        }  # fmt: skip
        return self.kernel.run("portmap", "ADD", conf, netns=self.netns, container_id=cid,
                               kernel=self.fake)  # fmt: skip

    def jump_order(self) -> list[str]:
        """The containers whose chains CNI-HOSTPORT-DNAT jumps to, in order."""
        names = {chain_name(Attachment(NET, c, "eth0")): c for c in ("v", "a", "b", "c", "d")}
        rules = self.fake.dump().splitlines()
        return [names[r.split(" -j ")[-1]] for r in rules if r.startswith("-A CNI-HOSTPORT-DNAT")]


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    return Host(tmp_path)


def test_a_wildcard_goes_below_an_earlier_specific_address_of_its_port(host: Host) -> None:
    """The attacker's own specific mapping (9999) used to lift all its jumps, its wildcard
    8080 included, above the victim's."""
    assert host.add("v", (HOST, 8080, "tcp"))[0] == 0
    assert host.add("a", (None, 8080, "tcp"), (HOST, 9999, "tcp"))[0] == 0
    assert host.jump_order() == ["v", "a"]


def test_a_specific_address_goes_above_an_earlier_wildcard_of_its_port(host: Host) -> None:
    assert host.add("v", (None, 7070, "tcp"))[0] == 0  # no relation: stays first
    assert host.add("a", (None, 8080, "tcp"))[0] == 0
    assert host.add("b", (None, 9090, "tcp"))[0] == 0
    assert host.add("c", (HOST, 8080, "tcp"), (None, 6060, "tcp"))[0] == 0
    assert host.jump_order() == ["v", "c", "a", "b"]  # just above a, the first wildcard
    assert host.add("d", (HOST, 8080, "udp"))[0] == 0  # another protocol: no relation
    assert host.jump_order() == ["v", "c", "a", "b", "d"]


def test_an_order_that_cannot_hold_is_a_conflict_and_changes_nothing(host: Host) -> None:
    assert host.add("a", (None, 8080, "tcp"))[0] == 0
    assert host.add("b", (HOST, 9090, "tcp"))[0] == 0
    before = host.fake.dump()
    # its 8080 must be above a, its wildcard 9090 below b, which comes after a
    code, error = host.add("c", (HOST, 8080, "tcp"), (None, 9090, "tcp"))
    assert (code, error["code"]) == (1, 101)
    assert error["msg"] == (
        "the IPv4 host ports of this attachment cannot be ordered against attachments "
        f"{NET}/a/eth0 and {NET}/b/eth0"
    )
    assert host.fake.dump() == before

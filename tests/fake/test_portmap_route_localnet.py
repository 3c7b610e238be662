"""route_localnet's interface and its return, against the fake netfilter: the verbs ask
the kernel port for the route to the container (FakeNetfilter.routes), switch only an
interface that faces the container, and the last attachment that needed it puts back
what portmap found (issue 29, finding 3). tests/kernel/test_portmap_route_localnet.py
proves it on a real kernel with a policy-routed bridge and a neighbour's datagram.

The localhost guard goes with it (FakeNetfilter.guarded): on before the switch, off only
after it is back, whole from the registry each time; tests/kernel/
test_portmap_localhost_guard.py proves with a container's crafted frame what it drops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.errors import CHECK_FAILED
from portmap.kernel import GUARD_TABLE, Route
from tests.harness.fake_kernel import FakeKernel
from tests.harness.fake_portmap import GUARD, FakeNetfilter

NET = "lnnet"
T = "inet cni_meta_portmap"


def path(ifname: str) -> str:
    return f"/proc/sys/net/ipv4/conf/{ifname}/route_localnet"


class Host:
    def __init__(self, tmp_path: Path) -> None:
        self.kernel = FakeKernel(tmp_path / "netns")
        self.netns = self.kernel.add_netns("ctr")
        self.fake = FakeNetfilter()
        self.fake.sysctls = {path(i): "0" for i in ("cni0", "br77", "eth0", "lo")}
        self.state = tmp_path / "state"
        self.log = tmp_path / "plugins.log"

    def run(
        self,
        command: str,
        cid: str = "c1",
        ip: str = "10.88.0.5/16",
        host_side: tuple[str, ...] = (),
        port: int = 0,
        **keys: Any,
    ) -> tuple[int, Any]:
        interfaces = [{"name": n} for n in host_side] + [{"name": "eth0", "sandbox": self.netns}]
        conf = {
            "cniVersion": "1.1.0", "name": NET, "type": "portmap",
            "runtimeConfig": {"portMappings": [{"hostPort": port or 8080 + int(cid[1:]),
                                                "containerPort": 80}]},
            "prevResult": {"cniVersion": "1.1.0", "interfaces": interfaces,
                           "ips": [{"address": ip, "interface": len(host_side)}]},
            **keys,
        }  # fmt: skip
        return self.kernel.run("portmap", command, conf, netns=self.netns, container_id=cid,
                               kernel=self.fake)  # fmt: skip

    def gc(self, *valid: str) -> tuple[int, Any]:
        conf = {
            "cniVersion": "1.1.0",
            "name": NET,
            "type": "portmap",
            "cni.dev/valid-attachments": [{"containerID": c, "ifname": "eth0"} for c in valid],
        }
        return self.kernel.run("portmap", "GC", conf, netns="", kernel=self.fake)  # fmt: skip

    def on(self) -> list[str]:
        """The interfaces whose route_localnet is 1."""
        return sorted(p.split("/")[6] for p, v in self.fake.sysctls.items() if v == "1")

    def writes(self) -> list[str]:
        return [r for r in self.fake.sent().splitlines() if r.startswith("sysctl ")]

    def changes(self) -> list[str]:
        """The sysctl writes and guard changes sent since the last call, in order."""
        return [r for r in self.fake.sent().splitlines() if r.startswith(("sysctl ", GUARD))]

    def entries(self) -> list[str]:
        return sorted(p.name for p in (self.state / "portmap" / "route_localnet").iterdir())


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    return Host(tmp_path)


def test_the_interface_is_the_kernels_route_not_the_main_tables(host: Host) -> None:
    """A policy rule routes 10.77/16 via br77; the main table's default goes via eth0."""
    host.fake.routes = {
        "10.77.0.0/16": Route(1, "br77", "", "bridge"),
        "0.0.0.0/0": Route(1, "eth0", "192.0.2.1"),
    }
    assert host.run("ADD", ip="10.77.0.5/16")[0] == 0
    assert host.on() == ["br77"]
    assert host.run("CHECK", ip="10.77.0.5/16") == (0, None)
    assert host.run("DEL", ip="10.77.0.5/16") == (0, None)
    assert host.on() == []


def test_the_last_attachment_that_needed_it_puts_it_back(host: Host) -> None:
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    assert host.writes() == [f"sysctl {path('cni0')} = 1"]
    assert host.run("ADD", "c2", "10.88.0.6/16")[0] == 0
    assert host.writes() == []  # on already
    assert host.run("DEL", "c1", "10.88.0.5/16") == (0, None)
    assert (host.on(), host.writes()) == (["cni0"], [])  # c2 still needs it
    assert host.run("DEL", "c2", "10.88.0.6/16") == (0, None)
    assert (host.on(), host.writes()) == ([], [f"sysctl {path('cni0')} = 0"])
    assert host.run("DEL", "c2", "10.88.0.6/16") == (0, None)  # the second DEL
    assert host.writes() == []
    assert sorted(p.name for p in (host.state / "portmap" / "route_localnet").iterdir()) == ["lock"]


def test_what_was_on_before_stays_on(host: Host) -> None:
    host.fake.sysctls[path("cni0")] = "1"  # the operator's (or kube-proxy's)
    assert host.run("ADD")[0] == 0
    assert host.run("DEL") == (0, None)
    assert (host.on(), host.writes()) == (["cni0"], [])


def test_gc_puts_it_back_for_attachments_whose_del_never_finished(host: Host) -> None:
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    assert host.run("ADD", "c2", "10.88.0.6/16")[0] == 0
    # c1's DEL was killed after its record went, before it let go of route_localnet
    (record,) = [p for p in (host.state / "portmap").glob("*.json") if "c1" in p.read_text()]
    record.unlink()
    assert host.gc("c2") == (0, None)
    assert host.on() == ["cni0"]  # c2 still needs it
    assert host.gc() == (0, None)
    assert host.on() == []


def test_a_repeated_add_routed_elsewhere_moves_it(host: Host) -> None:
    assert host.run("ADD", ip="10.77.0.5/16")[0] == 0
    assert host.on() == ["cni0"]
    host.fake.routes = {"10.77.0.0/16": Route(1, "br77", "", "bridge")}
    assert host.run("ADD", ip="10.77.0.5/16")[0] == 0
    assert host.on() == ["br77"]
    assert host.run("ADD", ip="10.77.0.5/16", snat=False)[0] == 0  # needs none now
    assert host.on() == []


@pytest.mark.parametrize(
    ("route", "host_side", "why"),
    [
        (Route(2, "lo"), (),
         "the host routes it to itself (a local address), not to a container"),
        (Route(1, "eth0", "192.0.2.1"), (),
         "the host routes it through the gateway 192.0.2.1 on eth0"),
        (Route(1, "eth0"), ("cni0", "veth1"),
         "the host routes it via eth0, none of the chain's (cni0, veth1)"),
        (None, (), "the host has no route to it"),
        (Route(1, "eth0"), (), "the host routes it via eth0, a plain device, not a bridge or veth"),
        # `+` is iptables' wildcard: the guard would match other interfaces
        (Route(1, "br+", "", "bridge"), (),
         "the name of 'br+' has characters the localhost guard cannot match"),
    ],
)  # fmt: skip
def test_an_interface_that_does_not_face_the_container_is_left_alone(
    host: Host, route: Route | None, host_side: tuple[str, ...], why: str
) -> None:
    host.fake.routes = {"10.88.0.0/16": route}
    assert host.run("ADD", host_side=host_side)[0] == 0
    assert (host.on(), host.writes()) == ([], [])
    assert host.run("CHECK", host_side=host_side) == (0, None)  # nothing to check
    assert f"route_localnet left alone: 127.0.0.1:hostPort will not reach 10.88.0.5: {why}" in (
        host.log.read_text()
    )


def test_a_loopback_container_address_is_refused_before_anything(host: Host) -> None:
    code, error = host.run("ADD", ip="127.0.0.5/8")
    assert (code, error["code"]) == (1, 7)
    assert error["msg"] == "prevResult address 127.0.0.5/8 of eth0 is a loopback address"
    assert host.fake.sent() == ""
    assert host.on() == []


def test_an_add_that_cannot_switch_it_undoes_itself(host: Host) -> None:
    host.fake.routes = {"10.88.0.0/16": Route(1, "gone0", "", "bridge")}  # its sysctls went with it
    before = host.fake.dump()
    code, error = host.run("ADD")
    assert (code, error["code"]) == (1, 100)  # KERNEL_FAILURE
    assert error["msg"] == "cannot enable route_localnet on gone0"
    assert host.fake.dump() == before
    assert sorted(p.name for p in (host.state / "portmap" / "route_localnet").iterdir()) == ["lock"]


# ---------------------------------------------------------------------------- the guard


def test_the_guard_goes_on_before_the_switch_and_off_after_it_is_back(host: Host) -> None:
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    assert host.changes() == [f"{GUARD}cni0", f"sysctl {path('cni0')} = 1"]
    assert host.run("ADD", "c2", "10.88.0.6/16")[0] == 0
    assert host.changes() == []  # the guard holds cni0 already, the switch is on
    assert host.run("DEL", "c1", "10.88.0.5/16") == (0, None)
    assert (host.changes(), host.fake.guarded) == ([], ["cni0"])  # c2 still needs both
    assert host.run("DEL", "c2", "10.88.0.6/16") == (0, None)
    assert host.changes() == [f"sysctl {path('cni0')} = 0", f"{GUARD}(none)"]
    assert (host.on(), host.fake.guarded, host.entries()) == ([], [], ["lock"])
    assert host.run("DEL", "c2", "10.88.0.6/16") == (0, None)  # the second DEL
    assert host.changes() == []


def test_every_interface_portmap_switched_is_guarded_and_only_those(host: Host) -> None:
    host.fake.routes = {"10.77.0.0/16": Route(1, "br77", "", "bridge")}
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    assert host.run("ADD", "c2", "10.77.0.5/16")[0] == 0
    assert (host.on(), host.fake.guarded) == (["br77", "cni0"], ["br77", "cni0"])
    assert host.run("DEL", "c1", "10.88.0.5/16") == (0, None)
    assert host.changes()[-2:] == [f"sysctl {path('cni0')} = 0", f"{GUARD}br77"]
    assert (host.on(), host.fake.guarded) == (["br77"], ["br77"])
    # a repeated ADD routed elsewhere moves the guard with the switch
    host.fake.routes = {}
    assert host.run("ADD", "c2", "10.77.0.5/16")[0] == 0
    assert (host.on(), host.fake.guarded) == (["cni0"], ["cni0"])


def test_an_operators_route_localnet_is_guarded_while_portmap_needs_it(host: Host) -> None:
    """On before portmap came (the operator's): portmap does not switch it, but a
    container on the bridge could reach the node's localhost all the same."""
    host.fake.sysctls[path("cni0")] = "1"
    assert host.run("ADD")[0] == 0
    assert host.changes() == [f"{GUARD}cni0"]
    assert host.run("DEL") == (0, None)
    assert host.changes() == [f"{GUARD}(none)"]
    assert host.on() == ["cni0"]  # left as it was found


def test_an_add_whose_guard_cannot_be_made_switches_nothing(host: Host) -> None:
    host.fake.guard_error = "nft refused the localhost guard: Operation not supported"
    before = host.fake.dump()
    code, error = host.run("ADD")
    assert (code, error["code"]) == (1, 100)  # KERNEL_FAILURE
    assert error["msg"] == "cannot enable route_localnet on cni0"
    assert error["details"] == "nft refused the localhost guard: Operation not supported"
    assert host.fake.dump() == before  # no mapping, no switch
    assert host.entries() == ["lock"]


def test_a_del_whose_guard_cannot_be_removed_succeeds_and_the_next_change_repairs_it(
    host: Host,
) -> None:
    """Left over, the guard drops only packets to 127/8 from that interface: not worth a
    DEL that fails; it is written whole at the next change."""
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    host.fake.guard_error = "iptables-nft-restore refused the localhost guard: xtables lock"
    assert host.run("DEL", "c1", "10.88.0.5/16") == (0, None)
    assert (host.on(), host.fake.guarded, host.entries()) == ([], ["cni0"], ["lock"])
    assert "localhost guard of cni0 not removed: iptables-nft-restore refused" in (
        host.log.read_text()
    )
    host.fake.guard_error = ""
    assert host.run("ADD", "c2", "10.88.0.6/16")[0] == 0
    assert host.run("DEL", "c2", "10.88.0.6/16") == (0, None)
    assert host.fake.guarded == []


class Killed(BaseException):
    """The process killed there (nothing in the plugin catches a BaseException)."""


@pytest.mark.parametrize("retry", ["DEL", "GC"])
def test_a_call_killed_between_the_switch_and_the_guard_is_finished_by_the_retry(
    host: Host, monkeypatch: pytest.MonkeyPatch, retry: str
) -> None:
    assert host.run("ADD")[0] == 0
    real = host.fake.nft.run

    def killed_when_removing(text: str) -> tuple[int, str, str]:
        if f"delete table {GUARD_TABLE}" in text:  # the DEL's transaction that carries it
            raise Killed
        return real(text)

    monkeypatch.setattr(host.fake.nft, "run", killed_when_removing)
    with pytest.raises(Killed):
        host.run("DEL")
    # the switch is back, the guard still on: its entry stays for the retry
    assert (host.on(), host.fake.guarded) == ([], ["cni0"])
    entry, lock = host.entries()  # the attachment's entry (its marker went with the switch)
    assert (entry.startswith("cni0@"), entry != "cni0@switched", lock) == (True, True, "lock")
    monkeypatch.setattr(host.fake.nft, "run", real)
    host.fake.sent()
    assert (host.run("DEL") if retry == "DEL" else host.gc()) == (0, None)
    assert host.changes() == [f"{GUARD}(none)"]  # the switch is not touched again
    assert (host.on(), host.fake.guarded, host.entries()) == ([], [], ["lock"])


@pytest.mark.parametrize("others", [(), ("br77",)])
def test_the_last_del_removes_the_guard_in_the_transaction_that_deletes_the_mappings(
    host: Host, monkeypatch: pytest.MonkeyPatch, others: tuple[str, ...]
) -> None:
    """Each nft transaction that deletes makes the process wait for an RCU grace period
    (its netlink socket's close, at exit): the last DEL behind an interface sends one,
    the guard's change (removed, or left on the other interfaces) in it, after the switch
    is back and while the guard still holds the interface."""
    host.fake.routes = {"10.77.0.0/16": Route(1, "br77", "", "bridge")}
    if others:
        assert host.run("ADD", "c2", "10.77.0.5/16")[0] == 0
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    host.fake.sent()
    real, writes = host.fake.nft.run, []

    def run(text: str) -> tuple[int, str, str]:
        if not text.startswith(("get ", "list ")):
            writes.append((text, host.on(), list(host.fake.guarded)))
        return real(text)

    monkeypatch.setattr(host.fake.nft, "run", run)
    assert host.run("DEL", "c1", "10.88.0.5/16") == (0, None)
    ((text, on, guarded),) = writes
    assert f"delete table {GUARD_TABLE}" in text
    assert (f"delete element {T}" if others else f"delete table {T}") in text
    assert (on, guarded) == (list(others), sorted(["cni0", *others]))
    assert host.changes() == [
        f"sysctl {path('cni0')} = 0",
        f"{GUARD}{' '.join(others) or '(none)'}",
    ]
    assert (host.on(), host.fake.guarded) == (list(others), list(others))


def test_a_guard_lost_to_a_firewall_reload_comes_back_with_the_next_add(host: Host) -> None:
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    host.fake.guarded = []  # `nft flush ruleset`
    assert host.run("ADD", "c2", "10.88.0.6/16")[0] == 0
    assert host.fake.guarded == ["cni0"]


def test_the_guard_is_written_only_when_its_interfaces_change(host: Host) -> None:
    """Each write of the guard replaces a table, and a transaction that deletes makes the
    process wait for an RCU grace period at exit: ADDs behind an interface the guard
    already holds write nothing; a new interface, or the last attachment's DEL, writes."""
    host.fake.routes = {"10.77.0.0/16": Route(1, "br77", "", "bridge")}
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    assert [c for c in host.changes() if c.startswith(GUARD)] == [f"{GUARD}cni0"]
    for cid, ip in (("c2", "10.88.0.6/16"), ("c3", "10.88.0.7/16"), ("c1", "10.88.0.5/16")):
        assert host.run("ADD", cid, ip)[0] == 0  # c1's: a repeated ADD
        assert host.changes() == []
    assert host.run("ADD", "c4", "10.77.0.4/16")[0] == 0
    assert host.changes() == [f"{GUARD}br77 cni0", f"sysctl {path('br77')} = 1"]
    for cid, ip in (("c2", "10.88.0.6/16"), ("c3", "10.88.0.7/16")):
        assert host.run("DEL", cid, ip) == (0, None)
        assert host.changes() == []  # c1 still needs cni0
    assert host.run("DEL", "c1", "10.88.0.5/16") == (0, None)
    assert host.changes() == [f"sysctl {path('cni0')} = 0", f"{GUARD}br77"]
    assert host.fake.guarded == ["br77"]


def test_gc_and_check_see_a_guard_lost_to_a_firewall_reload(host: Host) -> None:
    assert host.run("ADD", "c1", "10.88.0.5/16")[0] == 0
    assert host.run("CHECK", "c1", "10.88.0.5/16") == (0, None)
    host.fake.guarded = []  # `nft flush ruleset`
    code, error = host.run("CHECK", "c1", "10.88.0.5/16")
    assert (code, error["code"]) == (1, CHECK_FAILED)
    assert error["msg"] == "the localhost guard lacks cni0"
    host.fake.sent()
    assert host.gc("c1") == (0, None)
    assert host.changes() == [f"{GUARD}cni0"]
    assert host.fake.guarded == ["cni0"]
    assert host.gc("c1") == (0, None)  # held: nothing written
    assert host.changes() == []
    assert host.run("CHECK", "c1", "10.88.0.5/16") == (0, None)

"""DEL when what it removes vanishes midway, at every kernel request in turn.

A runtime that removes a pod's netns makes the kernel destroy the host end of the veth a
moment later; a DEL arriving in between finds the device and then loses it. These tests
put that moment deterministically before each kernel request of a DEL: the verb runs in
this process, inside the lab's host netns, with the one transport function of the plugin
wrapped. Request number N first makes the fault real - it deletes the device the request
names (the host veth, the ifb, the container interface), or the nft table, or the
conntrack entries - so that the kernel itself answers "gone"; only where nothing can be
made to vanish (a namespace-wide sysctl, a conntrack dump) it raises ENODEV instead.
Then: DEL succeeded, and everything else the attachment owned is gone.

The same wrappers also make an undo fail, for the rollback-record tests at the end.
"""

from __future__ import annotations

import errno
import io
import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from common import rtnl
from common.rtnl import NetlinkError, RtnlSocket
from tests.harness import netns as nslib
from tests.harness.bandwidth_world import Attachment, attach, links, qdiscs
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import OUR_BIN, run_plugin
from tests.harness.portmap_world import HOST4, TABLE, add_ext, conntrack_udp, udp_flow
from tests.harness.tuning_world import MAC, NS_WIDE, PER_IF, TUNING, link, make_veth, sysctl
from tests.harness.tuning_world import config as tuning_config

pytestmark = pytest.mark.root

RTM_NAMES = {v: k for k, v in vars(rtnl).items() if k.startswith("RTM_")}


# ---------------------------------------------------------------------------- harness


class Faults:
    """Counts the kernel requests of one verb; before request number `at`, the object it
    names vanishes (`vanish` is handed the way to make that happen for this request)."""

    def __init__(self, at: int = 0) -> None:
        self.at = at
        self.requests: list[str] = []
        self.fired = ""

    def step(self, what: str, vanish: Callable[[], object]) -> None:
        self.requests.append(what)
        if len(self.requests) == self.at:
            self.fired = what
            vanish()


def watch_rtnl(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    """Every rtnetlink request (bandwidth's tc, tuning's links) goes through here; the
    fault deletes the link the request names, by ifindex or by name."""
    original = RtnlSocket.request

    def vanish(sock: RtnlSocket, msg: Any) -> None:
        gone = sock.modules.ifinfmsg()
        gone["index"] = msg["index"]
        names = [v for k, v in msg.get("attrs") or [] if k == "IFLA_IFNAME"]
        if not gone["index"] and names:
            gone["attrs"] = [["IFLA_IFNAME", names[0]]]
        try:
            original(sock, gone, rtnl.RTM_DELLINK)
        except NetlinkError as e:  # no such device: the kernel will say so itself
            assert e.errno == errno.ENODEV, e

    def request(sock: RtnlSocket, msg: Any, msg_type: int, flags: int = 0, **kw: Any) -> Any:
        faults.step(f"{RTM_NAMES[msg_type]}({msg['index']})", lambda: vanish(sock, msg))
        return original(sock, msg, msg_type, flags, **kw)

    original_dump = RtnlSocket.dump

    def dump(sock: RtnlSocket, msg: Any, msg_type: int, limit: int, **kw: Any) -> Any:
        faults.step(f"{RTM_NAMES[msg_type]}({msg['index']})", lambda: vanish(sock, msg))
        return original_dump(sock, msg, msg_type, limit, **kw)

    monkeypatch.setattr(RtnlSocket, "request", request)
    monkeypatch.setattr(RtnlSocket, "dump", dump)


def run_verb(
    monkeypatch: pytest.MonkeyPatch,
    lab: Lab,
    plugin: str,
    command: str,
    conf: dict[str, Any],
    *,
    netns: str,
    container_id: str,
    ifname: str = "eth0",
) -> tuple[int, Any]:
    """Run one verb through common.skel in this process, inside the lab's host netns, as
    the plugin's executable would: (exit code, the JSON it printed)."""
    from common.skel import Plugin, run

    for key, value in lab.env.items():  # the state root and lock timeout are read here
        monkeypatch.setenv(key, value)
    environ = {
        **os.environ,
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_IFNAME": ifname,
        "CNI_NETNS": netns,
        "CNI_PATH": str(OUR_BIN),
    }
    out = io.BytesIO()
    table = Plugin(plugin)
    with lab.host.entered():
        code = run(
            table,
            environ=environ,
            stdin=io.BytesIO(json.dumps(conf).encode()),
            stdout=out,
            stderr=io.StringIO(),
        )
    text = out.getvalue().decode()
    return code, json.loads(text) if text.strip() else None


def every_step(total: int, run_with_fault: Callable[[int], Faults]) -> None:
    """Fault at each request 1..total in turn; each must really have been reached."""
    assert total >= 1
    for n in range(1, total + 1):
        faults = run_with_fault(n)
        assert faults.fired, f"request {n} of {total} was never made: {faults.requests}"


# ---------------------------------------------------------------------------- bandwidth

SPECS = {
    "both": "ingressRate=10mbit,egressRate=20mbit",
    "ingress": "ingressRate=10mbit",  # tbf on the host veth only
    "egress": "egressRate=20mbit",  # ifb, ingress qdisc and redirect only
}
# What a DEL of each has to remove, so its requests must include these (the redirect
# filter goes with the ingress qdisc: no request of its own)
DELETES = {
    "both": {"RTM_DELLINK", "RTM_DELQDISC"},
    "ingress": {"RTM_DELQDISC"},
    "egress": {"RTM_DELLINK", "RTM_DELQDISC"},
}
# And all its requests, reads included: the host veth (GETLINK), its root and ingress
# qdiscs, the filters of the ingress one, the ifb (GETLINK); then the deletes. The ifb's
# qdisc is not read (it goes with the ifb), a redirect to the ifb needs no lookup of its
# target, and the ifb is deleted by the ifindex it was read at.
DEL_REQUESTS = {"both": 8, "ingress": 5, "egress": 7}


def bandwidth_records(lab: Lab) -> list[str]:
    return sorted(p.name for p in (lab.state_root / "bandwidth").glob("*.json"))


def assert_bandwidth_gone(lab: Lab, att: Attachment) -> None:
    assert links(lab.host) == {}, "the ifb was left behind"
    if lab.host.ip("link", "show", att.host_veth, check=False):
        assert qdiscs(lab.host, att.host_veth) == [], "qdiscs left on the host veth"
    assert bandwidth_records(lab) == []


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_bandwidth_del_succeeds_whatever_vanishes_at_each_request(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    def del_with_fault(n: int) -> Faults:
        ctr = lab.new_netns(f"bw{n}")
        att = attach(lab, SPECS[spec], ctr=ctr, cid=f"c{n}")
        faults = Faults(n)
        with monkeypatch.context() as m:
            watch_rtnl(m, faults)
            code, out = run_verb(
                m, lab, "bandwidth", "DEL", att.conf(), netns=ctr.path, container_id=f"c{n}"
            )
        assert code == 0, f"DEL with {faults.fired or 'no fault'} gone: {out}"
        assert_bandwidth_gone(lab, att)
        nslib.delete(ctr)
        return faults

    clean = del_with_fault(0)
    kinds = {r.split("(")[0] for r in clean.requests}
    assert DELETES[spec] <= kinds, clean.requests
    assert len(clean.requests) == DEL_REQUESTS[spec], clean.requests
    every_step(len(clean.requests), del_with_fault)


# ---------------------------------------------------------------------------- tuning

TUNED: dict[str, Any] = {"mac": MAC, "mtu": 1400, "sysctl": {PER_IF: "0", NS_WIDE: "80"}}


def watch_sysctl_writes(monkeypatch: pytest.MonkeyPatch, faults: Faults, ctr: Netns) -> None:
    """tuning's other transport: /proc/sys writes. A per-interface key vanishes with its
    interface; a namespace-wide one cannot vanish, so it is refused with ENODEV."""
    from common import sysctl
    from tuning import apply

    original = sysctl.write_sysctl
    per_if = "/eth0/"

    def vanish(file: str) -> Callable[[], object]:
        if per_if in file:
            return lambda: ctr.ip("link", "del", "eth0")

        def refuse() -> None:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), file)

        return refuse

    def write_sysctl(file: str, value: str) -> None:
        faults.step(f"write {file}", vanish(file))
        original(file, value)

    monkeypatch.setattr(apply, "write_sysctl", write_sysctl)  # where tuning looks it up


def test_tuning_del_succeeds_whatever_vanishes_at_each_request(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    def del_with_fault(n: int) -> Faults:
        ctr = lab.new_netns(f"tu{n}")
        make_veth(lab, ctr)
        before = {"link": link(ctr), PER_IF: sysctl(ctr, PER_IF), NS_WIDE: sysctl(ctr, NS_WIDE)}
        conf = tuning_config(lab, ctr, **TUNED)
        cid = f"c{n}"
        run_plugin(TUNING, "ADD", conf, host=lab.host, netns=ctr.path, env=lab.env,
                   container_id=cid).ok()  # fmt: skip
        assert link(ctr)["mtu"] == 1400
        faults = Faults(n)
        with monkeypatch.context() as m:
            watch_rtnl(m, faults)
            watch_sysctl_writes(m, faults, ctr)
            code, out = run_verb(m, lab, "tuning", "DEL", conf, netns=ctr.path, container_id=cid)
        assert code == 0, f"DEL with {faults.fired or 'no fault'} gone: {out}"
        assert list((lab.state_root / "tuning").glob(f"{cid}_*.json")) == []
        # Whatever the fault did not take away was put back.
        if not faults.fired.startswith(f"write /proc/sys/{NS_WIDE.replace('.', '/')}"):
            assert sysctl(ctr, NS_WIDE) == before[NS_WIDE]
        if ctr.ip("link", "show", "eth0", check=False):
            assert link(ctr) == before["link"] and sysctl(ctr, PER_IF) == before[PER_IF]
        nslib.delete(ctr)
        return faults

    clean = del_with_fault(0)
    assert len(clean.requests) == 4, clean.requests  # two sysctls, read and set the link
    every_step(len(clean.requests), del_with_fault)


# ---------------------------------------------------------------------------- portmap

UDP_PORT = 5353


def portmap_conf(ctr: Netns) -> dict[str, Any]:
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": ctr.path}],
        "ips": [{"address": "10.66.0.2/24", "interface": 0}],
    }
    mappings = [
        {"hostPort": UDP_PORT, "containerPort": 53, "protocol": "udp"},
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
    ]
    return {
        "cniVersion": "1.0.0",
        "name": "faults",
        "type": "portmap",
        "backend": "nftables",
        "capabilities": {"portMappings": True},
        "runtimeConfig": {"portMappings": mappings},
        "prevResult": prev,
    }


def watch_portmap(monkeypatch: pytest.MonkeyPatch, faults: Faults, host: Netns) -> None:
    """portmap's transports: every libnftables command (the fault deletes the table), and
    every conntrack netlink message (the fault deletes the entries a delete names; a dump
    has nothing to vanish, so it is refused with ENODEV)."""
    from common.rtnl import NETLINK_NETFILTER, NetlinkSocket
    from portmap import kernel, nft

    run_nft, send = nft.Nft.run, NetlinkSocket.request
    ct_delete = (kernel.NFNL_SUBSYS_CTNETLINK << 8) | kernel.IPCTNL_MSG_CT_DELETE

    def drop_table() -> None:
        host.run("nft", "delete", "table", *TABLE.split(), check=False)

    def drop_entries() -> None:
        host.run("conntrack", "-D", "-p", "udp", "--orig-port-dst", str(UDP_PORT), check=False)

    def refuse() -> None:
        raise NetlinkError(errno.ENODEV, "injected: no such device")

    def nft_run(self: Any, text: str) -> tuple[int, str, str]:
        faults.step(f"nft {text.splitlines()[0][:40]}", drop_table)
        return run_nft(self, text)

    def request(sock: NetlinkSocket, kind: int, flags: int, body: bytes) -> Any:
        if sock.sock.proto == NETLINK_NETFILTER and kind >> 8 == kernel.NFNL_SUBSYS_CTNETLINK:
            delete = kind == ct_delete
            faults.step("ct delete" if delete else "ct dump", drop_entries if delete else refuse)
        return send(sock, kind, flags, body)

    monkeypatch.setattr(nft.Nft, "run", nft_run)
    monkeypatch.setattr(NetlinkSocket, "request", request)


@pytest.mark.parametrize("state", ["kept", "lost"])
def test_portmap_del_succeeds_whatever_vanishes_at_each_request(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """With its state file DEL takes the fast path (one transaction, no read); without it
    (lost), DEL reads what is still its own and then deletes that."""
    ext = add_ext(lab)
    # The container at the address of the prevResult: a flow is only confirmed (kept in
    # the conntrack table) when it leaves the host.
    lab.host.ip("link", "add", "vctr", "type", "veth", "peer", "name", "eth0", "netns",
                lab.ctr.name)  # fmt: skip
    lab.host.ip("addr", "add", "10.66.0.1/24", "dev", "vctr")
    lab.host.ip("link", "set", "vctr", "up")
    lab.ctr.ip("addr", "add", "10.66.0.2/24", "dev", "eth0")
    lab.ctr.ip("link", "set", "eth0", "up")

    def del_with_fault(n: int) -> Faults:
        conf = portmap_conf(lab.ctr)
        cid = f"c{n}"
        run_plugin(our_portmap(), "ADD", conf, host=lab.host, netns=lab.ctr.path,
                   env=lab.env, container_id=cid).ok()  # fmt: skip
        udp_flow(ext, HOST4, UDP_PORT)  # a flow DEL has to flush
        assert f"dport={UDP_PORT}" in conntrack_udp(lab.host, UDP_PORT)
        if state == "lost":
            for f in (lab.state_root / "portmap").glob("*.json"):
                f.unlink()
        faults = Faults(n)
        with monkeypatch.context() as m:
            watch_portmap(m, faults, lab.host)
            code, out = run_verb(
                m, lab, "portmap", "DEL", conf, netns=lab.ctr.path, container_id=cid
            )
        assert code == 0, f"DEL with {faults.fired or 'no fault'} gone: {out}"
        assert TABLE not in lab.host.run("nft", "list", "tables")
        assert list((lab.state_root / "portmap").glob("*.json")) == []
        # A refused dump leaves the flow (logged, not fatal); so does a table that vanished
        # before a DEL without state could see which ports were its own.
        if faults.fired != "ct dump" and state == "kept":
            flows = conntrack_udp(lab.host, UDP_PORT)
            assert f"dport={UDP_PORT}" not in flows, f"{faults.fired or 'no fault'}: {flows}"
        drop_leftover_flows(lab.host)
        return faults

    clean = del_with_fault(0)
    assert "ct delete" in clean.requests and any(r.startswith("nft") for r in clean.requests)
    every_step(len(clean.requests), del_with_fault)


def our_portmap() -> str:
    return str(OUR_BIN / "portmap")


def drop_leftover_flows(host: Netns) -> None:
    host.run("conntrack", "-D", "-p", "udp", "--orig-port-dst", str(UDP_PORT), check=False)


# ---------------------------------------------------------------------------- failed undo


def fail_first(monkeypatch: pytest.MonkeyPatch, failures: dict[int, int]) -> list[str]:
    """The first request of each rtnetlink type in `failures` is refused with its errno."""
    original = RtnlSocket.request
    pending = dict(failures)
    refused: list[str] = []

    def request(sock: RtnlSocket, msg: Any, msg_type: int, flags: int = 0, **kw: Any) -> Any:
        code = pending.pop(msg_type, 0)
        if code:
            refused.append(RTM_NAMES[msg_type])
            raise NetlinkError(code, f"injected: {os.strerror(code)}")
        return original(sock, msg, msg_type, flags, **kw)

    monkeypatch.setattr(RtnlSocket, "request", request)
    return refused


def test_bandwidth_failed_undo_keeps_the_record_and_del_finishes(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    att = attach(lab, SPECS["both"])
    att.run("DEL").ok()
    assert qdiscs(lab.host, att.host_veth) == [] and links(lab.host) == {}
    with monkeypatch.context() as m:
        # The redirect (the last step of ADD) fails, then the undo fails at the ifb.
        refused = fail_first(m, {rtnl.RTM_NEWTFILTER: errno.ENOBUFS, rtnl.RTM_DELLINK: errno.EBUSY})
        code, out = run_verb(
            m, lab, "bandwidth", "ADD", att.conf(), netns=att.ctr.path, container_id="ctr1"
        )
    assert code != 0 and refused == ["RTM_NEWTFILTER", "RTM_DELLINK"], (out, refused)
    assert any(q["kind"] == "tbf" for q in qdiscs(lab.host, att.host_veth)), "undo got further"
    assert len(bandwidth_records(lab)) == 1, "the record of what is left was dropped"
    att.run("DEL").ok()
    assert_bandwidth_gone(lab, att)


def test_tuning_failed_undo_keeps_the_backup_and_del_restores(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_veth(lab)
    before = link(lab.ctr)
    conf = tuning_config(lab, mtu=1400, sysctl={PER_IF: "0"})
    with monkeypatch.context() as m:
        from tuning import apply

        def refuse_write(file: str, value: str) -> None:
            raise OSError(errno.EIO, "injected: I/O error", file)

        m.setattr(apply, "write_sysctl", refuse_write)  # ADD fails after setting the MTU ...
        original = RtnlSocket.request
        newlinks = []

        def request(sock: RtnlSocket, msg: Any, msg_type: int, flags: int = 0, **kw: Any) -> Any:
            if msg_type == rtnl.RTM_NEWLINK:
                newlinks.append(msg_type)
                if len(newlinks) == 2:  # ... and putting the MTU back fails too
                    raise NetlinkError(errno.EBUSY, "injected: busy")
            return original(sock, msg, msg_type, flags, **kw)

        m.setattr(RtnlSocket, "request", request)
        code, out = run_verb(m, lab, "tuning", "ADD", conf, netns=lab.ctr.path, container_id="ctr1")
    assert code != 0 and len(newlinks) == 2, out
    assert link(lab.ctr)["mtu"] == 1400, "the undo was not made to fail"
    backup = lab.state_root / "tuning" / "ctr1_eth0.json"
    assert backup.exists(), "the backup of the MTU still changed was dropped"
    run_plugin(TUNING, "DEL", conf, host=lab.host, netns=lab.ctr.path, env=lab.env).ok()
    assert link(lab.ctr) == before
    assert not backup.exists()

"""Races of one attachment's calls with each other and with the kernel, made deterministic.

A plugin call is stopped (SIGSTOP, by tests.harness.crashpoint with CRASHPOINT_ACTION=stop)
at a chosen step, keeping every lock and socket it holds; the test then does the other
half of the race (runs a second call, deletes the namespace or the device) and only then
lets the first call go on (SIGCONT). Where the second call must wait for the first one's
lock, the test waits until /proc/locks shows it blocked there. Nothing depends on timing:
every wait is for a condition, with a deadline that only guards against a hang.

* CHECK while the namespace or the device goes away: an honest CNI error (8 when the
  netns is gone, 102 when what was shaped/tuned is gone), never a traceback or 999.
* GC while an ADD is in flight for an attachment not in the valid list: the ADD's result
  survives that GC (the runtime could not have listed it yet) and is collected by the
  next one; other stale attachments go at once.
* Two DELs of one attachment at once: both succeed and nothing is left.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.harness import chained as ch
from tests.harness import snapshot as snap
from tests.harness.crash import Call, calls
from tests.harness.fleet import GATEWAY, Member, fleet
from tests.harness.lab import Lab
from tests.harness.plugins import PluginRun
from tests.harness.traffic import echo_server, reaches

pytestmark = pytest.mark.root


def ok(run: PluginRun, what: str) -> PluginRun:
    assert run.returncode == 0, f"{what} failed: {run.stdout.strip()} {run.stderr.strip()[-400:]}"
    return run


def failed_with(run: PluginRun, code: int, what: str) -> dict[str, Any]:
    assert run.returncode != 0, f"{what} succeeded"
    assert "Traceback" not in run.stderr, run.stderr
    err = json.loads(run.stdout)
    assert err["code"] == code, f"{what}: {err}"
    return dict(err)


def inv(
    lab: Lab, plugin: str, command: str, m: Member, valid: list[Member] | None = None
) -> ch.Invocation:
    """`plugin` may name portmap's backend too: `portmap/iptables`."""
    plugin, _, backend = plugin.partition("/")
    if command == "GC":
        body = ch.gc_conf(plugin, valid or [], backend=backend or None)
    else:
        body = ch.conf(plugin, m, backend=backend or None)
    return ch.invocation(plugin, command, m, lab.host, lab.env, body)


def call(
    lab: Lab, plugin: str, command: str, m: Member, valid: list[Member] | None = None
) -> PluginRun:
    return ch.run(inv(lab, plugin, command, m, valid))


@pytest.fixture(autouse=True)
def private_xtables_lock(lab: Lab) -> None:
    lab.env["XTABLES_LOCKFILE"] = str(lab.workdir / "xtables.lock")


# ---------------------------------------------------------------------------- world


def world(lab: Lab, members: list[Member]) -> snap.Snapshot:
    out = {f"host {k}": v for k, v in snap.netns_snapshot(lab.host.name).items()}
    for m in members:
        ctr = snap.netns_snapshot(m.ctr.name)
        out.update({f"{m.container_id} {k}": v for k, v in ctr.items()})
    out.update(snap.state_snapshot([str(lab.state_root)], ignore_locks=True))
    return out


def same_as_before(before: snap.Snapshot, after: snap.Snapshot, plugin: str) -> None:
    # route_localnet included: the last DEL puts it back
    changes = snap.diff(before, after)
    assert changes == {}, snap.describe(changes)


def state_owners(lab: Lab, plugin: str) -> list[str]:
    """containerID of every per-attachment state file of the plugin."""
    d = lab.state_root / plugin
    names = sorted(n for n in os.listdir(d) if n.endswith(".json")) if d.is_dir() else []
    return [str(json.loads((d / n).read_text()).get("containerID")) for n in names]


# ---------------------------------------------------------------------------- what ADD made


def portmap_works(lab: Lab, m: Member) -> bool:
    with echo_server(m.ctr, 80, "tcp", m.container_id):
        got = reaches(lab.host, GATEWAY, ch.tcp_port(m), "tcp")
    return got == f"{m.container_id}:ping".encode()


def shaped(lab: Lab, m: Member) -> bool:
    qdiscs = json.loads(lab.host.run("tc", "-j", "qdisc", "show", "dev", m.host_veth))
    return sorted(q["kind"] for q in qdiscs) == ["ingress", "tbf"]


def tuned(m: Member) -> bool:
    info = json.loads(m.ctr.ip("-j", "link", "show", "eth0"))[0]
    return (info["address"], info["mtu"]) == (ch.mac(m), ch.MTU)


def in_effect(lab: Lab, plugin: str, m: Member) -> bool:
    """The attachment's ADD is in the kernel and does its job (real traffic for portmap)."""
    if plugin == "portmap":
        return portmap_works(lab, m)
    if plugin == "bandwidth":
        return shaped(lab, m)
    return tuned(m)


def owned(lab: Lab, plugin: str, m: Member) -> bool:
    """The plugin still knows the attachment (its state file is there)."""
    return m.container_id in state_owners(lab, plugin)


def finish_both(
    stopped: Call, stopped_name: str, other: Call, other_name: str, waits: bool
) -> None:
    """`stopped` is held at its stop point while `other` runs: when `other` `waits` for
    the lock `stopped` holds, `stopped` goes on and both succeed in that order; otherwise
    `other` succeeds first, then `stopped` goes on and succeeds too."""
    if waits:
        other.waiting_for_lock()
        ok(stopped.resume().result(), stopped_name)
        ok(other.result(), other_name)
    else:
        ok(other.result(), other_name)
        ok(stopped.resume().result(), stopped_name)


# ---------------------------------------------------------------------------- two DELs at once

# (plugin, where DEL A stops, whether DEL B then waits for A's lock)
READ = "common.statedir:StateDir.read_bytes"
TWO_DELS = [
    pytest.param("portmap", f"{READ}@1+", False, id="portmap-unlocked-read"),
    pytest.param("portmap", f"{READ}@2+", True, id="portmap-locked-read"),
    pytest.param("bandwidth", f"{READ}@1+", True, id="bandwidth-locked-read"),
    pytest.param("tuning", f"{READ}@1+", False, id="tuning-unlocked-read"),
    pytest.param("tuning", f"{READ}@2+", True, id="tuning-locked-read"),
]


@pytest.mark.parametrize(("plugin", "stop_at", "b_waits"), TWO_DELS)
def test_two_dels_of_one_attachment_at_once_both_succeed_and_leave_nothing(
    lab: Lab, plugin: str, stop_at: str, b_waits: bool
) -> None:
    """DEL A stops right after it read the attachment's state; DEL B of the same attachment
    runs meanwhile (to its end, or until it waits for A's lock); then A goes on."""
    with fleet(lab.host, 1) as f, calls() as running:
        (m,) = f.members
        before = world(lab, [m])
        ok(call(lab, plugin, "ADD", m), "ADD")
        assert in_effect(lab, plugin, m)
        a = Call(inv(lab, plugin, "DEL", m), plugin, stop_at)
        running.append(a)
        a.stopped()
        b = Call(inv(lab, plugin, "DEL", m))
        running.append(b)
        finish_both(a, "DEL A", b, "DEL B", b_waits)
        same_as_before(before, world(lab, [m]), plugin)
        ok(call(lab, plugin, "DEL", m), "a third DEL")


# ---------------------------------------------------------------------------- CHECK vs. vanishing


@pytest.mark.parametrize("plugin", ch.PLUGINS)
def test_check_of_a_netns_already_gone_is_error_8(lab: Lab, plugin: str) -> None:
    with fleet(lab.host, 1) as f:
        (m,) = f.members
        ok(call(lab, plugin, "ADD", m), "ADD")
        subprocess.run(["ip", "netns", "del", m.ctr.name], check=True)
        err = failed_with(call(lab, plugin, "CHECK", m), 8, "CHECK without its netns")
        assert m.ctr.path in err["msg"]
        ok(call(lab, plugin, "DEL", m), "DEL after the netns went")


def added_then_checking(
    lab: Lab, plugin: str, m: Member, stop_at: str, running: list[Call]
) -> Call:
    """ADD `m`, then start a CHECK of it and hold it at `stop_at`."""
    ok(call(lab, plugin, "ADD", m), "ADD")
    check = Call(inv(lab, plugin, "CHECK", m), plugin, stop_at)
    running.append(check)
    check.stopped()
    return check


# (plugin, where CHECK stops, the error it ends with once resumed; None: it passes)
CHECK_STOPS = [
    # Before it opens the container netns: it cannot any more.
    ("bandwidth", "common.netns:entered@1", 8),  # common.rtnl, opening its socket
    ("tuning", "tuning.apply:entered@1", 8),
    # It has found what to compare and is about to read it: it holds the namespace (a
    # socket in it, or its thread inside), and removing the name does not destroy it.
    # portmap never enters it (its rules are in the host), so it answers the same.
    ("bandwidth", "bandwidth.tc:Rtnl.observe@1", None),
    ("tuning", "tuning.apply:read_sysctls@1", None),
    ("portmap", "portmap.nft:Nft.get@1", None),
]


@pytest.mark.parametrize(("plugin", "stop_at", "error"), CHECK_STOPS)
def test_check_fails_if_the_runtime_removes_the_netns_before_it_enters_and_passes_after(
    lab: Lab, plugin: str, stop_at: str, error: int | None
) -> None:
    with fleet(lab.host, 1) as f, calls() as running:
        (m,) = f.members
        check = added_then_checking(lab, plugin, m, stop_at, running)
        subprocess.run(["ip", "netns", "del", m.ctr.name], check=True)
        if error is None:
            ok(check.resume().result(), "CHECK")
        else:
            assert m.ctr.path in failed_with(check.resume().result(), error, "CHECK")["msg"]
        ok(call(lab, plugin, "DEL", m), "DEL after the netns went")


# (plugin, where CHECK stops, the device then deleted: netns or "host", name)
DEVICE_GOES = [
    pytest.param("bandwidth", "bandwidth.tc:Rtnl.observe@1", "host", id="bandwidth-host-veth"),
    pytest.param("tuning", "tuning.apply:read_sysctls@1", "ctr", id="tuning-eth0"),
]


@pytest.mark.parametrize(("plugin", "stop_at", "where"), DEVICE_GOES)
def test_check_whose_device_vanishes_midway_reports_it_gone_as_102(
    lab: Lab, plugin: str, stop_at: str, where: str
) -> None:
    """The kernel destroys the veth pair (as after the netns went) while CHECK reads it."""
    with fleet(lab.host, 1) as f, calls() as running:
        (m,) = f.members
        check = added_then_checking(lab, plugin, m, stop_at, running)
        if where == "host":
            lab.host.ip("link", "del", m.host_veth)
        else:
            m.ctr.ip("link", "del", "eth0")
        failed_with(check.resume().result(), 102, "CHECK")
        ok(call(lab, plugin, "DEL", m), "DEL after the device went")


@pytest.mark.parametrize("plugin", ["bandwidth", "tuning"])
def test_check_after_the_device_went_is_102(lab: Lab, plugin: str) -> None:
    """The netns is still there but the veth pair is not (deleted from the host side)."""
    with fleet(lab.host, 1) as f:
        (m,) = f.members
        ok(call(lab, plugin, "ADD", m), "ADD")
        lab.host.ip("link", "del", m.host_veth)
        failed_with(call(lab, plugin, "CHECK", m), 102, "CHECK")
        ok(call(lab, plugin, "DEL", m), "DEL after the device went")


# ---------------------------------------------------------------------------- GC vs. ADD in flight

# Where the ADD stops, and whether GC then waits for the ADD's lock.
ADD_STOPS = [
    pytest.param("common.statedir:flock_with_deadline@1", False, id="before-its-lock"),
    pytest.param("common.statedir:StateDir.write_json@1+", True, id="holding-its-lock"),
]


@pytest.mark.parametrize(("stop_at", "gc_waits"), ADD_STOPS)
@pytest.mark.parametrize("which", [*ch.PLUGINS, "portmap/iptables"])
def test_gc_spares_an_add_in_flight_and_collects_it_next_time(
    lab: Lab, which: str, stop_at: str, gc_waits: bool
) -> None:
    """A runtime lists the attachments it knows; one whose ADD has not returned yet is not
    among them. GC must not undo that ADD (the container would start without its port
    mappings, shaping or settings) but still removes what is really stale; the next GC,
    whose list was made after the ADD, is the one that may collect it."""
    plugin = which.partition("/")[0]
    with fleet(lab.host, 2) as f, calls() as running:
        stale, flying = f.members
        ok(call(lab, which, "ADD", stale), "ADD of the stale attachment")
        add = Call(inv(lab, which, "ADD", flying), plugin, stop_at)
        running.append(add)
        add.stopped()
        gc = Call(inv(lab, which, "GC", flying, valid=[]))
        running.append(gc)
        finish_both(add, "ADD in flight", gc, "GC", gc_waits)

        assert not owned(lab, plugin, stale)
        if plugin != "tuning":  # (tuning's GC forgets backups; it never enters a netns)
            assert not in_effect(lab, plugin, stale)
        assert owned(lab, plugin, flying)
        assert in_effect(lab, plugin, flying)
        ok(call(lab, which, "CHECK", flying), "CHECK of the ADD GC ran beside")

        ok(call(lab, which, "GC", flying, valid=[]), "the next GC")
        assert not owned(lab, plugin, flying)
        if plugin != "tuning":
            assert not in_effect(lab, plugin, flying)
        for m in (stale, flying):
            ok(call(lab, which, "DEL", m), "DEL after GC")
        assert state_owners(lab, plugin) == []

"""Crashes: every plugin SIGKILLed at every step of ADD and DEL, then retried or collected.

For each plugin (portmap with each backend, bandwidth, tuning), one container on a bridge
in a lab host netns is reused. tests/harness/crashpoint.py runs the plugin so that it kills
itself right before, or right after, the N-th call of each step that changes the kernel
or a state file, for every N a clean ADD and DEL make (counted from a clean run, so the
number follows the code). Then, by the trial's kind:

* add-retry: the runtime retries ADD -> it succeeds, CHECK passes, the kernel is exactly
  as after a clean ADD; DEL -> the kernel and the state dir are as before the trial;
* add-gc: the runtime forgets the container and runs GC (cni.dev/valid-attachments
  without it) -> everything the killed ADD left is gone;
* del: DEL of a complete ADD is killed; the retried DEL leaves nothing.

A kill at any other moment leaves what one of these leaves: before the first step nothing
has changed; between two steps nothing watched changes; a step is one libnftables
transaction, one netlink message, one sysctl write or one state file rename (a kill
inside the write before it leaves a temporary file, as the kill before the rename does);
an iptables-restore the plugin started runs to its end (SIGKILL reaches the plugin
only), as after the step.

"As before" is a full snapshot (tests/harness/snapshot.py) of the host and container
namespaces (nft ruleset, legacy iptables, links, qdiscs, ingress filters, sysctls) and of
the state dir, lock files apart (kept for good by design, see common/statedir.py). The
snapshot right after each kill says where it landed: `untouched`, `state only` (the state
file changed, the kernel not yet), `partial` (between two kernel changes) or `complete`.
Set CNI_META_CRASH_REPORT to a file to get the figures as JSON lines.

The tests of the snapshot and diff functions themselves (what the session's leak check
in conftest.py relies on) are at the end.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness import chained as ch
from tests.harness import netns as nslib
from tests.harness import snapshot as snap
from tests.harness.crash import at_crash_point
from tests.harness.crash import crash_points as crash_points_of
from tests.harness.fleet import Member, fleet
from tests.harness.lab import Lab, host_snapshot
from tests.harness.plugins import PluginRun

pytestmark = pytest.mark.root

REPORT = os.environ.get("CNI_META_CRASH_REPORT", "")


def kernel(s: snap.Snapshot) -> snap.Snapshot:
    return {k: v for k, v in s.items() if not k.startswith("dir ")}


def state(s: snap.Snapshot) -> snap.Snapshot:
    return {k: v for k, v in s.items() if k.startswith("dir ")}


@dataclass
class Rig:
    """One plugin, one container, reused by every trial."""

    lab: Lab
    member: Member
    plugin: str
    backend: str | None
    baseline: snap.Snapshot = field(default_factory=dict)  # before ADD
    full: snap.Snapshot = field(default_factory=dict)  # after a clean ADD

    def inv(self, command: str) -> ch.Invocation:
        m = self.member
        if command == "GC":
            alive = Member(999, m.ctr)  # the runtime still knows another container
            body = ch.gc_conf(self.plugin, [alive], backend=self.backend)
        else:
            body = ch.conf(self.plugin, m, backend=self.backend)
        return ch.invocation(self.plugin, command, m, self.lab.host, self.lab.env, body)

    def call(self, command: str) -> PluginRun:
        return ch.run(self.inv(command))

    def world(self) -> snap.Snapshot:
        out = {f"host {k}": v for k, v in snap.netns_snapshot(self.lab.host.name).items()}
        ctr = snap.netns_snapshot(self.member.ctr.name)
        out.update({f"container {k}": v for k, v in ctr.items()})
        out.update(snap.state_snapshot([str(self.lab.state_root)], ignore_locks=True))
        return out


def ok(run: PluginRun, what: str) -> None:
    assert run.returncode == 0, f"{what} failed: {run.stdout.strip()} {run.stderr.strip()[:300]}"


def same(actual: snap.Snapshot, wanted: snap.Snapshot, what: str) -> None:
    changes = snap.diff(wanted, actual)
    assert not changes, f"{what}:\n{snap.describe(changes)}"


def check_residue(rig: Rig, residue: dict[str, list[str]]) -> None:
    if rig.plugin != "portmap":
        assert residue == {}, snap.describe(residue)
        return
    # route_localnet, which the ADD turned on toward the container, is off again: the
    # last attachment that needed it is gone, whatever point the ADD died at
    assert "host sysctls" not in residue, snap.describe(residue)
    if rig.backend == "iptables":
        # Like Go's portmap: the legacy nat table with the shared CNI-HOSTPORT-* chains
        # and their jumps stays; nothing of any attachment.
        lines = residue.pop("host iptables (legacy)")
        assert all(line.startswith("+") for line in lines), lines
        assert not [x for x in lines if "CNI-DN-" in x or ch.NETWORK in x], lines
    assert residue == {}, snap.describe(residue)


def warm_up(rig: Rig, rounds: int = 3) -> None:
    """Clean ADD/DEL rounds: the run times, and the snapshots before and after ADD."""
    ok(rig.call("GC"), "first GC")  # nothing to collect (the iptables backend opens IPv6 nat)
    pristine = rig.world()
    for _ in range(rounds):
        ok(rig.call("ADD"), "warm-up ADD")
        rig.full = rig.world()
        ok(rig.call("DEL"), "warm-up DEL")
    rig.baseline = rig.world()
    check_residue(rig, snap.diff(pristine, rig.baseline))
    assert kernel(rig.full) != kernel(rig.baseline)  # ADD does change something to watch


def stage(now: snap.Snapshot, before: snap.Snapshot, after: snap.Snapshot) -> str:
    """Where a kill landed, judged by what it left."""
    if kernel(now) == kernel(before):
        return "untouched" if state(now) == state(before) else "state only"
    if kernel(now) == kernel(after):
        return "complete"
    return "partial"  # between two kernel changes


def reset_container(rig: Rig, original: dict[str, str]) -> None:
    """After GC of a killed tuning ADD: GC forgets the backup (the container is gone for
    the runtime) and never touches the container; put its eth0 back for the next trial."""
    ctr = rig.member.ctr
    ctr.ip("link", "set", "eth0", "address", original["mac"], "mtu", original["mtu"])
    ctr.sysctl("net.ipv4.conf.eth0.accept_redirects", original["accept_redirects"])


def eth0_original(rig: Rig) -> dict[str, str]:
    info = json.loads(rig.member.ctr.ip("-j", "link", "show", "eth0"))[0]
    return {
        "mac": str(info["address"]),
        "mtu": str(info["mtu"]),
        "accept_redirects": rig.member.ctr.sysctl("net.ipv4.conf.eth0.accept_redirects"),
    }


def recover(rig: Rig, kind: str, original: dict[str, str]) -> None:
    """What a runtime does after a killed call, and the proof that it leaves nothing."""
    if kind == "add-retry":
        ok(rig.call("ADD"), "ADD retried after a kill")
        ok(rig.call("CHECK"), "CHECK after the retried ADD")
        same(rig.world(), rig.full, "retried ADD differs from a clean ADD")
        ok(rig.call("DEL"), "DEL after the retried ADD")
    elif kind == "add-gc":
        ok(rig.call("GC"), "GC after a killed ADD")
        if rig.plugin == "tuning":
            same(state(rig.world()), state(rig.baseline), "GC left tuning state behind")
            reset_container(rig, original)
    else:
        ok(rig.call("DEL"), "DEL retried after a kill")
    same(rig.world(), rig.baseline, f"{kind}: not back to the state before the trial")


@pytest.fixture
def rig(lab: Lab, request: pytest.FixtureRequest) -> Iterator[Rig]:
    plugin, backend = request.param
    lab.env["XTABLES_LOCKFILE"] = str(lab.workdir / "xtables.lock")  # not the machine's
    lab.env["CNI_META_IPTABLES"] = "legacy"  # its residue is read from the legacy snapshot
    with fleet(lab.host, 1) as f:
        yield Rig(lab, f.members[0], plugin, backend)


# ---------------------------------------------------------------------------- crash points


def crash_points(rig: Rig, command: str) -> list[str]:
    """Every step of a clean `command` (from the current state), before and after."""
    return crash_points_of(rig.inv(command), rig.plugin, rig.lab.workdir / "crashpoint-count.json")


@pytest.mark.parametrize(
    "rig",
    [("portmap", None), ("bandwidth", None), ("tuning", None), ("portmap", "iptables")],
    indirect=True,
    ids=["portmap-nftables", "bandwidth", "tuning", "portmap-iptables"],
)
def test_sigkill_at_every_step_then_retry_or_gc_leaves_nothing(rig: Rig) -> None:
    warm_up(rig, rounds=1)
    original = eth0_original(rig)
    add_points = crash_points(rig, "ADD")
    ok(rig.call("DEL"), "DEL after counting")
    ok(rig.call("ADD"), "ADD before counting DEL")
    del_points = crash_points(rig, "DEL")
    same(rig.world(), rig.baseline, "after counting")
    stages: Counter[str] = Counter()
    for spec, kind in [
        *((p, "add-retry") for p in add_points),
        *((p, "add-gc") for p in add_points),
        *((p, "del") for p in del_points),
    ]:
        command = "DEL" if kind == "del" else "ADD"
        if kind == "del":
            ok(rig.call("ADD"), "ADD before the killed DEL")
        killed = at_crash_point(rig.inv(command), rig.plugin, spec)
        assert killed.returncode == -9, f"{kind} {spec} was not killed: {killed.stdout}"
        before, after = (rig.full, rig.baseline) if kind == "del" else (rig.baseline, rig.full)
        stages[stage(rig.world(), before, after)] += 1
        try:
            recover(rig, kind, original)
        except AssertionError as e:
            raise AssertionError(f"{kind} killed at {spec}: {e}") from None
    figures = {
        "plugin": rig.plugin + (f"-{rig.backend}" if rig.backend else ""),
        "crash_points": {"ADD": len(add_points), "DEL": len(del_points)},
        "trials": 2 * len(add_points) + len(del_points),
        "stages": dict(stages),
    }
    print(json.dumps(figures))
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps(figures) + "\n")
    # The points reach the kernel work, not just the start: some kills landed once the
    # plugin had changed the kernel (else the counting watched the wrong steps).
    assert stages["partial"] + stages["complete"] > 0, figures


def test_del_beside_a_killed_add_still_removes_the_table(lab: Lab) -> None:
    """B's ADD dies right after writing its intent (before its transaction); A, the only
    attachment with mappings, is DELed first and cannot know B never got any: B's DEL,
    finding nothing of its own in the table, must still remove the table as the last."""
    with fleet(lab.host, 2) as f:
        a, b = f.members
        rig = Rig(lab, b, "portmap", None)
        ok(rig.call("GC"), "first GC")
        pristine = rig.world()
        ok(ch.run(ch.invocation("portmap", "ADD", a, lab.host, lab.env)), "ADD of A")
        killed = at_crash_point(rig.inv("ADD"), "portmap", "common.libnftables:Context.run@1")
        assert killed.returncode == -9
        assert len(list((lab.state_root / "portmap").glob("*.json"))) == 2  # B's intent
        ok(ch.run(ch.invocation("portmap", "DEL", a, lab.host, lab.env)), "DEL of A")
        ok(rig.call("DEL"), "DEL of B")
        changes = snap.diff(pristine, rig.world())
        assert changes == {}, snap.describe(changes)


# ---------------------------------------------------------------------------- the leak check


@pytest.fixture
def scratch() -> Iterator[nslib.Netns]:
    with nslib.namespaces("snap") as (ns,):
        yield ns


def test_snapshot_of_a_namespace_is_stable_and_reading_it_changes_nothing(
    scratch: nslib.Netns,
) -> None:
    first = snap.netns_snapshot(scratch.name)
    assert snap.diff(first, snap.netns_snapshot(scratch.name)) == {}
    # dumping legacy iptables would instantiate the tables: only existing ones are read
    assert scratch.run("cat", "/proc/net/ip_tables_names").strip() == ""
    assert scratch.run("cat", "/proc/net/ip6_tables_names").strip() == ""


def test_snapshot_diff_names_every_kind_of_leak(scratch: nslib.Netns, tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    (state_dir / "portmap").mkdir(parents=True)
    (state_dir / "portmap" / "nftables.lock").write_text("")
    before = {
        **snap.netns_snapshot(scratch.name),
        **snap.state_snapshot([str(state_dir)], ignore_locks=True),
    }
    scratch.ip("link", "add", "leak0", "type", "veth", "peer", "name", "leak1")
    scratch.ip("link", "set", "leak0", "up")
    scratch.run("tc", "qdisc", "add", "dev", "leak0", "root", "tbf", "rate", "1mbit",
                "burst", "32k", "latency", "25ms")  # fmt: skip
    scratch.run("tc", "qdisc", "add", "dev", "leak0", "ingress")
    scratch.run("tc", "filter", "add", "dev", "leak0", "parent", "ffff:", "protocol", "all",
                "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect",
                "dev", "leak1")  # fmt: skip
    scratch.run("nft", "add", "table", "inet", "leaktest")
    scratch.run("iptables-legacy", "-t", "nat", "-N", "LEAK")
    scratch.sysctl("net.ipv4.conf.all.route_localnet", "1")
    (state_dir / "portmap" / "abc.json").write_text("{}")
    (state_dir / "portmap" / "bandwidth.lock").write_text("")  # a lock file: not a leak
    after = {
        **snap.netns_snapshot(scratch.name),
        **snap.state_snapshot([str(state_dir)], ignore_locks=True),
    }
    changes = snap.diff(before, after)
    assert set(changes) == {
        "links",
        "qdiscs",
        "ingress filters",
        "nft ruleset",
        "iptables (legacy)",
        "sysctls",
        f"dir {state_dir}",
    }, snap.describe(changes)
    assert changes[f"dir {state_dir}"] == [changes[f"dir {state_dir}"][0]]
    assert "abc.json" in changes[f"dir {state_dir}"][0]
    assert "+net/ipv4/conf/all/route_localnet = 1" in changes["sysctls"]
    assert any("leaktest" in line for line in changes["nft ruleset"])
    assert any(":LEAK" in line for line in changes["iptables (legacy)"])
    # lock files are left out only on request (the machine's dirs are judged with them)
    assert "bandwidth.lock" in snap.dir_listing(str(state_dir))
    assert "lock" not in snap.dir_listing(str(state_dir), ignore_locks=True)


def test_machine_snapshot_is_stable() -> None:
    """The session's own leak check (conftest.host_untouched) must not see changes where
    there are none: two snapshots of the untouched machine are equal."""
    first = host_snapshot()
    assert {"nft ruleset", "links", "sysctls", "dir /run/cni", "dir /var/lib/cni"} <= set(first)
    assert snap.diff(first, host_snapshot()) == {}


def test_state_dir_listing_sees_content_and_mode_changes(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text("1")
    first = snap.dir_listing(str(tmp_path))
    f.write_text("2")
    second = snap.dir_listing(str(tmp_path))
    os.chmod(f, 0o600)
    assert len({first, second, snap.dir_listing(str(tmp_path))}) == 3
    assert snap.dir_listing(str(tmp_path / "missing")) == "<absent>"

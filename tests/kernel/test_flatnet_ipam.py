"""flatnet-ipam with a real store, run as a runtime runs an IPAM plugin (env and stdin,
inside a test-made host netns, CNI_NETNS a test-made container netns), beside the Go
host-local of /usr/lib/cni on the same lease directory, always a private dataDir.

host-local and ours free each other's leases; 100 ADDs in parallel get 100 addresses; a
SIGKILL at every step of ADD, DEL and GC, then DEL or GC, leaves no lease (and never an
empty one); GC with a valid list; an ADD in flight survives a GC; STATUS when full or when
the store is unusable; leases from before the boot are free and a clock step frees none.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from tests.harness.crash import Call, calls
from tests.harness.crash import at_crash_point as harness_at_crash_point
from tests.harness.crash import crash_points as crash_points_of
from tests.harness.lab import Lab
from tests.harness.plugins import Invocation, PluginRun, go, invocation, our, run_plugin
from tests.harness.waiting import HANG_GUARD

pytestmark = pytest.mark.root

OURS = our("flatnet-ipam")
HOST_LOCAL = go("host-local")
NETWORK = "ipamnet"
VALID = "cni.dev/valid-attachments"


class Store:
    """One network's leases in a private dataDir, and the calls that change them."""

    def __init__(self, lab: Lab, **ipam: Any) -> None:
        self.lab = lab
        self.data_dir = lab.workdir / "leases"
        self.dir = self.data_dir / NETWORK
        self.index = self.data_dir / ".flatnet-ipam" / NETWORK
        self.ipam: dict[str, Any] = {"subnet": "10.77.0.0/16", **ipam}

    def conf(self, version: str = "1.1.0", **top: Any) -> dict[str, Any]:
        ipam = {"type": "flatnet-ipam", "dataDir": str(self.data_dir), **self.ipam}
        return {"cniVersion": version, "name": NETWORK, "type": "flatnet-ipam", "ipam": ipam,
                **top}  # fmt: skip

    def call(self, command: str, cid: str = "", ifname: str = "eth0", exe: str = OURS,
             version: str = "1.1.0", cni_args: str = "", **top: Any) -> PluginRun:  # fmt: skip
        return run_plugin(
            exe, command, self.conf(version, **top), host=self.lab.host, container_id=cid,
            ifname=ifname, netns=self.lab.ctr.path if command != "GC" else "",
            env=self.lab.env, cni_args=cni_args,
        )  # fmt: skip

    def invocation(self, command: str, cid: str = "", env: dict[str, str] | None = None,
                   **top: Any) -> Invocation:  # fmt: skip
        """Our call, not yet run: started in the background, or at a crash point."""
        netns = self.lab.ctr.path if command != "GC" else ""
        full = {**self.lab.env, "CNI_PATH": "/nonexistent", **(env or {})}
        return invocation(OURS, command, self.conf(**top), host=self.lab.host, container_id=cid,
                          netns=netns, env=full)  # fmt: skip

    def ok(self, command: str, cid: str = "", **kw: Any) -> PluginRun:
        run = self.call(command, cid, **kw)
        assert run.returncode == 0, f"{command} {cid}: {run.stdout} {run.stderr}"
        return run

    def add(self, cid: str, **kw: Any) -> list[str]:
        return [ip["address"] for ip in self.ok("ADD", cid, **kw).json["ips"]]

    def host_local(self, command: str, cid: str, **kw: Any) -> PluginRun:
        return self.ok(command, cid, exe=HOST_LOCAL, version="1.0.0", **kw)

    def gc(self, *valid: tuple[str, str]) -> PluginRun:
        top: dict[str, Any] = {VALID: [{"containerID": c, "ifname": i} for c, i in valid]}
        return self.ok("GC", **top)

    def leases(self) -> dict[str, bytes]:
        """Lease file name -> content (the cursor, the lock and our temporaries apart)."""
        if not self.dir.exists():
            return {}
        return {
            p.name: p.read_bytes()
            for p in self.dir.iterdir()
            if p.name != "lock" and not p.name.startswith("last_reserved_ip.")
        }

    def records(self) -> list[str]:
        return sorted(p.name for p in self.index.glob("*")) if self.index.exists() else []

    def assert_whole(self) -> None:
        """Every lease is complete: `<id>\\r\\n<ifname>`, never empty, no temporary file."""
        for name, content in self.leases().items():
            assert not name.startswith("."), f"a temporary file was left: {name}"
            cid, sep, ifname = content.decode().partition("\r\n")
            assert sep and cid and ifname, f"lease {name} is not whole: {content!r}"

    def assert_empty(self) -> None:
        assert self.leases() == {}, self.leases()
        assert [r for r in self.records() if r.endswith(".json")] == [], self.records()
        leftovers = [r for r in self.records() if r not in ("seen", "seen.tmp")]
        assert leftovers == [], leftovers


def bare(address: str) -> str:
    return address.partition("/")[0]


@pytest.fixture
def store(lab: Lab) -> Store:
    return Store(lab)


# ---------------------------------------------------------------------------- host-local


def test_host_local_and_ours_free_each_others_leases(store: Store) -> None:
    [mine] = store.add("ours1")
    hl = store.host_local("ADD", "go1").json["ips"][0]["address"]
    # One cursor for both: host-local continues after ours, and ours after host-local.
    assert (mine, hl) == ("10.77.0.2/16", "10.77.0.3/16")
    assert store.add("ours2") == ["10.77.0.4/16"]
    # The same file format, byte for byte.
    assert store.leases() == {
        "10.77.0.2": b"ours1\r\neth0",
        "10.77.0.3": b"go1\r\neth0",
        "10.77.0.4": b"ours2\r\neth0",
    }
    assert (store.dir / "last_reserved_ip.0").read_text() == "10.77.0.4"

    store.ok("DEL", "go1")  # ours frees host-local's
    store.host_local("DEL", "ours1")  # host-local frees ours
    assert set(store.leases()) == {"10.77.0.4"}
    store.ok("CHECK", "ours2")
    failed = store.call("CHECK", "ours1")
    assert failed.returncode == 1 and failed.json["code"] == 102, failed.stdout
    store.ok("DEL", "ours1")  # its record goes; the address may be someone else's by now
    store.ok("DEL", "ours2")
    store.assert_empty()


def test_ipv6_leases_are_named_as_host_local_names_them(lab: Lab) -> None:
    store = Store(lab, subnet=None, ranges=[[{"subnet": "10.78.0.0/24"}],
                                            [{"subnet": "fd00:78:0:0:1::/112"}]])  # fmt: skip
    del store.ipam["subnet"]
    store.host_local("ADD", "go6")
    # Go writes the first of two equal runs of zeros as "::" (glibc's inet_ntop too, but
    # not for every address: the unit tests hold the cases where they differ).
    assert store.add("ours6") == ["10.78.0.3/24", "fd00:78::1:0:0:3/112"]
    assert set(store.leases()) == {"10.78.0.2", "fd00:78::1:0:0:2", "10.78.0.3", "fd00:78::1:0:0:3"}
    store.ok("DEL", "go6")
    store.host_local("DEL", "ours6")
    assert store.leases() == {}


def test_host_local_leases_from_before_we_ran_are_adopted_and_freed(store: Store) -> None:
    for i in range(5):
        store.host_local("ADD", f"go{i}")
    # The first call of ours on this network: host-local's ADDs were all before it.
    for i in range(5):
        store.ok("DEL", f"go{i}")
    assert store.leases() == {}


def test_a_del_for_an_attachment_never_seen_succeeds(store: Store) -> None:
    store.ok("DEL", "nobody")
    store.ok("DEL", "nobody")
    store.assert_empty()


def test_an_attachment_added_again_keeps_its_address(store: Store) -> None:
    first = store.add("c1")
    assert store.add("c1") == first
    assert store.add("c1", ifname="eth1") != first  # another attachment


def test_requested_addresses(store: Store) -> None:
    assert store.add("c1", runtimeConfig={"ips": ["10.77.9.9/16"]}) == ["10.77.9.9/16"]
    assert store.add("c2", cni_args="IgnoreUnknown=1;IP=10.77.9.10") == ["10.77.9.10/16"]
    taken = store.call("ADD", "c3", runtimeConfig={"ips": ["10.77.9.9"]})
    assert taken.returncode == 1 and taken.json["code"] == 101, taken.stdout
    assert "10.77.9.9" in taken.json["msg"]
    outside = store.call("ADD", "c3", args={"cni": {"ips": ["10.99.0.1"]}})
    assert outside.returncode == 1 and outside.json["code"] == 7, outside.stdout
    assert "10.99.0.1" in outside.json["msg"]
    assert set(store.leases()) == {"10.77.9.9", "10.77.9.10"}  # the refused left nothing


def test_result_routes_and_dns(lab: Lab) -> None:
    resolv = lab.workdir / "resolv.conf"
    resolv.write_text("# comment\nnameserver 10.0.0.53\nsearch a.example b.example\n"
                      "domain example\noptions ndots:2\n")  # fmt: skip
    store = Store(lab, routes=[{"dst": "0.0.0.0/0"}, {"dst": "10.9.0.0/16", "gw": "10.77.0.9"}],
                  resolvConf=str(resolv))  # fmt: skip
    result = store.ok("ADD", "c1").json
    assert result["ips"] == [{"address": "10.77.0.2/16", "gateway": "10.77.0.1"}]
    assert result["routes"] == [
        {"dst": "0.0.0.0/0", "gw": "10.77.0.1"},
        {"dst": "10.9.0.0/16", "gw": "10.77.0.9"},
    ]
    assert result["dns"] == {
        "nameservers": ["10.0.0.53"], "domain": "example",
        "search": ["a.example", "b.example"], "options": ["ndots:2"],
    }  # fmt: skip


# ---------------------------------------------------------------------------- parallel


def test_100_parallel_adds_get_100_distinct_addresses_and_100_dels_free_them(
    store: Store,
) -> None:
    def spawn(command: str, cid: str) -> Call:
        return Call(store.invocation(command, cid, {"CNI_META_LOCK_TIMEOUT": "120"}))

    def finish(started: list[Call]) -> list[Any]:
        out = []
        for call in started:
            run = call.result(timeout=300)
            assert run.returncode == 0, run.stdout + run.stderr
            out.append(run.json)
        return out

    ids = [f"par{i}" for i in range(100)]
    results = finish([spawn("ADD", cid) for cid in ids])
    addresses = [bare(r["ips"][0]["address"]) for r in results]
    assert len(set(addresses)) == 100
    leases = store.leases()
    assert {name: leases[name] for name in addresses} == {
        a: f"{cid}\r\neth0".encode() for a, cid in zip(addresses, ids, strict=True)
    }
    assert len(leases) == 100
    finish([spawn("DEL", cid) for cid in ids])
    store.assert_empty()


# ---------------------------------------------------------------------------- crash points


def at_crash_point(store: Store, command: str, cid: str, spec: str, env: dict[str, str],
                   **top: Any) -> PluginRun:  # fmt: skip
    return harness_at_crash_point(store.invocation(command, cid, **top), "flatnet_ipam", spec, env)


def crash_points(store: Store, command: str, cid: str, **top: Any) -> list[str]:
    count_file = store.lab.workdir / "crashpoint-count.json"
    points = crash_points_of(store.invocation(command, cid, **top), "flatnet_ipam", count_file)
    assert points, "no crash point was reached"
    return points


def test_sigkill_at_every_step_then_del_or_gc_leaves_no_lease(store: Store) -> None:
    # Another attachment's lease and host-local's stay through all of it.
    store.add("bystander")
    store.host_local("ADD", "go-bystander")
    keep = (("bystander", "eth0"), ("go-bystander", "eth0"))
    kept = dict(store.leases())
    # (this call adopts host-local's lease: the counted calls below then see the same
    # store as the trials, each of which starts where the last recovery left it)
    store.ok("CHECK", "bystander")
    add_points = crash_points(store, "ADD", "victim")
    store.ok("DEL", "victim")
    store.add("victim")
    del_points = crash_points(store, "DEL", "victim")
    store.add("victim")
    gc_points = crash_points(store, "GC", "", **{"cni.dev/valid-attachments": [
        {"containerID": c, "ifname": i} for c, i in keep]})  # fmt: skip
    assert store.leases() == kept
    trials = [(p, "ADD", how) for p in add_points for how in ("DEL", "GC", "ADD+DEL")]
    trials += [(p, "DEL", how) for p in del_points for how in ("DEL", "GC")]
    trials += [(p, "GC", "GC") for p in gc_points]
    for spec, command, recovery in trials:
        if command != "ADD":
            store.add("victim")
        valid = {"cni.dev/valid-attachments": [{"containerID": c, "ifname": i} for c, i in keep]}
        killed = at_crash_point(store, command, "victim" if command != "GC" else "", spec, {},
                                **(valid if command == "GC" else {}))  # fmt: skip
        where = f"{command} killed at {spec}, then {recovery}"
        assert killed.returncode == -signal.SIGKILL, f"{where}: not killed: {killed.stdout!r}"
        store.assert_whole()
        if recovery == "ADD+DEL":
            store.add("victim")
            store.ok("DEL", "victim")
        elif recovery == "DEL":
            store.ok("DEL", "victim")
        else:
            store.gc(*keep)
        assert store.leases() == kept, f"{where}: {store.leases()}"
        records = [r for r in store.records() if r.endswith(".json")]
        assert len(records) == 2, f"{where}: {records}"  # the two bystanders'
    print(json.dumps({"crash_points": {"ADD": len(add_points), "DEL": len(del_points),
                                       "GC": len(gc_points)}, "trials": len(trials)}))  # fmt: skip


# ---------------------------------------------------------------------------- GC


def test_gc_frees_every_lease_not_in_the_valid_list_host_locals_too(store: Store) -> None:
    for cid in ("c1", "c2", "c3"):
        store.add(cid)
    store.host_local("ADD", "go1")
    store.host_local("ADD", "go2")
    empty = store.dir / "10.77.200.1"  # host-local killed between its create and its write
    empty.write_bytes(b"")
    store.gc(("c1", "eth0"), ("go1", "eth0"))
    assert store.leases() == {"10.77.0.2": b"c1\r\neth0", "10.77.0.5": b"go1\r\neth0"}
    store.gc()
    store.assert_empty()


def test_gc_spares_an_add_in_flight(store: Store) -> None:
    """The ADD stops itself holding the lock, its lease claimed; GC starts (its list made
    before the ADD returned, so without it) and waits for the lock; the ADD goes on."""
    none: dict[str, Any] = {VALID: []}
    with calls() as started:
        adding = Call(store.invocation("ADD", "inflight"), "flatnet_ipam",
                      "flatnet_ipam.store:LeaseStore.claim@1+")  # fmt: skip
        started.append(adding)
        adding.stopped()
        gc = Call(store.invocation("GC", **none))
        started.append(gc)
        gc.waiting_for_lock()
        assert adding.resume().result(timeout=HANG_GUARD).returncode == 0
        assert gc.result(timeout=HANG_GUARD).returncode == 0
    assert store.leases() == {"10.77.0.2": b"inflight\r\neth0"}
    store.ok("CHECK", "inflight")
    store.gc()  # the next GC, whose list would name it if it were alive
    store.assert_empty()


# ---------------------------------------------------------------------------- STATUS


def test_status_is_50_when_full_and_0_when_an_address_is_free(lab: Lab) -> None:
    store = Store(lab, subnet="10.77.0.0/29", rangeStart="10.77.0.2", rangeEnd="10.77.0.4")
    store.ok("STATUS")
    for cid in ("c1", "c2", "c3"):
        store.add(cid)
    full = store.call("STATUS")
    assert full.returncode == 1 and full.json["code"] == 50, full.stdout
    refused = store.call("ADD", "c4")
    assert refused.returncode == 1 and "no IP addresses available" in refused.json["msg"]
    store.ok("DEL", "c2")
    store.ok("STATUS")


def test_status_is_50_when_the_store_cannot_be_used(lab: Lab) -> None:
    store = Store(lab)
    store.data_dir.write_text("a file where the dataDir should be")
    answer = store.call("STATUS")
    assert answer.returncode == 1 and answer.json["code"] == 50, answer.stdout


# ---------------------------------------------------------------------------- boot


def as_if_written_in_an_earlier_boot(store: Store) -> None:
    """Our records and `seen` as a call in another boot would have left them."""
    for path in store.index.iterdir():
        data = json.loads(path.read_text())
        data["boot"] = "00000000-0000-0000-0000-000000000000"
        path.write_text(json.dumps(data))


def test_leases_from_before_the_boot_are_free(store: Store) -> None:
    store.add("old1")
    store.host_local("ADD", "go-old")
    store.add("old2")  # (adopts host-local's lease: this boot, as far as we can tell)
    as_if_written_in_an_earlier_boot(store)
    store.add("new1")
    assert store.leases() == {"10.77.0.5": b"new1\r\neth0"}
    store.ok("DEL", "old1")  # the runtime's late DEL finds nothing, and succeeds
    store.ok("DEL", "new1")
    store.assert_empty()


def test_release_on_reboot_false_keeps_them(lab: Lab) -> None:
    store = Store(lab, releaseOnReboot=False)
    store.add("old1")
    as_if_written_in_an_earlier_boot(store)
    store.add("new1")
    assert set(store.leases()) == {"10.77.0.2", "10.77.0.3"}


def test_a_clock_step_frees_no_live_lease(store: Store) -> None:
    store.add("c1")
    store.host_local("ADD", "go1")
    day = 86400
    for step in (-day * 365, day * 365):
        for path in [store.dir, *store.dir.iterdir(), *store.index.iterdir()]:
            st = path.stat()
            os.utime(path, (st.st_atime + step, st.st_mtime + step))
        store.add("c2", ifname=f"eth{step > 0:d}")
        store.gc(("c1", "eth0"), ("go1", "eth0"), ("c2", "eth0"), ("c2", "eth1"))
    assert set(store.leases()) == {"10.77.0.2", "10.77.0.3", "10.77.0.4", "10.77.0.5"}


def test_a_lease_dir_changed_behind_our_back_is_seen(store: Store) -> None:
    """host-local's ADD right after ours (the same clock tick) is still adopted."""
    for i in range(20):
        store.add(f"c{i}")
        store.host_local("ADD", f"go{i}")
        store.ok("DEL", f"go{i}")
        assert len(store.leases()) == i + 1, f"round {i}: {store.leases()}"


def test_an_address_that_changed_hands_is_left_to_its_new_holder(store: Store) -> None:
    store.add("c1")  # 10.77.0.2
    store.host_local("DEL", "c1")  # freed behind our back...
    store.host_local("ADD", "go1", cni_args="IP=10.77.0.2")  # ...and taken by another
    store.ok("DEL", "c1")  # our record of c1 still names 10.77.0.2
    assert store.leases() == {"10.77.0.2": b"go1\r\neth0"}
    store.gc()
    store.assert_empty()


def test_a_second_add_that_asks_for_another_address_frees_the_first(store: Store) -> None:
    assert store.add("c1") == ["10.77.0.2/16"]
    assert store.add("c1", runtimeConfig={"ips": ["10.77.5.5"]}) == ["10.77.5.5/16"]
    assert store.leases() == {"10.77.5.5": b"c1\r\neth0"}
    store.ok("DEL", "c1")
    store.assert_empty()

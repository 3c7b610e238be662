"""Many attachments at once: 100 containers through portmap, bandwidth and tuning, 16 at a
time, in one host netns, then all DELed the same way.

A runtime starts containers in parallel, and each start runs the chain's plugins one
after the other; so does this test (16 workers, each runs portmap -> bandwidth -> tuning
for one container, DEL in reverse). Afterwards every rule, element, qdisc, filter, ifb,
backup and state file is counted from the kernel and the state dirs: exactly one of each
per attachment after ADD (nothing lost, nothing doubled), none after DEL.

A lock held too long is error 11 (try again later), never a hang: the last tests hold
each plugin's lock (and the xtables lock) from outside and run the plugin with a short
CNI_META_LOCK_TIMEOUT.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.harness import chained as ch
from tests.harness import snapshot as snap
from tests.harness.fleet import GATEWAY, Fleet, Member, fleet
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import PluginRun
from tests.harness.traffic import echo_server, reaches

pytestmark = pytest.mark.root

CONTAINERS = 100
PARALLEL = 16
IPTABLES_CONTAINERS = 32
TABLE = ("inet", "cni_meta_portmap")


# ---------------------------------------------------------------------------- running


def run_all(
    members: list[Member], job: Callable[[Member], list[str]], parallel: int = PARALLEL
) -> list[str]:
    """Run `job` for every member, `parallel` at a time; all the failures it reports."""
    with ThreadPoolExecutor(parallel) as pool:
        return [problem for problems in pool.map(job, members) for problem in problems]


def chain_job(
    lab: Lab, command: str, plugins: tuple[str, ...], backend: str | None = None
) -> Callable[[Member], list[str]]:
    def job(m: Member) -> list[str]:
        problems = []
        for plugin in plugins:
            body = ch.conf(plugin, m, backend=backend if plugin == "portmap" else None)
            run = ch.run(ch.invocation(plugin, command, m, lab.host, lab.env, body))
            if run.returncode != 0:
                problems.append(f"{plugin} {command} {m.container_id}: {run.stdout.strip()}")
        return problems

    return job


def states(lab: Lab, plugin: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The plugin's per-attachment state files (parsed) and every other name there
    (subdirectories apart: see assert_no_state_left)."""
    d = lab.state_root / plugin
    files, others = [], []
    for name in sorted(os.listdir(d)) if d.is_dir() else []:
        if name.endswith(".json"):
            files.append(json.loads((d / name).read_text()))
        elif not (d / name).is_dir():
            others.append(name)
    return files, others


def owners(files: list[dict[str, Any]]) -> Counter[str]:
    """containerID -> how many state files name it (tuning writes `containerID` too)."""
    return Counter(str(f.get("containerID")) for f in files)


def assert_one_state_file_each(lab: Lab, plugin: str, members: list[Member]) -> None:
    files, others = states(lab, plugin)
    assert owners(files) == Counter(m.container_id for m in members), plugin
    assert all(snap.is_lock_file(n) for n in others), f"{plugin}: {others}"


def assert_no_state_left(lab: Lab) -> None:
    for plugin in ch.PLUGINS:
        files, others = states(lab, plugin)
        assert files == [], f"{plugin} left state files: {files[:3]}"
        assert all(snap.is_lock_file(n) for n in others), f"{plugin}: {others}"
        # portmap's route_localnet/: who needs it where, empty once nobody does
        for sub in (p for p in (lab.state_root / plugin).glob("*") if p.is_dir()):
            left = [n for n in os.listdir(sub) if not snap.is_lock_file(n)]
            assert left == [], f"{plugin}: {sub.name}/{left}"


# ---------------------------------------------------------------------------- reading the kernel


def nft_table(host: Netns) -> dict[str, Any]:
    """Set/map name -> elements, chain name -> rules (as nft prints them), via nft -j."""
    raw = host.run("nft", "-j", "list", "table", *TABLE, check=False)
    if not raw.strip():
        return {}
    out: dict[str, Any] = {"sets": {}, "chains": {}}
    for obj in json.loads(raw)["nftables"]:
        body = obj.get("set") or obj.get("map")
        if body:
            out["sets"][body["name"]] = body.get("elem", [])
        if "chain" in obj:
            out["chains"].setdefault(obj["chain"]["name"], [])
        if "rule" in obj:
            rule = obj["rule"]
            out["chains"].setdefault(rule["chain"], []).append(json.dumps(rule["expr"]))
    return out


def element_key(item: Any) -> tuple[Any, ...]:
    """An nft JSON element (or [element, data]) -> its key as a tuple, and its comment."""
    key = item[0] if isinstance(item, list) else item
    comment = ""
    if isinstance(key, dict) and "elem" in key:
        comment = key["elem"].get("comment", "")
        key = key["elem"]["val"]
    parts = key["concat"] if isinstance(key, dict) and "concat" in key else [key]
    return (*[json.dumps(p) if isinstance(p, dict) else p for p in parts], comment)


def comment_names(comment: str, m: Member) -> bool:
    return f"{ch.NETWORK}/{m.container_id}/eth0" in comment


def check_portmap_nft(host: Netns, members: list[Member]) -> None:
    table = nft_table(host)
    sets = table["sets"]
    claims = [element_key(e) for e in sets["claims4"]]
    want: Counter[tuple[str, str, int]] = Counter()
    for m in members:
        want[("0.0.0.0", "tcp", ch.tcp_port(m))] += 1
        want[("0.0.0.0", "udp", ch.udp_port(m))] += 1
    assert Counter(c[:3] for c in claims) == want
    by_port = {c[2]: c[3] for c in claims}
    for m in members:  # each claim names its own attachment
        assert comment_names(by_port[ch.tcp_port(m)], m)
        assert comment_names(by_port[ch.udp_port(m)], m)
    dnat = {element_key(e)[:2]: e[1] for e in sets["any4"]}
    assert len(sets["any4"]) == 2 * len(members)
    for m in members:
        assert dnat[("tcp", ch.tcp_port(m))] == {"concat": [m.address, 80]}
        assert dnat[("udp", ch.udp_port(m))] == {"concat": [m.address, 53]}
    # snat: every container masqueraded for hairpin/localhost, once
    assert Counter(element_key(e)[0] for e in sets["masq4"]) == Counter(m.address for m in members)
    assert len(sets["hairpin4"]) == len(members)
    assert sets["hostip4"] == [] and sets["any6"] == [] and sets["claims6"] == []
    # No rule is doubled by concurrent ADDs: every chain holds distinct rules, and the
    # entry chains exactly one jump each (their rules do not grow with attachments).
    for chain, rules in table["chains"].items():
        assert len(rules) == len(set(rules)), f"chain {chain} has a rule twice"
    for chain in ("prerouting", "output"):
        assert len(table["chains"][chain]) == 1, chain
    assert len(table["chains"]["hostports"]) == 4  # specific + wildcard, per family


def iptables_nat(host: Netns) -> list[str]:
    text = host.run("iptables-save", "-t", "nat", check=False)  # the host's variant: auto
    return [line for line in text.splitlines() if line.startswith(("-A", ":"))]


def check_portmap_iptables(host: Netns, members: list[Member]) -> None:
    lines = iptables_nat(host)
    rules = [x for x in lines if x.startswith("-A")]
    assert len(rules) == len(set(rules)), "a rule is there twice"
    dn_chains = [x.split()[0][1:] for x in lines if x.startswith(":CNI-DN-")]
    assert len(dn_chains) == len(members)
    jumps = [x for x in rules if x.startswith("-A CNI-HOSTPORT-DNAT ")]
    assert len(jumps) == 2 * len(members)
    for m in members:
        # Go's jumps: one per protocol, commented with network and container id
        mine = [
            j for j in jumps if f'dnat name: \\"{ch.NETWORK}\\" id: \\"{m.container_id}\\"' in j
        ]
        assert len(mine) == 2, (m.container_id, mine)
        assert any(f"--dports {ch.tcp_port(m)} " in j for j in mine)
        assert any(f"--dports {ch.udp_port(m)} " in j for j in mine)
        target = mine[0].split(" -j ")[-1]
        dnat = [x for x in rules if x.startswith(f"-A {target} ") and "DNAT" in x]
        assert sorted(x.split("--to-destination ")[-1] for x in dnat) == sorted(
            [f"{m.address}:80", f"{m.address}:53"]
        )
    for hook, entry in (("PREROUTING", "CNI-HOSTPORT-DNAT"), ("OUTPUT", "CNI-HOSTPORT-DNAT")):
        assert sum(1 for x in rules if x.startswith(f"-A {hook} ") and f"-j {entry}" in x) == 1


def tc_json(ns: Netns, *args: str) -> list[dict[str, Any]]:
    out = ns.run("tc", "-j", *args)
    return json.loads(out) if out.strip() else []


def ifbs(host: Netns) -> dict[str, dict[str, Any]]:
    links = json.loads(host.ip("-j", "-d", "link", "show", "type", "ifb"))
    return {str(x["ifname"]): x for x in links}


def check_bandwidth(host: Netns, members: list[Member]) -> None:
    qdiscs = tc_json(host, "qdisc", "show")
    by_dev: dict[str, list[dict[str, Any]]] = {}
    for q in qdiscs:
        by_dev.setdefault(q["dev"], []).append(q)
    ifb_of = {}
    for name, link in ifbs(host).items():
        alias = str(link.get("ifalias", ""))
        owner = [m for m in members if alias.endswith(f" {ch.NETWORK}/{m.container_id}/eth0")]
        assert len(owner) == 1, (name, alias)
        ifb_of[owner[0].container_id] = name
    assert len(ifb_of) == len(members)  # one ifb per attachment, none doubled
    for m in members:
        mine = by_dev[m.host_veth]
        assert sorted(q["kind"] for q in mine) == ["ingress", "tbf"], (m.host_veth, mine)
        ifb_root = [q["kind"] for q in by_dev[ifb_of[m.container_id]] if q.get("root")]
        assert ifb_root == ["tbf"]
        shown = tc_json(host, "filter", "show", "dev", m.host_veth, "ingress")
        filters = [f for f in shown if "options" in f]
        targets = [
            a["to_dev"] for f in filters for a in f["options"].get("actions", []) if "to_dev" in a
        ]
        assert targets == [ifb_of[m.container_id]], (m.host_veth, filters)


def eth0(ctr: Netns) -> tuple[str, int, str]:
    info = json.loads(ctr.ip("-j", "link", "show", "eth0"))[0]
    return str(info["address"]), int(info["mtu"]), ctr.sysctl("net.ipv4.conf.eth0.accept_redirects")


def check_tuning(members: list[Member], originals: dict[str, tuple[str, int, str]]) -> None:
    for m in members:
        assert eth0(m.ctr) == (ch.mac(m), ch.MTU, "0"), m.container_id
        assert originals[m.container_id] != (ch.mac(m), ch.MTU, "0")


def check_traffic(lab: Lab, members: list[Member]) -> None:
    """A few containers actually reached through their host port from the host."""
    for m in (members[0], members[len(members) // 2], members[-1]):
        with echo_server(m.ctr, 80, "tcp", m.container_id):
            got = reaches(lab.host, GATEWAY, ch.tcp_port(m), "tcp")
            assert got == f"{m.container_id}:ping".encode()


# ---------------------------------------------------------------------------- the tests


@pytest.fixture(autouse=True)
def private_xtables_lock(lab: Lab) -> None:
    """The iptables backend's xtables lock is machine-wide (/run/xtables.lock): anything
    else on the machine running iptables would stall these tests for its own reasons."""
    lab.env["XTABLES_LOCKFILE"] = str(lab.workdir / "xtables.lock")


@pytest.fixture
def hundred(lab: Lab) -> Iterator[Fleet]:
    with fleet(lab.host, CONTAINERS) as f:
        yield f


def test_hundred_attachments_sixteen_at_a_time_nothing_lost_or_doubled(
    lab: Lab, hundred: Fleet
) -> None:
    members = hundred.members
    originals = {m.container_id: eth0(m.ctr) for m in members}
    host_before = snap.netns_snapshot(lab.host.name)

    problems = run_all(members, chain_job(lab, "ADD", ch.PLUGINS))
    assert problems == [], "\n".join(problems[:10])

    check_portmap_nft(lab.host, members)
    check_bandwidth(lab.host, members)
    check_tuning(members, originals)
    for plugin in ch.PLUGINS:
        assert_one_state_file_each(lab, plugin, members)
    check_traffic(lab, members)
    # CHECK agrees (a sample, concurrently too: CHECK of all would double the run time)
    problems = run_all(members[::6], chain_job(lab, "CHECK", ch.PLUGINS))
    assert problems == [], "\n".join(problems[:10])

    problems = run_all(members, chain_job(lab, "DEL", tuple(reversed(ch.PLUGINS))))
    assert problems == [], "\n".join(problems[:10])

    assert nft_table(lab.host) == {}  # the last DEL removes the table
    assert ifbs(lab.host) == {}
    for m in members:
        assert eth0(m.ctr) == originals[m.container_id]
    assert_no_state_left(lab)
    # The host netns is as before, route_localnet on the bridge included: portmap turned it
    # on, and the last DEL turned it off again.
    changes = snap.diff(host_before, snap.netns_snapshot(lab.host.name))
    assert changes == {}, snap.describe(changes)


def test_iptables_backend_concurrent_adds_and_dels(lab: Lab) -> None:
    with fleet(lab.host, IPTABLES_CONTAINERS) as f:
        members = f.members
        add = chain_job(lab, "ADD", ("portmap",), backend="iptables")
        problems = run_all(members, add)
        assert problems == [], "\n".join(problems[:10])
        check_portmap_iptables(lab.host, members)
        assert_one_state_file_each(lab, "portmap", members)
        check_traffic(lab, members)

        problems = run_all(members, chain_job(lab, "DEL", ("portmap",), backend="iptables"))
        assert problems == [], "\n".join(problems[:10])
        left = [x for x in iptables_nat(lab.host) if "CNI-DN-" in x]
        assert left == []
        jumps = [x for x in iptables_nat(lab.host) if x.startswith("-A CNI-HOSTPORT-DNAT")]
        assert jumps == []
        assert_no_state_left(lab)


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_sixteen_racing_for_one_host_port_one_wins_losers_leave_no_trace(
    lab: Lab, backend: str
) -> None:
    """Every container asks for the same host port at once: exactly one gets it, the
    others fail with 101 and leave nothing (no state file, no rule); after the runtime's
    DELs (it DELs a failed ADD too) the host is as before."""
    with fleet(lab.host, PARALLEL) as f:
        members = f.members
        port = ch.tcp_port(members[0])

        def body(m: Member) -> dict[str, Any]:
            conf = ch.conf("portmap", m, backend=backend)
            conf["runtimeConfig"]["portMappings"] = [
                {"hostPort": port, "containerPort": 80, "protocol": "tcp"}
            ]
            return conf

        def add(m: Member) -> PluginRun:
            return ch.run(ch.invocation("portmap", "ADD", m, lab.host, lab.env, body(m)))

        with ThreadPoolExecutor(PARALLEL) as pool:
            runs = list(pool.map(add, members))
        winners = [m for m, r in zip(members, runs, strict=True) if r.returncode == 0]
        assert len(winners) == 1, [r.stdout for r in runs]
        for r in runs:
            if r.returncode != 0:
                assert "is already mapped by attachment" in failed_with(r, 101)
        assert_one_state_file_each(lab, "portmap", winners)
        if backend == "nftables":
            claims = nft_table(lab.host)["sets"]["claims4"]
            assert [element_key(e)[:3] for e in claims] == [("0.0.0.0", "tcp", port)]
        else:
            jumps = [x for x in iptables_nat(lab.host) if x.startswith("-A CNI-HOSTPORT-DNAT")]
            assert len(jumps) == 1 and winners[0].container_id in jumps[0]

        def delete(m: Member) -> PluginRun:
            return ch.run(ch.invocation("portmap", "DEL", m, lab.host, lab.env, body(m)))

        with ThreadPoolExecutor(PARALLEL) as pool:
            assert all(r.returncode == 0 for r in pool.map(delete, members))
        assert nft_table(lab.host) == {}
        assert [x for x in iptables_nat(lab.host) if "CNI-DN-" in x] == []
        assert_no_state_left(lab)


# ---------------------------------------------------------------------------- locks


@contextmanager
def held(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` the way another plugin process would."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# (plugin, portmap backend, lock file below the state root or "xtables")
LOCKS = [
    ("portmap", "nftables", "portmap/nftables.lock"),
    ("portmap", "iptables", "portmap/iptables.lock"),
    ("portmap", "iptables", "xtables"),
    ("bandwidth", None, "bandwidth/lock"),
    ("tuning", None, "tuning/tuning.lock"),
]


def failed_with(run: PluginRun, code: int) -> str:
    assert run.returncode != 0, run.stdout
    err = json.loads(run.stdout)
    assert err["code"] == code, err
    return str(err["msg"])


@pytest.mark.parametrize(("plugin", "backend", "lock"), LOCKS)
def test_lock_held_elsewhere_is_error_11_not_a_hang(
    lab: Lab, plugin: str, backend: str | None, lock: str
) -> None:
    env = {**lab.env, "CNI_META_LOCK_TIMEOUT": "0.5"}
    if lock == "xtables":
        env["CNI_META_IPTABLES"] = "legacy"  # iptables-nft has no lock to wait for
    xtables = Path(env["XTABLES_LOCKFILE"])  # never the machine's /run/xtables.lock
    path = xtables if lock == "xtables" else lab.state_root / lock
    with fleet(lab.host, 1) as f:
        m = f.members[0]
        body = ch.conf(plugin, m, backend=backend if plugin == "portmap" else None)

        def call(command: str) -> PluginRun:
            # the subprocess timeout only guards against a hang; 0.5 s is what is waited
            return ch.run(ch.invocation(plugin, command, m, lab.host, env, body), timeout=60)

        with held(path):
            msg = failed_with(call("ADD"), 11)
            assert str(path) in msg
        assert call("ADD").returncode == 0  # the same call works once the lock is free
        with held(path):
            failed_with(call("DEL"), 11)
        assert call("DEL").returncode == 0
    assert_no_state_left(lab)

"""One tenant of a shared node against another, through portmap's verbs on the fake
netfilter (tests/harness/fake_portmap.py), without root: GC of a network whose name
hashes like another's, a DEL without a record on a busy node, a DEL that finds a Go
chain of a sibling attachment. tests/kernel/test_portmap_tenants.py proves the same on
the real kernel, with traffic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.identity import Attachment, network_tag
from portmap.config import go_chain_name
from tests.harness.fake_portmap_world import World as PortmapWorld
from tests.harness.names import colliding_names

T = "inet cni_meta_portmap"


VICTIM, ATTACKER = colliding_names()


class World(PortmapWorld):
    """The harness's portmap world with two tenants: each call names its network."""

    def add(self, network: str, cid: str, ip: str, port: int) -> None:
        mapping = [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]
        assert self.run("ADD", cid, name=network, ip=ip, mappings=mapping)[0] == 0

    def gc(self, network: str, *valid: str) -> None:
        conf = {"cniVersion": "1.1.0", "name": network, "type": "portmap",
                "backend": self.backend,
                "cni.dev/valid-attachments": [{"containerID": c, "ifname": "eth0"}
                                              for c in valid]}  # fmt: skip
        assert self.kernel.run("portmap", "GC", conf, netns="", kernel=self.fake) == (0, None)

    def record(self, network: str, cid: str) -> Path:
        return self.state / "portmap" / f"{Attachment(network, cid, 'eth0').tag}.json"


@pytest.fixture(params=["nftables", "iptables"])
def world(request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    return World(tmp_path, monkeypatch, request.param)


# ---------------------------------------------------------------------------- GC, finding 1


def test_the_colliding_names_share_the_tag() -> None:
    assert VICTIM != ATTACKER and network_tag(VICTIM) == network_tag(ATTACKER)


@pytest.mark.parametrize("victim_record", ["kept", "lost"])
def test_gc_of_a_network_leaves_another_network_whose_name_hashes_alike(
    world: World, victim_record: str
) -> None:
    """The victim's pod on VICTIM, the attacker's on ATTACKER (same 32-bit tag): GC of
    ATTACKER with no valid attachment removes the attacker's mappings only, whether the
    victim's record is there or was lost (its elements' comments name its network)."""
    world.add(VICTIM, "victim", "10.88.0.5", 8080)
    alone = world.fake.dump()
    world.add(ATTACKER, "attacker", "10.88.0.6", 9090)
    if victim_record == "lost":
        world.record(VICTIM, "victim").unlink()

    world.gc(ATTACKER)

    assert world.fake.dump() == alone
    assert not world.record(ATTACKER, "attacker").exists()


def test_gc_removes_its_own_networks_mappings_that_lost_their_record(world: World) -> None:
    """The proof is the network's name: mappings of the swept network go without their
    record too (nftables: the element comments; iptables: Go's jump comments)."""
    world.add(VICTIM, "victim", "10.88.0.5", 8080)
    alone = world.fake.dump()
    world.add(ATTACKER, "attacker", "10.88.0.6", 9090)
    world.record(ATTACKER, "attacker").unlink()

    world.gc(ATTACKER)

    assert world.fake.dump() == alone


def test_gc_leaves_an_unusable_file_that_a_network_hashing_alike_may_own(world: World) -> None:
    """A record of VICTIM shares ATTACKER's tag: a file nobody can use that starts with
    that tag may be either network's, so ATTACKER's GC leaves it; VICTIM's, with no
    other network's record sharing the tag, removes it."""
    world.add(VICTIM, "victim", "10.88.0.5", 8080)
    damaged = world.record(VICTIM, "lost")
    damaged.write_text("{not json")

    world.gc(ATTACKER)

    assert damaged.exists() and world.record(VICTIM, "victim").exists()
    world.gc(VICTIM, "victim")
    assert not damaged.exists() and world.record(VICTIM, "victim").exists()


# ---------------------------------------------------------------------------- DEL, finding 4


@pytest.mark.parametrize("config", ["no mappings", "its mappings"])
def test_a_del_without_a_record_reads_nothing_of_the_other_tenants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str
) -> None:
    """Other pods hold large ranges. The runtime's second DEL of a pod (its record went
    with the first), with a config that has no mappings or that repeats them with its
    prevResult, asks the kernel two lookups: its key in the owners set (absent) and the
    set (present). No listing, no `get element`: libnftables would first load every
    element of the table, under the lock every ADD and DEL of the node waits for."""
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    w = World(tmp_path, monkeypatch, "nftables")
    for i in range(3):
        ranged = [{"hostPort": 20000 + 1000 * i, "containerPort": 20000, "range": 1000}]
        assert w.run("ADD", f"other{i}", name=VICTIM, ip=f"10.88.1.{i}", mappings=ranged)[0] == 0
    mine = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
    conf = {"name": VICTIM, "ip": "10.88.0.5", "mappings": mine if config == "its mappings" else []}
    assert w.run("ADD", "ctr", name=VICTIM, ip="10.88.0.5", mappings=mine)[0] == 0
    assert w.run("DEL", "ctr", **conf) == (0, None)
    others = w.fake.dump()
    w.fake.sent(reads=True)

    assert w.run("DEL", "ctr", **conf) == (0, None)

    key = nft_owner_key(VICTIM, "ctr")
    assert w.fake.sent(reads=True) == (
        f"nft lookup: element owners {key}\nnft lookup: set owners\n"
    )
    assert w.fake.dump() == others


def nft_owner_key(network: str, cid: str) -> str:
    from portmap.nft import owner_element

    return owner_element(Attachment(network, cid, "eth0")).key


def test_a_del_without_a_record_whose_key_is_there_still_finds_its_elements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record was lost (a state dir wiped) while the table kept the mappings: the
    owners set says so, and the DEL removes them as before (the slow look, only then)."""
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    w = World(tmp_path, monkeypatch, "nftables")
    w.add(VICTIM, "other", "10.88.0.6", 9090)
    alone = w.fake.dump()
    w.add(VICTIM, "ctr", "10.88.0.5", 8080)
    w.record(VICTIM, "ctr").unlink()

    assert w.run("DEL", "ctr", name=VICTIM, ip="10.88.0.5", mappings=[]) == (0, None)

    assert w.fake.dump() == alone


# ---------------------------------------------------------------------------- Go takeover, 9


def go_made(w: World, network: str, cid: str, ip: str, port: int) -> list[str]:
    """What the Go portmap (iptables-nft) makes for one mapping of `cid` at `ip`."""
    name = go_chain_name(network, cid)
    nat = w.fake.xtables.table("nft", 4)
    comment = f'"dnat name: \\"{network}\\" id: \\"{cid}\\""'
    jump = (f"-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment {comment} "
            f"-m multiport --dports {port} -j {name}")  # fmt: skip
    rule = f"-A {name} -p tcp -m tcp --dport {port} -j DNAT --to-destination {ip}:80"
    nat.setdefault("CNI-HOSTPORT-DNAT", []).append(jump)
    nat[name] = [rule]
    return [jump, rule]


@pytest.mark.parametrize("prev_result", ["eth1's", "none"])
def test_a_del_without_a_record_leaves_the_go_chain_of_a_sibling_attachment(
    world: World, prev_result: str
) -> None:
    """The Go portmap set up sib/eth0 (10.88.0.5); sib/eth1 on the same network is ours.
    DELs of eth1 without its record (the runtime's second), with eth1's prevResult or
    none, leave Go's chain: it forwards to eth0's address, not eth1's. eth0's own DEL
    (its prevResult) then removes it."""
    go_made(world, VICTIM, "sib", "10.88.0.5", 8080)
    before = world.fake.dump()
    conf = world.conf("10.88.0.6", [{"hostPort": 8081, "containerPort": 80}], name=VICTIM)
    conf["prevResult"]["interfaces"][0]["name"] = "eth1"
    if prev_result == "none":
        del conf["prevResult"]

    for _ in range(2):
        run = world.kernel.run("portmap", "DEL", conf, netns=world.netns, container_id="sib",
                               ifname="eth1", kernel=world.fake)  # fmt: skip
        assert run == (0, None)

    assert world.fake.dump() == before
    mapping = [{"hostPort": 8080, "containerPort": 80}]
    assert world.run("DEL", "sib", name=VICTIM, ip="10.88.0.5", mappings=mapping) == (0, None)
    assert go_chain_name(VICTIM, "sib") not in world.fake.dump()


def test_gc_leaves_a_mapping_whose_network_nothing_proves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network name so long that the element comments (120 bytes) lose it, and no
    record: GC cannot prove the mappings are its network's, leaves them and says so."""
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    w = World(tmp_path, monkeypatch, "nftables")
    long = "n" * 120
    w.add(long, "ctr", "10.88.0.5", 8080)
    w.record(long, "ctr").unlink()
    before = w.fake.dump()

    w.gc(long)

    # route_localnet's entry names its network in full: that claim is proven stale and
    # goes; the mappings, which nothing proves, stay
    def mappings(dump: str) -> list[str]:
        return [line for line in dump.splitlines() if "route_localnet" not in line]

    assert mappings(w.fake.dump()) == mappings(before)
    tag = Attachment(long, "ctr", "eth0").tag
    assert f"gc: left the mappings of {tag}" in (tmp_path / "plugins.log").read_text()

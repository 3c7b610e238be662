"""portmap's verbs against a fake netfilter (tests/harness/fake_portmap.py), without root.

Each test runs ADD/CHECK/DEL/GC through common.skel as the executable would, once per
backend, and compares exact text: the fake's model of the nft table or the nat tables,
and the changes that were sent. tests/kernel/test_portmap.py proves the same on the real kernel.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.digest import sha512_hex
from common.identity import Attachment
from portmap import nft, xtables
from portmap.config import go_chain_name
from tests.harness.fake_portmap import ROUTE_LOCALNET
from tests.harness.fake_portmap_world import (
    BACKENDS,
    ENOENT,
    FLUSH,
    GUARD_OFF,
    IPT_SHARED,
    LOCALNET_OFF,
    LOCALNET_ON,
    NET,
    NFT_MASQ_CHAIN,
    T,
    World,
    added,
    chain,
    ipt_chain_rules,
    ipt_first_add,
    ipt_jumps,
    nft_elements,
    owner,
    sent,
    tag,
)


@pytest.fixture(params=BACKENDS)
def world(request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    return World(tmp_path, monkeypatch, request.param)


# ---------------------------------------------------------------------------- ADD / CHECK


def test_first_add_makes_the_table_and_the_mappings(world: World) -> None:
    code, result = world.run("ADD")
    assert code == 0, result
    assert result["ips"] == [{"interface": 0, "address": "10.88.0.5/16"}]  # passed through
    assert world.fake.dump() == added(world)
    if world.backend == "nftables":
        # the fast path (elements only) fails as a whole (no table yet); then the table,
        # the masq chain and the elements in one transaction
        fast = nft_elements("ctr1", "10.88.0.5")
        assert world.fake.sent() == (
            sent("nft", fast) + f"nft: -> {ENOENT} (create element {T} owners)\n"
            + sent("nft", [*nft.skeleton_text(), *NFT_MASQ_CHAIN, *fast]) + LOCALNET_ON
            + FLUSH
        )  # fmt: skip
    else:
        assert world.fake.sent() == sent("nft ipv4", ipt_first_add()) + LOCALNET_ON + FLUSH
    assert world.records() == [f"{Attachment(NET, 'ctr1', 'eth0').tag}.json"]


def test_second_add_replaces_the_mappings_in_one_transaction(world: World) -> None:
    world.run("ADD")
    world.fake.sent()
    assert world.run("ADD")[0] == 0
    assert world.fake.dump() == added(world)
    if world.backend == "nftables":
        deletes = [f"delete element {T} any4 {{ tcp . 8080, udp . 5353 }}",
                   f"delete element {T} claims4 {{ 0.0.0.0 . tcp . 8080, 0.0.0.0 . udp . 5353 }}",
                   f"delete element {T} hairpin4 {{ 10.88.0.0 . 10.88.0.5 }}",
                   f"delete element {T} masq4 {{ 10.88.0.5 }}",
                   f"delete element {T} owners {{ {owner('ctr1')} }}"]  # fmt: skip
        # no read at all: the state file said what is ours; route_localnet is on already
        # and the guard holds its interface (the kernel's answer): neither is written
        replace = [*deletes, *nft_elements("ctr1", "10.88.0.5")]
        assert world.fake.sent(reads=True) == sent("nft", replace) + FLUSH
    else:
        redo = [line.replace("-A CNI-HOSTPORT-DNAT", "-D CNI-HOSTPORT-DNAT")
                for line in ipt_jumps("ctr1")]  # fmt: skip
        redo += [f"-F {chain('ctr1')}", *ipt_chain_rules("ctr1", "10.88.0.5")]
        redo += ipt_jumps("ctr1", saved=False)
        assert world.fake.sent() == sent("nft ipv4", redo) + FLUSH


def test_the_record_is_an_intent_while_the_kernel_changes_and_committed_after(
    world: World,
) -> None:
    """Both backends write the attachment's record before any transaction, saying that
    its objects may exist (committed false), and confirm it once they do."""

    def committed() -> bool:
        [record] = world.state.rglob("*.json")
        return bool(json.loads(record.read_text())["committed"])

    during: list[bool] = []
    world.fake.nft.before_change = world.fake.xtables.before_change = lambda: during.append(
        committed()
    )
    assert world.run("ADD")[0] == 0
    assert during and not any(during)
    assert committed()


def test_check_passes_then_names_what_went_missing(world: World) -> None:
    world.run("ADD")
    world.fake.sent()
    assert world.run("CHECK") == (0, None)
    assert world.fake.sent() == ""  # CHECK changes nothing
    if world.backend == "nftables":
        assert world.fake.nft.table is not None
        del world.fake.nft.table["sets"]["any4"]["elems"]["udp . 5353"]
        missing = "any4 has no element udp . 5353 : 10.88.0.5 . 53"
    else:
        world.fake.xtables.table("nft", 4)[chain("ctr1")].pop()
        missing = "lacks: -p udp -m udp --dport 5353 -j DNAT --to-destination 10.88.0.5:53"
    code, error = world.run("CHECK")
    assert (code, error["code"]) == (1, 102)
    assert missing in error["details"]
    world.fake.sysctls[ROUTE_LOCALNET] = "0"
    world.run("ADD")
    world.fake.sysctls[ROUTE_LOCALNET] = "0"
    code, error = world.run("CHECK")
    assert (code, error["code"]) == (1, 102)
    assert error["msg"] == "route_localnet is off on cni0, the interface toward 10.88.0.5"


def test_a_host_port_held_by_another_attachment_is_a_conflict_and_changes_nothing(
    world: World,
) -> None:
    world.run("ADD")
    world.fake.sent()
    records = world.records()
    code, error = world.run("ADD", cid="ctr2", ip="10.88.0.6")
    assert (code, error["code"]) == (1, 101)
    where = "0.0.0.0:8080/tcp"  # the same text from both backends
    assert error["msg"] == f"host port {where} is already mapped by attachment {NET}/ctr1/eth0"
    assert world.fake.dump() == added(world)
    assert world.records() == records  # ctr2 left no record behind
    if world.backend == "nftables":
        # what was tried failed as a whole (create element of a held claim), twice
        attempt = nft_elements("ctr2", "10.88.0.6")
        failed = f"nft: -> File exists (create element {T} claims4)\n"
        # the careful path (re)writes the masq chain
        careful = [*NFT_MASQ_CHAIN, *attempt]
        assert world.fake.sent() == sent("nft", attempt) + failed + sent("nft", careful) + failed
    else:
        assert world.fake.sent() == ""  # found in the table read: nothing written


def second_elements(cid: str, ip: str) -> list[str]:
    """An attachment beside ctr1's with one mapping, host port 8081."""
    c = tag(cid)
    return [
        f'create element {T} owners {{ {owner(cid)} comment "{c}" }}',
        f'create element {T} claims4 {{ 0.0.0.0 . tcp . 8081 comment "{c}" }}',
        f'add element {T} any4 {{ tcp . 8081 comment "{c}" : {ip} . 80 }}',
        f'add element {T} masq4 {{ {ip} comment "{c}" : goto masq4-p16 }}',
        f'add element {T} hairpin4 {{ 10.88.0.0 . {ip} comment "{c}" }}',
    ]


SECOND = [{"hostPort": 8081, "containerPort": 80, "protocol": "tcp"}]


def test_an_add_beside_another_attachment_sends_its_elements_only(world: World) -> None:
    """The subnet's masq chain is there already: the ADD neither reads nor rewrites it
    (rewriting its rules would make the call wait for the kernel to free the old ones)."""
    if world.backend != "nftables":
        pytest.skip("nftables only")
    world.run("ADD")
    world.fake.sent()
    assert world.run("ADD", cid="ctr2", ip="10.88.0.6", mappings=SECOND)[0] == 0
    # route_localnet is on already (the first one's), and the guard holds cni0
    elements = second_elements("ctr2", "10.88.0.6")
    assert world.fake.sent(reads=True) == sent("nft", elements)


def test_an_add_whose_masq_chain_is_missing_fails_fast_then_writes_it(world: World) -> None:
    """The first attachment of a subnet masquerades everything (masqAll): no masq4-p16 yet.
    The next one's fast transaction fails on its `goto` as a whole; the careful path
    writes the chain with the elements."""
    if world.backend != "nftables":
        pytest.skip("nftables only")
    assert world.run("ADD", masqAll=True)[0] == 0
    world.fake.sent()
    assert world.run("ADD", cid="ctr2", ip="10.88.0.6", mappings=SECOND)[0] == 0
    attempt = second_elements("ctr2", "10.88.0.6")
    assert world.fake.sent() == (
        sent("nft", attempt) + f"nft: -> {ENOENT} (add element {T} masq4)\n"
        + sent("nft", [*NFT_MASQ_CHAIN, *attempt])
    )  # fmt: skip
    assert world.fake.nft.table is not None
    assert world.fake.nft.table["chains"]["masq4-p16"] == [
        line.split(" masq4-p16 ", 1)[1] for line in NFT_MASQ_CHAIN[2:]
    ]
    assert world.run("CHECK", cid="ctr2", ip="10.88.0.6", mappings=SECOND) == (0, None)


def test_check_names_a_masq_chain_flushed_by_hand_and_a_careful_add_rewrites_it(
    world: World,
) -> None:
    """The fast ADD never rewrites a masq chain that exists, so CHECK must see one that
    someone flushed (`nft flush chain`); deleting and re-adding the container repairs it."""
    if world.backend != "nftables":
        pytest.skip("nftables only")
    world.run("ADD")
    assert world.run("CHECK") == (0, None)
    world.fake.sent()
    assert world.fake.nft.run(f"flush chain {T} masq4-p16")[0] == 0
    expected = "; ".join(line.split(" masq4-p16 ", 1)[1] for line in NFT_MASQ_CHAIN[2:])
    code, error = world.run("CHECK")
    assert (code, error["code"]) == (1, 102)
    assert error["details"] == f"chain masq4-p16 holds [], expected [{expected}]"
    assert world.fake.sent(reads=True).endswith(f"nft read: list chain {T} masq4-p16\n")
    assert world.run("ADD")[0] == 0  # a repeated ADD takes the fast path: not repaired
    assert world.run("CHECK")[0] == 1
    world.run("DEL")
    world.run("ADD")
    assert world.run("CHECK") == (0, None)


def test_check_names_a_missing_or_edited_masq_all_chain(world: World) -> None:
    if world.backend != "nftables":
        pytest.skip("nftables only")
    world.run("ADD", masqAll=True)
    assert world.run("CHECK", masqAll=True) == (0, None)
    assert world.fake.nft.table is not None
    world.fake.nft.table["chains"]["masq-all"] = ["ip saddr 10.0.0.0/8 masquerade"]
    code, error = world.run("CHECK", masqAll=True)
    assert (code, error["details"]) == (
        1, "chain masq-all holds [ip saddr 10.0.0.0/8 masquerade], expected [masquerade]"
    )  # fmt: skip
    del world.fake.nft.table["chains"]["masq-all"]
    code, error = world.run("CHECK", masqAll=True)
    assert (code, error["details"]) == (1, f"chain masq-all of {T} is missing")


# ---------------------------------------------------------------------------- DEL


def test_del_of_the_last_attachment_removes_everything_and_a_second_del_nothing(
    world: World,
) -> None:
    world.run("ADD")
    world.fake.sent()
    assert world.run("DEL") == (0, None)
    # route_localnet goes back off first (portmap turned it on, and the last attachment
    # that needed it is going), then the mappings and the guard go; the iptables
    # backend's shared chains stay (as Go's do)
    left = LOCALNET_OFF if world.backend == "nftables" else IPT_SHARED + LOCALNET_OFF
    assert world.fake.dump() == left
    if world.backend == "nftables":
        assert world.fake.sent() == LOCALNET_OFF + f"nft: delete table {T}\n" + GUARD_OFF + FLUSH
    else:
        undo = [line.replace("-A CNI-HOSTPORT-DNAT", "-D CNI-HOSTPORT-DNAT")
                for line in ipt_jumps("ctr1")]  # fmt: skip
        undo += [f"-F {chain('ctr1')}", f"-X {chain('ctr1')}"]
        assert world.fake.sent() == LOCALNET_OFF + sent("nft ipv4", undo) + GUARD_OFF + FLUSH
    assert world.records() == []
    assert world.run("DEL") == (0, None)
    assert world.fake.sent() == ""
    assert world.fake.dump() == left


def test_del_without_any_state_succeeds_and_sends_nothing(world: World) -> None:
    assert world.run("DEL") == (0, None)
    assert world.fake.sent() == ""
    assert world.fake.dump() == f"sysctl {ROUTE_LOCALNET} = 0\n"


def test_del_without_state_removes_the_go_portmaps_iptables_mappings(world: World) -> None:
    """A pod the Go portmap set up with iptables-nft: our DEL (no state of ours for it)
    removes Go's chain (its DNAT goes to the attachment's address: it is its own) and the
    jumps to it with the iptables tools, as our iptables backend removes its own, and
    flushes its UDP conntrack; another Go pod's stay."""
    nat = world.fake.xtables.table("nft", 4)
    nat["CNI-HOSTPORT-DNAT"] = []
    made: dict[str, list[str]] = {}
    for cid, port, ip in (("ctr1", 5353, "10.88.0.5"), ("goother", 5354, "10.88.0.9")):
        name = go_chain_name(NET, cid)
        rule = f"-A {name} -p udp -m udp --dport {port} -j DNAT --to-destination {ip}:53"
        comment = f'"dnat name: \\"{NET}\\" id: \\"{cid}\\""'
        jump = (f"-A CNI-HOSTPORT-DNAT -p udp -m comment --comment {comment} "
                f"-m multiport --dports {port} -j {name}")  # fmt: skip
        nat[name] = [rule]
        nat["CNI-HOSTPORT-DNAT"].append(jump)
        made[cid] = [jump, f":{name}", rule]
    kept = "".join(f"{x}\n" for x in world.fake.dump().splitlines() if x not in made["ctr1"])
    assert world.run("DEL") == (0, None)
    name = go_chain_name(NET, "ctr1")
    undo = ["-D" + made["ctr1"][0][2:], f"-F {name}", f"-X {name}"]
    assert world.fake.sent() == sent("nft ipv4", undo) + FLUSH
    assert world.fake.dump() == kept


def test_del_of_one_attachment_keeps_the_others(world: World) -> None:
    other = [{"hostPort": 9090, "containerPort": 90, "protocol": "tcp"}]
    world.run("ADD", cid="ctr2", ip="10.88.0.6", mappings=other)
    alone = world.fake.dump()
    world.run("ADD")
    world.fake.sent()
    assert world.run("DEL") == (0, None)
    assert world.fake.dump() == alone
    if world.backend == "nftables":
        assert world.fake.sent() == sent("nft", [
            f"delete element {T} any4 {{ tcp . 8080, udp . 5353 }}",
            f"delete element {T} claims4 {{ 0.0.0.0 . tcp . 8080, 0.0.0.0 . udp . 5353 }}",
            f"delete element {T} hairpin4 {{ 10.88.0.0 . 10.88.0.5 }}",
            f"delete element {T} masq4 {{ 10.88.0.5 }}",
            f"delete element {T} owners {{ {owner('ctr1')} }}",
        ]) + FLUSH  # fmt: skip


def test_a_stale_del_or_add_after_a_firewall_reload_leaves_the_new_owner_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ctr1's state still names its keys after a reload emptied the table and ctr2 took
    them: ctr1's repeated ADD is a conflict, its DEL removes nothing of ctr2's. (snat off:
    the two attachments then share every key, none of them names a container address.)"""
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    world = World(tmp_path, monkeypatch, "nftables")
    for stale in ("DEL", "ADD"):
        assert world.run("ADD", snat=False)[0] == 0
        world.fake.nft.table = None  # nft flush ruleset
        assert world.run("ADD", cid="ctr2", ip="10.88.0.6", snat=False)[0] == 0
        taken = world.fake.dump()
        code, error = world.run(stale, snat=False)
        if stale == "ADD":
            assert (code, error["code"]) == (1, 101)
            assert error["msg"].endswith(f"already mapped by attachment {NET}/ctr2/eth0")
        else:
            assert (code, error) == (0, None)
        assert world.fake.dump() == taken
        assert world.run("CHECK", cid="ctr2", ip="10.88.0.6", snat=False) == (0, None)
        assert world.run("DEL", cid="ctr2", ip="10.88.0.6", snat=False) == (0, None)


# ---------------------------------------------------------------------------- GC


def test_gc_removes_the_attachments_that_are_not_valid(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = [{"hostPort": 9090, "containerPort": 90, "protocol": "tcp"}]
    world.run("ADD")
    world.run("ADD", cid="ctr2", ip="10.88.0.6", mappings=other)
    world.fake.sent()
    gc = {"cniVersion": "1.1.0", "name": NET, "type": "portmap", "backend": world.backend,
          "cni.dev/valid-attachments": [{"containerID": "ctr2", "ifname": "eth0"}]}  # fmt: skip
    assert world.kernel.run("portmap", "GC", gc, netns="", kernel=world.fake) == (0, None)
    assert world.records() == [f"{Attachment(NET, 'ctr2', 'eth0').tag}.json"]
    swept = world.fake.dump()
    assert world.fake.sent().endswith(FLUSH)
    # the same as a host where only ctr2 was ever added
    elsewhere = World(tmp_path / "elsewhere", monkeypatch, world.backend)
    elsewhere.run("ADD", cid="ctr2", ip="10.88.0.6", mappings=other)
    assert swept == elsewhere.fake.dump()
    owner = tag if world.backend == "nftables" else chain
    assert owner("ctr1") not in swept and owner("ctr2") in swept
    assert world.kernel.run("portmap", "GC", gc, netns="", kernel=world.fake) == (0, None)
    assert world.fake.sent() == ""  # nothing left to sweep


# ---------------------------------------------------------------------------- iptables names


@pytest.fixture
def ipt_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> World:
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    return World(tmp_path, monkeypatch, "iptables")


def test_iptables_chain_is_gos_and_a_second_attachment_gets_its_own(ipt_world: World) -> None:
    """ctr1/eth0 gets Go's CNI-DN-<sha512(network + container id)>; ctr1/net1 on the same
    network cannot (Go's name is taken) and gets another. A DEL of net1 that lost its
    record removes its own chain only, never the Go-named one of eth0."""
    w = ipt_world
    assert w.run("ADD")[0] == 0
    go = ("CNI-DN-" + sha512_hex(f"{NET}ctr1".encode()))[:28]
    assert chain("ctr1") == go and f":{go}\n" in w.fake.dump()
    conf = w.conf(ip="10.88.0.7", mappings=[{"hostPort": 9090, "containerPort": 90}])
    conf["prevResult"]["interfaces"][0]["name"] = "net1"
    net1 = Attachment(NET, "ctr1", "net1")
    assert w.kernel.run("portmap", "ADD", conf, netns=w.netns, ifname="net1", kernel=w.fake)[0] == 0
    second = xtables.second_chain_name(net1)
    dump = w.fake.dump()
    assert second != go and f":{second}\n" in dump and f":{go}\n" in dump
    assert w.kernel.run("portmap", "ADD", conf, netns=w.netns, ifname="net1", kernel=w.fake)[0] == 0
    assert w.fake.dump() == dump  # a repeated ADD keeps its name
    (w.state / "portmap" / f"{net1.tag}.json").unlink()
    w.fake.sent()

    assert w.kernel.run("portmap", "DEL", conf, netns=w.netns, ifname="net1", kernel=w.fake) == (
        0,
        None,
    )

    dump = w.fake.dump()
    assert f":{second}\n" not in dump and f":{go}\n" in dump and "9090" not in dump
    assert w.run("DEL") == (0, None)
    assert "CNI-DN-" not in w.fake.dump()

"""More of portmap's verbs against the fake netfilter, without root: host addresses of both
families, a dual-stack container, conditions, CHECK of objects another attachment owns, and
GC of a mix of valid, stale and foreign attachments (tests/fake/test_portmap_verbs.py has the
basics and the helpers).

The expected text is what the real kernel holds for the same configs (`nft list table`,
`iptables-save -t nat` and `ip6tables-save -t nat` after the same ADDs, in a scratch netns);
tests/kernel/test_portmap.py proves the same mappings with traffic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.identity import Attachment
from portmap import nft
from tests.harness.fake_portmap_world import (
    BACKENDS,
    GUARD_OFF,
    LOCALNET_OFF,
    LOCALNET_ON,
    MASQ,
    NET,
    NFT_CHAINS,
    PUT_BACK,
    SETMARK,
    TO_DNAT,
    TO_MASQ,
    T,
    World,
    chain,
    go_comment,
    owner,
    sent,
    tag,
)

DUAL = ["10.88.0.5/16", "fd00::5/64"]
# a host address of each family and a wildcard: IPv4 gets the first and the wildcard,
# IPv6 the second and the wildcard (Go skips a hostIP of the other family)
HOSTIPS = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "192.168.77.1"},
           {"hostPort": 8443, "containerPort": 443, "protocol": "tcp", "hostIP": "fd77::1"},
           {"hostPort": 5353, "containerPort": 53, "protocol": "udp"}]  # fmt: skip
# nft: ip saddr 192.168.77.0/24 and ip6 saddr fd77::/64 (iptables argv is translated);
# iptables: the argv as given, `!` included
CONDITIONS: dict[str, dict[str, Any]] = {
    "nftables": {"conditionsV4": ["ip saddr 192.168.77.0/24"], "conditionsV6": ["-s", "fd77::/64"]},
    "iptables": {"conditionsV4": ["-s", "192.168.77.0/24"],
                 "conditionsV6": ["!", "-s", "fd77::/64"]},
}  # fmt: skip
# the lanes' ids as the kernel lists them (`set lanes`: 0x4b227777 and 0xe7f6c011 are the
# default lanes, 0x463cd95b the IPv4 condition's, 0xe7994a24 the IPv6 one's)
LANE4, LANE6 = "463cd95b", "e7994a24"
FLUSH_BOTH = "conntrack: flush IPv4 UDP to *:5353\nconntrack: flush IPv6 UDP to *:5353\n"


class Dual(World):
    def conf(self, ip: str = "", mappings: Any = HOSTIPS, ips: Any = DUAL, **keys: Any) -> Any:
        conf = super().conf(mappings=mappings, **keys)
        conf["prevResult"]["ips"] = [{"address": a, "interface": 0} for a in ips]
        return conf


def _dual(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> Dual:
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
    return Dual(tmp_path, monkeypatch, backend)


@pytest.fixture(params=BACKENDS)
def dual(request: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dual:
    return _dual(tmp_path, monkeypatch, request.param)


@pytest.fixture
def ipt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dual:
    return _dual(tmp_path, monkeypatch, "iptables")


# ---------------------------------------------------------------------------- nft text


def nft_dual_dump(c: str, lanes: bool) -> str:
    """The table after one dual-stack ADD of HOSTIPS, with or without CONDITIONS."""
    v4, v6 = (f"_{LANE4}", f"_{LANE6}") if lanes else ("", "")
    claimed = f"""  set lanes
    1260550007
    3891707921
{"    1178392923" + chr(10) + "    3885582884" + chr(10) if lanes else ""}\
  set owners
    {owner("ctr1")} comment "{c}"
  set claims4
    192.168.77.1 . tcp . 8080 comment "{c}"
    0.0.0.0 . udp . 5353 comment "{c}"
  map masq4
    10.88.0.5 comment "{c}" : goto masq4-p16
  set hairpin4
    10.88.0.0 . 10.88.0.5 comment "{c}"
  set claims6
    fd77::1 . tcp . 8443 comment "{c}"
    :: . udp . 5353 comment "{c}"
  map masq6
    fd00::5 comment "{c}" : goto masq6-p64
  set hairpin6
    fd00:: . fd00::5 comment "{c}"
"""
    mapped = f"""    192.168.77.1 . tcp . 8080 comment "{c}" : 10.88.0.5 . 80
  map any4{v4}
    udp . 5353 comment "{c}" : 10.88.0.5 . 53
  map hostip6{v6}
    fd77::1 . tcp . 8443 comment "{c}" : fd00::5 . 443
  map any6{v6}
    udp . 5353 comment "{c}" : fd00::5 . 53
"""
    if lanes:
        maps = f"  map hostip4\n  map any4\n  map hostip6\n  map any6\n  map hostip4{v4}\n{mapped}"
        hostports = f"""\
    ip6 saddr fd77::/64 dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostip6{v6}
    ip saddr 192.168.77.0/24 dnat ip to ip daddr . meta l4proto . th dport map @hostip4{v4}
    dnat ip to ip daddr . meta l4proto . th dport map @hostip4
    dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostip6
    meta nfproto ipv4 dnat ip to meta l4proto . th dport map @any4
    meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @any6
    ip saddr 192.168.77.0/24 meta nfproto ipv4 dnat ip to meta l4proto . th dport map @any4{v4}
    ip6 saddr fd77::/64 meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @any6{v6}
"""
    else:
        maps = f"  map hostip4\n{mapped}"
        hostports = """\
    dnat ip to ip daddr . meta l4proto . th dport map @hostip4
    dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostip6
    meta nfproto ipv4 dnat ip to meta l4proto . th dport map @any4
    meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @any6
"""
    return f"""table inet cni_meta_portmap
{claimed}{maps}  chain hostports
{hostports}{NFT_CHAINS}  chain masq6-p64
    ip6 saddr & ffff:ffff:ffff:ffff:: . ip6 daddr @hairpin6 masquerade
"""


def nft_dual_elements(c: str, lanes: bool) -> list[str]:
    v4, v6 = (f"_{LANE4}", f"_{LANE6}") if lanes else ("", "")
    return [
        f'create element {T} owners {{ {owner("ctr1")} comment "{c}" }}',
        f'create element {T} claims4 {{ 192.168.77.1 . tcp . 8080 comment "{c}", '
        f'0.0.0.0 . udp . 5353 comment "{c}" }}',
        f'add element {T} hostip4{v4} {{ 192.168.77.1 . tcp . 8080 comment "{c}" : '
        '10.88.0.5 . 80 }',
        f'add element {T} any4{v4} {{ udp . 5353 comment "{c}" : 10.88.0.5 . 53 }}',
        f'add element {T} masq4 {{ 10.88.0.5 comment "{c}" : goto masq4-p16 }}',
        f'add element {T} hairpin4 {{ 10.88.0.0 . 10.88.0.5 comment "{c}" }}',
        f'create element {T} claims6 {{ fd77::1 . tcp . 8443 comment "{c}", '
        f':: . udp . 5353 comment "{c}" }}',
        f'add element {T} hostip6{v6} {{ fd77::1 . tcp . 8443 comment "{c}" : fd00::5 . 443 }}',
        f'add element {T} any6{v6} {{ udp . 5353 comment "{c}" : fd00::5 . 53 }}',
        f'add element {T} masq6 {{ fd00::5 comment "{c}" : goto masq6-p64 }}',
        f'add element {T} hairpin6 {{ fd00:: . fd00::5 comment "{c}" }}',
    ]  # fmt: skip


NFT_DUAL_MASQ = [
    f"add chain {T} masq4-p16",
    f"flush chain {T} masq4-p16",
    f"add rule {T} masq4-p16 ip saddr 127.0.0.0/8 masquerade",
    f"add rule {T} masq4-p16 ip saddr & 255.255.0.0 . ip daddr @hairpin4 masquerade",
    f"add chain {T} masq6-p64",
    f"flush chain {T} masq6-p64",
    f"add rule {T} masq6-p64 ip6 saddr & ffff:ffff:ffff:ffff:: . ip6 daddr @hairpin6 masquerade",
]


def nft_lane(family: int, lane: str, condition: str) -> list[str]:
    addr, ipx = f"ipv{family}_addr", "ip" if family == 4 else "ip6"
    return [
        f"add map {T} hostip{family}_{lane} {{ type {addr} . inet_proto . inet_service : "
        f"{addr} . inet_service; }}",
        f"add map {T} any{family}_{lane} {{ type inet_proto . inet_service : "
        f"{addr} . inet_service; }}",
        f"insert rule {T} hostports {condition} dnat {ipx} to {ipx} daddr . meta l4proto . "
        f"th dport map @hostip{family}_{lane}",
        f"add rule {T} hostports {condition} meta nfproto ipv{family} dnat {ipx} to "
        f"meta l4proto . th dport map @any{family}_{lane}",
        f"add element {T} lanes {{ {int(lane, 16)} }}",
    ]


# ---------------------------------------------------------------------------- iptables text


def ipt_dual_dump(cid: str, conditioned: bool) -> str:
    """Both nat tables after one dual-stack ADD of HOSTIPS, as iptables-save orders them."""
    dn = chain(cid)
    c = go_comment(cid)
    s4, s6 = ("-s 192.168.77.0/24 ", "! -s fd77::/64 ") if conditioned else ("", "")
    v4 = [
        f"-A {dn} -s 10.88.0.0/16 -d 192.168.77.1/32 -p tcp -m tcp --dport 8080 "
        "-j CNI-HOSTPORT-SETMARK",
        f"-A {dn} -s 127.0.0.1/32 -d 192.168.77.1/32 -p tcp -m tcp --dport 8080 "
        "-j CNI-HOSTPORT-SETMARK",
        f"-A {dn} -d 192.168.77.1/32 -p tcp -m tcp --dport 8080 "
        "-j DNAT --to-destination 10.88.0.5:80",
        f"-A {dn} -s 10.88.0.0/16 -p udp -m udp --dport 5353 -j CNI-HOSTPORT-SETMARK",
        f"-A {dn} -s 127.0.0.1/32 -p udp -m udp --dport 5353 -j CNI-HOSTPORT-SETMARK",
        f"-A {dn} -p udp -m udp --dport 5353 -j DNAT --to-destination 10.88.0.5:53",
        # Go's: one multiport jump per protocol, listing every mapping's host port
        f"-A CNI-HOSTPORT-DNAT {s4}-p tcp {c} -m multiport --dports 8080,8443 -j {dn}",
        f"-A CNI-HOSTPORT-DNAT {s4}-p udp {c} -m multiport --dports 5353 -j {dn}",
    ]
    v6 = [
        f"-A {dn} -s fd00::/64 -d fd77::1/128 -p tcp -m tcp --dport 8443 -j CNI-HOSTPORT-SETMARK",
        f"-A {dn} -d fd77::1/128 -p tcp -m tcp --dport 8443 -j DNAT --to-destination [fd00::5]:443",
        f"-A {dn} -s fd00::/64 -p udp -m udp --dport 5353 -j CNI-HOSTPORT-SETMARK",
        f"-A {dn} -p udp -m udp --dport 5353 -j DNAT --to-destination [fd00::5]:53",
        f"-A CNI-HOSTPORT-DNAT {s6}-p tcp {c} -m multiport --dports 8080,8443 -j {dn}",
        f"-A CNI-HOSTPORT-DNAT {s6}-p udp {c} -m multiport --dports 5353 -j {dn}",
    ]
    out = []
    for family, rules in ((4, v4), (6, v6)):
        # the fake lists chains in creation order and rules chain by chain
        out += [f"nft ipv{family}", ":CNI-HOSTPORT-SETMARK", ":CNI-HOSTPORT-MASQ",
                ":CNI-HOSTPORT-DNAT", f":{dn}", f"-A PREROUTING {TO_DNAT}",
                f"-A OUTPUT {TO_DNAT}", f"-A POSTROUTING {TO_MASQ}", SETMARK, MASQ,
                *[r for r in rules if r.startswith("-A CNI-HOSTPORT-DNAT")],
                *[r for r in rules if r.startswith(f"-A {dn}")]]  # fmt: skip
    return "".join(line + "\n" for line in out)


def ipt_undo(dump: str, cid: str) -> str:
    """What DEL of `cid` sends: per family, -D of its jumps (as saved), -F and -X its chain."""
    out = ""
    dn = chain(cid)
    for block in dump.split("nft ipv")[1:]:
        family, *lines = block.splitlines()
        undo = ["-D" + x[2:] for x in lines if x.startswith("-A CNI-HOSTPORT-DNAT")]
        out += sent(f"nft ipv{family}", [*undo, f"-F {dn}", f"-X {dn}"])
    return out


IPT_SHARED_BOTH = "".join(
    f"nft ipv{f}\n:CNI-HOSTPORT-SETMARK\n:CNI-HOSTPORT-MASQ\n:CNI-HOSTPORT-DNAT\n"
    f"-A PREROUTING {TO_DNAT}\n-A OUTPUT {TO_DNAT}\n-A POSTROUTING {TO_MASQ}\n{SETMARK}\n{MASQ}\n"
    for f in (4, 6)
)


# ---------------------------------------------------------------------------- hostIP, IPv6


@pytest.mark.parametrize("conditioned", [False, True], ids=["plain", "conditions"])
def test_dual_stack_add_maps_each_familys_host_addresses_then_del_removes_them(
    dual: Dual, conditioned: bool
) -> None:
    keys = CONDITIONS[dual.backend] if conditioned else {}
    code, result = dual.run("ADD", **keys)
    assert code == 0, result
    assert [ip["address"] for ip in result["ips"]] == DUAL
    c = tag("ctr1")
    if dual.backend == "nftables":
        assert dual.fake.dump() == nft_dual_dump(c, conditioned) + LOCALNET_ON
        lanes = []
        if conditioned:
            lanes = [*nft_lane(4, LANE4, "ip saddr 192.168.77.0/24"),
                     *nft_lane(6, LANE6, "ip6 saddr fd77::/64")]  # fmt: skip
        fast = nft_dual_elements(c, conditioned)
        assert dual.fake.sent() == (
            sent("nft", fast) + f"nft: -> No such file or directory (create element {T} owners)\n"
            + sent("nft", [*nft.skeleton_text(), *lanes, *NFT_DUAL_MASQ, *fast]) + LOCALNET_ON
            + FLUSH_BOTH
        )  # fmt: skip
    else:
        dump = ipt_dual_dump("ctr1", conditioned)
        assert dual.fake.dump() == dump + LOCALNET_ON
        dual.fake.sent()
    assert dual.run("CHECK", **keys) == (0, None)
    assert dual.run("DEL", **keys) == (0, None)
    # portmap turned route_localnet on: the last DEL puts it back, then removes the
    # mappings and the guard
    if dual.backend == "nftables":
        removal = f"nft: delete table {T}\n"
        assert dual.fake.sent() == LOCALNET_OFF + removal + GUARD_OFF + FLUSH_BOTH
        assert dual.fake.dump() == LOCALNET_OFF
    else:
        removal = ipt_undo(dump, "ctr1")
        assert dual.fake.sent() == LOCALNET_OFF + removal + GUARD_OFF + FLUSH_BOTH
        assert dual.fake.dump() == IPT_SHARED_BOTH + LOCALNET_OFF


def test_iptables_appends_go_jumps_with_the_conditions_after_the_ports(ipt: Dual) -> None:
    """The restore text itself: with no wildcard of another attachment on its ports, the
    jumps of an attachment with a host address are appended, as Go does, in their order;
    Go's argv, the conditions after the ports (iptables-save moves -s to the front)."""
    assert ipt.run("ADD", **CONDITIONS["iptables"])[0] == 0
    dn, c = chain("ctr1"), go_comment("ctr1")
    text = ipt.fake.sent()
    assert sent("nft ipv4", [
        f"-A CNI-HOSTPORT-DNAT {c} -m multiport -p tcp --dports 8080,8443 "
        f"-s 192.168.77.0/24 -j {dn}",
        f"-A CNI-HOSTPORT-DNAT {c} -m multiport -p udp --dports 5353 -s 192.168.77.0/24 -j {dn}",
    ]) in text  # fmt: skip
    assert sent("nft ipv6", [
        f"-A CNI-HOSTPORT-DNAT {c} -m multiport -p tcp --dports 8080,8443 ! -s fd77::/64 -j {dn}",
        f"-A CNI-HOSTPORT-DNAT {c} -m multiport -p udp --dports 5353 ! -s fd77::/64 -j {dn}",
    ]) in text  # fmt: skip
    assert f"nft ipv6: -N {dn}\n" in text


def test_hostip_mapping_and_wildcard_of_the_same_port_are_no_conflict(dual: Dual) -> None:
    """192.168.77.1:8080 held by ctr1; the wildcard :8080 (ctr2) and another host address
    (ctr3) go in; the same address and port (ctr4) is a conflict naming ctr1."""
    one = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "192.168.77.1"}]
    assert dual.run("ADD", mappings=one, ips=["10.88.0.5/16"])[0] == 0
    wild = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
    assert dual.run("ADD", cid="ctr2", mappings=wild, ips=["10.88.0.6/16"])[0] == 0
    other = [{**one[0], "hostIP": "192.168.78.1"}]
    assert dual.run("ADD", cid="ctr3", mappings=other, ips=["10.88.0.7/16"])[0] == 0
    before = dual.fake.dump()
    code, error = dual.run("ADD", cid="ctr4", mappings=one, ips=["10.88.0.8/16"])
    assert (code, error["code"]) == (1, 101)
    assert error["msg"] == (
        f"host port 192.168.77.1:8080/tcp is already mapped by attachment {NET}/ctr1/eth0"
    )
    assert dual.fake.dump() == before
    if dual.backend == "iptables":
        # appended as they came, but ctr3's specific address goes above ctr2's wildcard
        jumps = [x for x in before.splitlines() if x.startswith("-A CNI-HOSTPORT-DNAT")]
        assert [x.split(" -j ")[-1] for x in jumps] == [chain(c) for c in ("ctr1", "ctr3", "ctr2")]
    else:
        claims = before.split("  set claims4\n")[1].split("  map masq4")[0]
        assert claims == (f'    192.168.77.1 . tcp . 8080 comment "{tag("ctr1")}"\n'
                          f'    0.0.0.0 . tcp . 8080 comment "{tag("ctr2")}"\n'
                          f'    192.168.78.1 . tcp . 8080 comment "{tag("ctr3")}"\n')  # fmt: skip


# ---------------------------------------------------------------------------- CHECK, owners


def test_check_of_objects_that_belong_to_another_attachment_names_the_owner(dual: Dual) -> None:
    """ctr2 with ctr1's config: every object CHECK looks for is there, but ctr1's."""
    keys = CONDITIONS[dual.backend]
    assert dual.run("ADD", **keys)[0] == 0
    dual.fake.sent()
    code, error = dual.run("CHECK", cid="ctr2", **keys)
    assert (code, error["code"]) == (1, 102)
    assert error["msg"] == f"port mappings of {NET}/ctr2/eth0 differ from the config"
    if dual.backend == "nftables":
        owner = f"belongs to {NET}/ctr1/eth0"
        assert error["details"] == "; ".join([
            f"claims4 192.168.77.1 . tcp . 8080 {owner}",
            f"hostip4_{LANE4} 192.168.77.1 . tcp . 8080 {owner}",
            f"claims4 0.0.0.0 . udp . 5353 {owner}",
            f"any4_{LANE4} udp . 5353 {owner}",
            f"masq4 10.88.0.5 {owner}",
            f"hairpin4 10.88.0.0 . 10.88.0.5 {owner}",
            f"claims6 fd77::1 . tcp . 8443 {owner}",
            f"hostip6_{LANE6} fd77::1 . tcp . 8443 {owner}",
            f"claims6 :: . udp . 5353 {owner}",
            f"any6_{LANE6} udp . 5353 {owner}",
        ]) + " (+2 more)"  # fmt: skip
    else:
        dn = chain("ctr2")
        assert error["details"] == (f"IPv4: chain {dn} is missing (iptables-nft); "
                                    f"IPv6: chain {dn} is missing (iptables-nft)")  # fmt: skip
    assert dual.fake.sent() == ""  # CHECK changes nothing


def test_check_names_a_jump_that_went_to_another_chain(ipt: Dual) -> None:
    """iptables: ctr1's chain is intact but one of its jumps now leads elsewhere."""
    assert ipt.run("ADD")[0] == 0
    nat = ipt.fake.xtables.table("nft", 6)
    nat["CNI-HOSTPORT-DNAT"][0] = nat["CNI-HOSTPORT-DNAT"][0].replace(chain("ctr1"), "KUBE-X")
    code, error = ipt.run("CHECK")
    assert (code, error["code"]) == (1, 102)
    lacks, count = error["details"].split("; ")
    assert lacks.startswith("IPv6: CNI-HOSTPORT-DNAT lacks a jump the config asks for: ")
    assert "-p tcp --dports 8080,8443 " in lacks  # the one redirected
    assert count == f"IPv6: CNI-HOSTPORT-DNAT has 1 jumps to {chain('ctr1')}, expected 2"


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_check_names_conditions_that_differ_from_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Added with conditionsV4 -s 192.168.77.0/24; the config now says -s 10.0.0.0/8, or
    no conditions at all: the installed DNAT admits other clients than configured."""
    world = _dual(tmp_path, monkeypatch, backend)
    one: dict[str, Any] = {"mappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
           "ips": ["10.88.0.5/16"]}  # fmt: skip
    assert world.run("ADD", **one, conditionsV4=["-s", "192.168.77.0/24"])[0] == 0
    for conditions in (["-s", "10.0.0.0/8"], []):
        code, error = world.run("CHECK", **one, conditionsV4=conditions)
        assert code == 1, f"CHECK passed with conditionsV4 {conditions}"
        assert error["code"] == 102
        if backend == "nftables":
            missing = "any4{} has no element tcp . 8080 : 10.88.0.5 . 80"
            assert error["details"] == (
                f"the IPv4 lookup rules of {T} are missing; " + missing.format("_8a75da35")
                if conditions
                else missing.format("")
            )
        else:  # iptables names the first jump it does not find, with the config's conditions
            assert "CNI-HOSTPORT-DNAT lacks a jump the config asks for" in error["details"]
            assert ("-s 10.0.0.0/8 " in error["details"]) == bool(conditions)


# ---------------------------------------------------------------------------- GC


def test_gc_of_a_mix_sweeps_stale_and_stateless_attachments_only(dual: Dual) -> None:
    """keep: valid; gone1, gone2: stale; lost: stale, its state file gone (found by its
    comment); other: another network's. GC of pmnet with keep valid removes gone1, gone2
    and lost in one transaction per table, and flushes their UDP ports."""
    ports = {"keep": 8080, "gone1": 8081, "gone2": 8082, "lost": 8083, "other": 8084}
    for i, (cid, port) in enumerate(ports.items()):
        mapping = [{"hostPort": port, "containerPort": 53, "protocol": "udp"}]
        name = "othernet" if cid == "other" else NET
        ip = f"10.88.0.{5 + i}"
        code, result = dual.run("ADD", cid=cid, mappings=mapping, ips=[f"{ip}/16"], name=name)
        assert code == 0, result
    lost = Attachment(NET, "lost", "eth0")
    (dual.state / "portmap" / f"{lost.tag}.json").unlink()
    full = dual.fake.dump()
    dual.fake.sent()
    gc = {"cniVersion": "1.1.0", "name": NET, "type": "portmap", "backend": dual.backend,
          "cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]}  # fmt: skip
    assert dual.kernel.run("portmap", "GC", gc, netns="", kernel=dual.fake) == (0, None)
    gone = ("gone1", "gone2", "lost")
    if dual.backend == "nftables":
        assert dual.fake.sent() == sent("nft", [
            f"delete element {T} any4 {{ udp . 8081, udp . 8082, udp . 8083 }}",
            f"delete element {T} claims4 {{ 0.0.0.0 . udp . 8081, 0.0.0.0 . udp . 8082, "
            "0.0.0.0 . udp . 8083 }",
            f"delete element {T} hairpin4 {{ 10.88.0.0 . 10.88.0.6, 10.88.0.0 . 10.88.0.7, "
            "10.88.0.0 . 10.88.0.8 }",
            f"delete element {T} masq4 {{ 10.88.0.6, 10.88.0.7, 10.88.0.8 }}",
            f"delete element {T} owners {{ {', '.join(sorted(owner(cid) for cid in gone))} }}",
        ]) + "conntrack: flush IPv4 UDP to *:8081, *:8082, *:8083\n"  # fmt: skip
        kept = [x for x in full.splitlines() if not any(tag(cid) in x for cid in gone)]
    else:
        undo = []
        doomed = sorted((chain(cid), cid) for cid in gone)  # chain by chain, in name order
        for dn, cid in doomed:
            undo += [f"-D CNI-HOSTPORT-DNAT -p udp {go_comment(cid)} -m multiport "
                     f"--dports {ports[cid]} -j {dn}", f"-F {dn}", f"-X {dn}"]  # fmt: skip
        flush = ", ".join(f"*:{ports[cid]}" for _, cid in doomed)
        assert (
            dual.fake.sent() == sent("nft ipv4", undo) + f"conntrack: flush IPv4 UDP to {flush}\n"
        )
        names = {chain(cid) for cid in gone} | {f'id: \\"{cid}\\"' for cid in gone}
        kept = [x for x in full.splitlines() if not any(n in x for n in names)]
    assert dual.fake.dump() == "".join(f"{x}\n" for x in kept)
    assert {p.name for p in (dual.state / "portmap").glob("*.json")} == {
        f"{Attachment(NET, 'keep', 'eth0').tag}.json",
        f"{Attachment('othernet', 'other', 'eth0').tag}.json",
    }
    assert dual.kernel.run("portmap", "GC", gc, netns="", kernel=dual.fake) == (0, None)
    assert dual.fake.sent() == ""  # nothing left to sweep


def test_gc_with_no_valid_attachment_left_undoes_the_last_one_as_del_does(dual: Dual) -> None:
    assert dual.run("ADD")[0] == 0
    dual.fake.sent()
    gc = {"cniVersion": "1.1.0", "name": NET, "type": "portmap", "backend": dual.backend,
          "cni.dev/valid-attachments": []}  # fmt: skip
    assert dual.kernel.run("portmap", "GC", gc, netns="", kernel=dual.fake) == (0, None)
    # route_localnet and its guard too
    if dual.backend == "nftables":
        assert dual.fake.sent() == f"nft: delete table {T}\n" + FLUSH_BOTH + PUT_BACK
        assert dual.fake.dump() == LOCALNET_OFF
    else:
        dump = ipt_dual_dump("ctr1", False)
        assert dual.fake.sent() == ipt_undo(dump, "ctr1") + FLUSH_BOTH + PUT_BACK
        assert dual.fake.dump() == IPT_SHARED_BOTH + LOCALNET_OFF

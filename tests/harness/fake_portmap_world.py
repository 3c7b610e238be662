"""portmap's world over the fake netfilter (fake_portmap.py): a container netns, a
private state dir, the verbs run as the executable runs them, and the exact text a test
expects of each backend (tests/fake/test_portmap_verbs*.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.identity import Attachment
from portmap import nft
from portmap.config import owner_comment
from portmap.xtables import chain_name
from tests.harness.fake_kernel import FakeKernel
from tests.harness.fake_portmap import GUARD, ROUTE_LOCALNET, FakeNetfilter

NET = "pmnet"
BACKENDS = ("nftables", "iptables")
T = "inet cni_meta_portmap"
GUARDED = f"{GUARD}cni0\n"  # the localhost guard, on before route_localnet and after
LOCALNET_ON = GUARDED + f"sysctl {ROUTE_LOCALNET} = 1\n"
LOCALNET_OFF = f"sysctl {ROUTE_LOCALNET} = 0\n"
GUARD_OFF = f"{GUARD}(none)\n"
# route_localnet back, then the guard removed: what GC sends for the last attachment (its
# DEL: LOCALNET_OFF, then the mappings' removal, GUARD_OFF in the nftables backend's
# transaction or after the iptables backend's)
PUT_BACK = LOCALNET_OFF + GUARD_OFF
MAPPINGS = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp"}]  # fmt: skip


class World:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
        self.backend = backend
        self.kernel = FakeKernel(tmp_path / "netns")  # for the CNI_NETNS paths and `run`
        self.netns = self.kernel.add_netns("ctr")
        self.fake = FakeNetfilter()
        self.state = tmp_path / "state"

    def conf(self, ip: str = "10.88.0.5", mappings: Any = MAPPINGS, **keys: Any) -> Any:
        return {
            "cniVersion": "1.1.0", "name": NET, "type": "portmap", "backend": self.backend,
            "runtimeConfig": {"portMappings": mappings},
            "prevResult": {
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "sandbox": self.netns}],
                "ips": [{"address": f"{ip}/16", "interface": 0}],
            },
            **keys,
        }  # fmt: skip

    def run(self, command: str, cid: str = "ctr1", **conf: Any) -> tuple[int, Any]:
        return self.kernel.run("portmap", command, self.conf(**conf), netns=self.netns,
                               container_id=cid, kernel=self.fake)  # fmt: skip

    def records(self) -> list[str]:
        return sorted(p.name for p in self.state.rglob("*.json"))


def tag(cid: str) -> str:
    return owner_comment(Attachment(NET, cid, "eth0"))


def chain(cid: str) -> str:
    return chain_name(Attachment(NET, cid, "eth0"))


# ---------------------------------------------------------------------------- expected text


def owner(cid: str) -> str:
    """The attachment's key in the owners set (its proof of ownership)."""
    return nft.owner_element(Attachment(NET, cid, "eth0")).key


def nft_elements(cid: str, ip: str, verb: str = "create") -> list[str]:
    c = tag(cid)
    return [
        f'create element {T} owners {{ {owner(cid)} comment "{c}" }}',
        f'{verb} element {T} claims4 {{ 0.0.0.0 . tcp . 8080 comment "{c}", '
        f'0.0.0.0 . udp . 5353 comment "{c}" }}',
        f'add element {T} any4 {{ tcp . 8080 comment "{c}" : {ip} . 80, '
        f'udp . 5353 comment "{c}" : {ip} . 53 }}',
        f'add element {T} masq4 {{ {ip} comment "{c}" : goto masq4-p16 }}',
        f'add element {T} hairpin4 {{ 10.88.0.0 . {ip} comment "{c}" }}',
    ]


NFT_MASQ_CHAIN = [
    f"add chain {T} masq4-p16",
    f"flush chain {T} masq4-p16",
    f"add rule {T} masq4-p16 ip saddr 127.0.0.0/8 masquerade",
    f"add rule {T} masq4-p16 ip saddr & 255.255.0.0 . ip daddr @hairpin4 masquerade",
]


# The chains every nft dump ends with (the IPv4 masquerade chain of a /16 included)
NFT_CHAINS = """\
  chain masq-all
    masquerade
  chain prerouting
    fib daddr type local jump hostports
  chain output
    fib daddr type local jump hostports
  chain postrouting
    ct status dnat ip daddr vmap @masq4
    ct status dnat ip6 daddr vmap @masq6
  chain masq4-p16
    ip saddr 127.0.0.0/8 masquerade
    ip saddr & 255.255.0.0 . ip daddr @hairpin4 masquerade
"""


def nft_dump(cid: str = "ctr1", ip: str = "10.88.0.5") -> str:
    c = tag(cid)
    return f"""table inet cni_meta_portmap
  set lanes
    1260550007
    3891707921
  set owners
    {owner(cid)} comment "{c}"
  set claims4
    0.0.0.0 . tcp . 8080 comment "{c}"
    0.0.0.0 . udp . 5353 comment "{c}"
  map masq4
    {ip} comment "{c}" : goto masq4-p16
  set hairpin4
    10.88.0.0 . {ip} comment "{c}"
  set claims6
  map masq6
  set hairpin6
  map hostip4
  map any4
    tcp . 8080 comment "{c}" : {ip} . 80
    udp . 5353 comment "{c}" : {ip} . 53
  map hostip6
  map any6
  chain hostports
    dnat ip to ip daddr . meta l4proto . th dport map @hostip4
    dnat ip6 to ip6 daddr . meta l4proto . th dport map @hostip6
    meta nfproto ipv4 dnat ip to meta l4proto . th dport map @any4
    meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @any6
{NFT_CHAINS}"""


def ipt_chain_rules(cid: str, ip: str) -> list[str]:
    dn, out = chain(cid), []
    for proto, port, cport in (("tcp", 8080, 80), ("udp", 5353, 53)):
        dest = f"-p {proto} -m {proto} --dport {port}"
        out += [f"-A {dn} -s 10.88.0.0/16 {dest} -j CNI-HOSTPORT-SETMARK",
                f"-A {dn} -s 127.0.0.1/32 {dest} -j CNI-HOSTPORT-SETMARK",
                f"-A {dn} {dest} -j DNAT --to-destination {ip}:{cport}"]  # fmt: skip
    return out


def go_comment(cid: str, net: str = NET) -> str:
    """The comment match of Go's jumps, as iptables-save prints it."""
    return f'-m comment --comment "dnat name: \\"{net}\\" id: \\"{cid}\\""'


def ipt_jumps(cid: str, saved: bool = True) -> list[str]:
    """Go's jumps, as iptables-save prints them (or as we send them: -p after the
    comment, where Go puts it)."""
    comment = go_comment(cid)
    out = []
    for proto, port in (("tcp", 8080), ("udp", 5353)):
        matches = (
            f"-p {proto} {comment} -m multiport" if saved else f"{comment} -m multiport -p {proto}"
        )
        out.append(f"-A CNI-HOSTPORT-DNAT {matches} --dports {port} -j {chain(cid)}")
    return out


SETMARK = ('-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" '
           "-j MARK --set-xmark 0x2000/0x2000")  # fmt: skip
MASQ = "-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE"
TO_MASQ = '-m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ'
TO_DNAT = "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"


def ipt_dump(cid: str = "ctr1", ip: str = "10.88.0.5") -> str:
    lines = ["nft ipv4", ":CNI-HOSTPORT-SETMARK", ":CNI-HOSTPORT-MASQ", ":CNI-HOSTPORT-DNAT",
             f":{chain(cid)}", f"-A PREROUTING {TO_DNAT}", f"-A OUTPUT {TO_DNAT}",
             f"-A POSTROUTING {TO_MASQ}", SETMARK, MASQ, *ipt_jumps(cid),
             *ipt_chain_rules(cid, ip)]  # fmt: skip
    return "".join(line + "\n" for line in lines)


IPT_SHARED = "".join(line + "\n" for line in [
    "nft ipv4", ":CNI-HOSTPORT-SETMARK", ":CNI-HOSTPORT-MASQ", ":CNI-HOSTPORT-DNAT",
    f"-A PREROUTING {TO_DNAT}", f"-A OUTPUT {TO_DNAT}", f"-A POSTROUTING {TO_MASQ}", SETMARK,
    MASQ])  # fmt: skip


def ipt_first_add(cid: str = "ctr1", ip: str = "10.88.0.5") -> list[str]:
    return ["-N CNI-HOSTPORT-SETMARK", SETMARK, "-N CNI-HOSTPORT-MASQ", MASQ,
            f"-I POSTROUTING 1 {TO_MASQ}", "-N CNI-HOSTPORT-DNAT", f"-A PREROUTING {TO_DNAT}",
            f"-A OUTPUT {TO_DNAT}", f"-N {chain(cid)}", *ipt_chain_rules(cid, ip),
            *ipt_jumps(cid, saved=False)]  # fmt: skip


def added(world: World, cid: str = "ctr1", ip: str = "10.88.0.5") -> str:
    kind = nft_dump if world.backend == "nftables" else ipt_dump
    return kind(cid, ip) + LOCALNET_ON


def sent(prefix: str, lines: list[str]) -> str:
    return "".join(f"{prefix}: {line}\n" for line in lines)


FLUSH = "conntrack: flush IPv4 UDP to *:5353\n"
ENOENT = "No such file or directory"

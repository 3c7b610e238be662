"""The iptables backend against the Go portmap 1.1.1 (/usr/lib/cni), on a real kernel.

Our rules, chains and names are Go's, so that either plugin's DEL removes what the other
one's ADD made (a node switched between them with pods running), in iptables-nft and in
iptables-legacy: ours ADD -> Go DEL leaves nothing of the mapping, Go ADD -> ours DEL
neither, and for one config both ADDs leave the same nat table (iptables-save, counters
dropped), through which real traffic reaches the container.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from common.digest import sha512_hex
from tests.harness.lab import Lab
from tests.harness.plugins import GO_BIN, our, run_plugin
from tests.harness.portmap_world import HOST4, add_ext, conflist
from tests.harness.traffic import echo_server, reaches

pytestmark = pytest.mark.root

CID = "gomatch1"
PORTS = [
    {"hostPort": 18080, "containerPort": 80, "protocol": "tcp"},
    {"hostPort": 18081, "containerPort": 81, "protocol": "tcp", "hostIP": HOST4},
    {"hostPort": 18053, "containerPort": 53, "protocol": "udp"},
]
VARIANTS = ["nft", "legacy"]


def go_name(network: str, container_id: str) -> str:
    return ("CNI-DN-" + sha512_hex((network + container_id).encode()))[:28]


def go_env(lab: Lab, variant: str) -> dict[str, str]:
    """The Go portmap runs `iptables` from PATH: point it at the variant."""
    d = lab.workdir / f"{variant}-bin"
    if not d.exists():
        d.mkdir()
        for name in ("iptables", "ip6tables"):
            (d / name).symlink_to(f"/usr/sbin/{name}-{variant}")
    return {**lab.env, "PATH": f"{d}:{os.environ['PATH']}"}


def our_env(lab: Lab, variant: str) -> dict[str, str]:
    return {**lab.env, "CNI_META_IPTABLES": variant}


def bridge_only(lab: Lab) -> tuple[dict[str, Any], dict[str, Any]]:
    """A container attached by the Go bridge alone: the prevResult both portmaps get."""
    path = conflist(lab, "portmap-ipv4.conflist")
    raw = json.loads(path.read_text())
    raw["plugins"] = [p for p in raw["plugins"] if p["type"] != "portmap"]
    path.write_text(json.dumps(raw))
    return raw, dict(lab.chain.add(path, lab.ctr))


def portmap_conf(raw: dict[str, Any], prev: dict[str, Any], **keys: Any) -> dict[str, Any]:
    return {"cniVersion": raw["cniVersion"], "name": raw["name"], "type": "portmap",
            "backend": "iptables", "snat": True, "runtimeConfig": {"portMappings": PORTS},
            "prevResult": prev, **keys}  # fmt: skip


def call(lab: Lab, go: bool, variant: str, command: str, conf: dict[str, Any]) -> None:
    exe = str(GO_BIN / "portmap") if go else our("portmap")
    env = go_env(lab, variant) if go else our_env(lab, variant)
    run_plugin(exe, command, conf, host=lab.host, container_id=CID, netns=lab.ctr.path,
               env=env).ok()  # fmt: skip


def nat(lab: Lab, variant: str) -> str:
    """Both families' nat tables of the variant, counters and comment lines dropped; an
    empty table (Go 1.1.1's DEL makes the IPv6 one: it lists it) reads as none."""
    text = ""
    for family in ("iptables", "ip6tables"):
        if variant == "legacy":  # listing a legacy table that is not there would create it
            names = f"/proc/net/{'ip6' if family == 'ip6tables' else 'ip'}_tables_names"
            if "nat" not in lab.host.run("cat", names, check=False).split():
                continue
        saved = lab.host.run(f"{family}-{variant}-save", "-t", "nat", check=False)
        if "\n-A " in saved or "\n:CNI-" in saved:
            text += saved
    lines = (re.sub(r"\[\d+:\d+\]", "", line) for line in text.splitlines())
    return "\n".join(line for line in lines if not line.startswith("#"))


def traces(lab: Lab, variant: str, network: str, address: str) -> list[str]:
    """What is left of the mapping: its chain, jumps naming the container, DNAT to it."""
    chain = go_name(network, CID)
    ip = re.compile(re.escape(address) + r"(?![0-9])")
    return [x for x in nat(lab, variant).splitlines() if chain in x or CID in x or ip.search(x)]


def address(prev: dict[str, Any]) -> str:
    return str(prev["ips"][0]["address"]).split("/")[0]


def serves(lab: Lab, tag: str) -> None:
    """Real traffic through the mapping: from another host (TCP, UDP) and from the host
    itself through 127.0.0.1 (the localhost mark)."""
    ext = add_ext(lab)
    with echo_server(lab.ctr, 80, "tcp", tag), echo_server(lab.ctr, 53, "udp", tag):
        assert reaches(ext, HOST4, 18080) == f"{tag}:ping".encode()
        assert reaches(ext, HOST4, 18053, "udp") == f"{tag}:ping".encode()
        assert reaches(lab.host, "127.0.0.1", 18080) == f"{tag}:ping".encode()


@pytest.mark.parametrize("variant", VARIANTS)
def test_go_del_removes_what_our_add_made(lab: Lab, variant: str) -> None:
    raw, prev = bridge_only(lab)
    conf = portmap_conf(raw, prev)
    call(lab, False, variant, "ADD", conf)
    assert f":{go_name(raw['name'], CID)} " in nat(lab, variant)
    serves(lab, "ours")

    call(lab, True, variant, "DEL", conf)

    assert traces(lab, variant, raw["name"], address(prev)) == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_our_del_removes_what_the_go_add_made(lab: Lab, variant: str) -> None:
    raw, prev = bridge_only(lab)
    conf = portmap_conf(raw, prev)
    call(lab, True, variant, "ADD", conf)
    assert f":{go_name(raw['name'], CID)} " in nat(lab, variant)
    serves(lab, "go")
    call(lab, False, variant, "CHECK", conf)  # ours recognises Go's rules as its own

    call(lab, False, variant, "DEL", conf)

    assert traces(lab, variant, raw["name"], address(prev)) == []


def forget_shared(lab: Lab, variant: str) -> None:
    """Back to an empty nat table: the shared chains both plugins leave."""
    for family in ("iptables", "ip6tables"):
        exe = f"{family}-{variant}"
        for hook, rule in (("PREROUTING", ["-m", "addrtype", "--dst-type", "LOCAL"]),
                           ("OUTPUT", ["-m", "addrtype", "--dst-type", "LOCAL"])):  # fmt: skip
            lab.host.run(exe, "-t", "nat", "-D", hook, *rule, "-j", "CNI-HOSTPORT-DNAT",
                         check=False)  # fmt: skip
        lab.host.run(exe, "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment",
                     "CNI portfwd requiring masquerade", "-j", "CNI-HOSTPORT-MASQ",
                     check=False)  # fmt: skip
        for chain in ("CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ"):
            lab.host.run(exe, "-t", "nat", "-F", chain, check=False)
            lab.host.run(exe, "-t", "nat", "-X", chain, check=False)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "keys",
    [{}, {"conditionsV4": ["!", "-s", "192.0.2.0/24"], "markMasqBit": 5}],
    ids=["plain", "conditions-markbit"],
)
def test_our_add_makes_the_nat_table_gos_add_makes(
    lab: Lab, variant: str, keys: dict[str, Any]
) -> None:
    raw, prev = bridge_only(lab)
    conf = portmap_conf(raw, prev, **keys)
    call(lab, True, variant, "ADD", conf)
    go = nat(lab, variant)
    assert f":{go_name(raw['name'], CID)} " in go
    call(lab, True, variant, "DEL", conf)
    forget_shared(lab, variant)
    assert "CNI-" not in nat(lab, variant)

    call(lab, False, variant, "ADD", conf)

    assert nat(lab, variant) == go
    serves(lab, "ours")

"""Switching a node between the Go plugins and ours while pods run.

A pod set up by the Go plugins (bridge + Go portmap, bandwidth, tuning 1.1.1 from
/usr/lib/cni) is deleted by ours: nothing of it may stay (iptables-nft, iptables-legacy,
the Go nftables backend's rules, the ifb, the tuning backup), and a new pod on the freed
host port gets the traffic. And the other way: what the Go plugins' DEL leaves of a pod
we set up (nothing with the iptables backend, whose rules are Go's), and that the
commands of docs/differences.md remove the rest.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from cnichain import PluginError
from common.digest import sha512_hex
from tests.harness.lab import Lab, LabChain
from tests.harness.netns import Netns
from tests.harness.plugins import GO_BIN, our, run_plugin
from tests.harness.portmap_world import HOST4, add_ext, conntrack_udp, udp_flow
from tests.harness.traffic import echo_server, reaches

pytestmark = pytest.mark.root

NETWORK = "cmp-go"
OTHER = "cmp-go-m"
SUBNET = "10.89.9.0/24"
PORT = 18080
MTU = 1400
MAC = "02:77:bb:00:00:01"
GO_POD = "gopod1"


def conflist(lab: Lab, *, plugins: tuple[str, ...] = ("portmap", "bandwidth", "tuning")) -> Path:
    entries: dict[str, dict[str, Any]] = {
        "portmap": {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        "bandwidth": {"type": "bandwidth", "capabilities": {"bandwidth": True}},
        # Go's tuning keeps its backup in dataDir (/run/cni/tuning by default): ours reads
        # the same key, so both use the test's directory.
        "tuning": {
            "type": "tuning",
            "capabilities": {"mac": True},
            "mtu": MTU,
            "promisc": True,
            "dataDir": str(lab.workdir / "tuning"),
        },
    }
    raw = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cmpgo0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(lab.workdir / "host-local"),
                },
            },
            *(entries[p] for p in plugins),
        ],
    }
    out = lab.workdir / f"go-{'-'.join(plugins) or 'bridge'}.conflist"
    out.write_text(json.dumps(raw, indent=2))
    return out


def legacy_bin(lab: Lab) -> str:
    """A PATH entry where `iptables` is iptables-legacy: the Go portmap runs `iptables`."""
    d = lab.workdir / "legacy-bin"
    d.mkdir(exist_ok=True)
    for name in ("iptables", "ip6tables"):
        (d / name).symlink_to(f"/usr/sbin/{name}-legacy")
    return str(d)


def go_chain(lab: Lab, iptables: str = "iptables-nft") -> LabChain:
    env = {}
    if iptables == "iptables-legacy":
        env["PATH"] = f"{legacy_bin(lab)}:{os.environ['PATH']}"
    return LabChain(lab, [GO_BIN], env)


def go_chain_name(container_id: str) -> str:
    return ("CNI-DN-" + sha512_hex((NETWORK + container_id).encode()))[:28]


def go_ifb(container_id: str) -> str:
    return ("bwp" + sha512_hex((NETWORK + container_id).encode()))[:15]


def backup_file(lab: Lab, container_id: str) -> Path:
    return lab.workdir / "tuning" / f"{container_id}_eth0.json"


def leftovers(lab: Lab, container_id: str, address: str) -> list[str]:
    """Every trace of the attachment in the host netns, through each tool's own view."""
    found = []
    chain = go_chain_name(container_id)
    ip = re.compile(re.escape(address) + r"(?![0-9])")
    for tool in ("iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save",
                 "ip6tables-legacy-save"):  # fmt: skip
        for line in lab.host.run(tool, "-t", "nat", check=False).splitlines():
            if chain in line or container_id in line or ip.search(line):
                found.append(f"{tool}: {line}")
    for line in lab.host.run("nft", "list", "ruleset").splitlines():
        if chain in line or container_id in line or ip.search(line):
            found.append(f"nft: {line.strip()}")
    ifb = go_ifb(container_id)
    if lab.host.ip("link", "show", ifb, check=False).strip():
        found.append(f"ip link: {ifb}")
    if backup_file(lab, container_id).exists():
        found.append(f"tuning backup: {backup_file(lab, container_id)}")
    return found


def address_of(result: dict[str, Any]) -> str:
    return str(result["ips"][0]["address"]).split("/")[0]


def new_pod_gets_the_port(lab: Lab, ext: Netns, conf: Path, old_address: str) -> None:
    """A pod set up by our plugins on the same host port, at another address, answers
    through it."""
    pod = lab.new_netns("new")
    result = lab.chain.add(conf, pod, f"{PORT}:80/tcp", container_id="newpod")
    assert address_of(result) != old_address  # else a stale DNAT would still "work"
    with echo_server(pod, 80, "tcp", "new"):
        assert reaches(ext, HOST4, PORT) == b"new:ping"
    lab.chain.delete(conf, pod, f"{PORT}:80/tcp", container_id="newpod")


def bystander(lab: Lab, conf: Path) -> None:
    """A pod of ours set up before the Go pod, as on a node part-way through the switch.

    Its nft table then predates the nat chains the Go pod's ADD registers, and the kernel
    runs the newer of two nat chains of one priority first: a Go DNAT left behind would
    take the host port from the pod that gets it next.
    """
    pod = lab.new_netns("by")
    lab.chain.add(conf, pod, f"{PORT + 5}:80/tcp", container_id="bystander")


def go_add(chain: LabChain, conf: Path, ctr: Netns) -> dict[str, Any]:
    return chain.add(conf, ctr, f"{PORT}:80/tcp", container_id=GO_POD, bandwidth="10mbit",
                     mac=MAC)  # fmt: skip


# ---------------------------------------------------------------------------- Go -> ours


@pytest.mark.parametrize("iptables", ["iptables-nft", "iptables-legacy"])
def test_our_del_removes_what_the_go_plugins_made(lab: Lab, iptables: str) -> None:
    ext, conf = add_ext(lab), conflist(lab)
    bystander(lab, conf)
    result = go_add(go_chain(lab, iptables), conf, lab.ctr)
    address = address_of(result)
    with echo_server(lab.ctr, 80, "tcp", "go"):
        assert reaches(ext, HOST4, PORT) == b"go:ping"
    made = leftovers(lab, GO_POD, address)
    save = f"{iptables}-save"
    assert any(line.startswith(f"{save}: :{go_chain_name(GO_POD)}") for line in made), made
    assert f"ip link: {go_ifb(GO_POD)}" in made
    assert any(line.startswith("tuning backup") for line in made)
    assert f"mtu {MTU}" in lab.ctr.ip("link", "show", "eth0")

    lab.chain.delete(conf, lab.ctr, f"{PORT}:80/tcp", container_id=GO_POD, bandwidth="10mbit",
                     mac=MAC)  # fmt: skip

    assert leftovers(lab, GO_POD, address) == []
    new_pod_gets_the_port(lab, ext, conf, address)


def test_our_second_del_of_a_go_pod_is_quiet(lab: Lab) -> None:
    """The runtime's second DEL (netns gone) finds nothing and succeeds."""
    conf = conflist(lab)
    go_add(go_chain(lab), conf, lab.ctr)
    for _ in range(2):
        lab.chain.delete(conf, None, f"{PORT}:80/tcp", container_id=GO_POD)
    assert [x for x in leftovers(lab, GO_POD, "10.89.9.") if "ip link" in x or "CNI-DN" in x] == []


def go_nftables_rules(lab: Lab, container_id: str, address: str, port: int) -> None:
    """What the Go portmap 1.6-1.9 with `backend: nftables` makes for one IPv4 mapping
    (plugins/meta/portmap/portmap_nftables.go, forwardPorts): no Go 1.6+ binary here."""
    t = "ip cni_hostport"
    text = f"""
add table {t} {{ comment "CNI portmap plugin" ; }}
add chain {t} hostports
add chain {t} hostip_hostports
add chain {t} hostports_all
flush chain {t} hostports_all
add rule {t} hostports_all jump hostip_hostports
add rule {t} hostports_all jump hostports
add chain {t} prerouting {{ type nat hook prerouting priority dstnat ; }}
flush chain {t} prerouting
add rule {t} prerouting fib daddr type local jump hostports_all
add chain {t} output {{ type nat hook output priority -100 ; }}
flush chain {t} output
add rule {t} output fib daddr type local jump hostports_all
add chain {t} masquerading {{ type nat hook postrouting priority srcnat ; }}
add rule {t} hostports tcp dport {port} dnat to {address}:80 comment "{container_id}"
add rule {t} masquerading ip saddr {address} ip daddr {address} masquerade comment "{container_id}"
add rule {t} masquerading ip saddr 127.0.0.1 ip daddr {address} masquerade comment "{container_id}"
"""
    path = lab.workdir / f"go-nft-{container_id}.nft"
    path.write_text(text)
    lab.host.run("nft", "-f", str(path))


def test_our_del_removes_the_go_nftables_backends_rules(lab: Lab) -> None:
    ext, full, bridge_only = add_ext(lab), conflist(lab), conflist(lab, plugins=())
    bystander(lab, full)
    address = address_of(go_chain(lab).add(bridge_only, lab.ctr, container_id=GO_POD))
    go_nftables_rules(lab, GO_POD, address, PORT)
    go_nftables_rules(lab, "somebody-else", "10.89.9.250", PORT + 1)
    with echo_server(lab.ctr, 80, "tcp", "go"):
        assert reaches(ext, HOST4, PORT) == b"go:ping"

    lab.chain.delete(full, lab.ctr, f"{PORT}:80/tcp", container_id=GO_POD)

    assert leftovers(lab, GO_POD, address) == []
    kept = lab.host.run("nft", "list", "table", "ip", "cni_hostport")
    assert '"somebody-else"' in kept  # another container's rules and the table stay
    new_pod_gets_the_port(lab, ext, full, address)


def test_our_check_of_a_go_pod_says_what_is_missing(lab: Lab) -> None:
    conf = conflist(lab)
    go_add(go_chain(lab), conf, lab.ctr)
    with pytest.raises(PluginError) as failed:
        lab.chain.check(conf, lab.ctr, f"{PORT}:80/tcp", container_id=GO_POD,
                        bandwidth="10mbit", mac=MAC)  # fmt: skip
    said = str(failed.value)
    assert "Traceback" not in said + failed.value.stderr
    assert "portmap" in said and "missing" in said.lower(), said
    # bandwidth and tuning on their own: Go's shaping and link settings are what ours make
    rest = conflist(lab, plugins=("bandwidth", "tuning"))
    lab.chain.check(rest, lab.ctr, container_id=GO_POD, bandwidth="10mbit", mac=MAC)


def other_network(lab: Lab, conf: Path) -> Path:
    """The same conflist as network M: another name, bridge and subnet."""
    raw = json.loads(conf.read_text())
    raw["name"] = OTHER
    raw["plugins"][0]["bridge"] = "cmpgo1"
    raw["plugins"][0]["ipam"]["ranges"] = [[{"subnet": "10.89.10.0/24"}]]
    out = lab.workdir / "go-other.conflist"
    out.write_text(json.dumps(raw, indent=2))
    return out


def go_gc(lab: Lab, *valid: str) -> None:
    """Our portmap's GC of NETWORK (its default backend: nftables), as a runtime sends it."""
    alive = [{"containerID": c, "ifname": "eth0"} for c in valid]
    conf = {"cniVersion": "1.1.0", "name": NETWORK, "type": "portmap",
            "cni.dev/valid-attachments": alive}  # fmt: skip
    run_plugin(our("portmap"), "GC", conf, host=lab.host, env=lab.env).ok()


@pytest.mark.parametrize("iptables", ["iptables-nft", "iptables-legacy"])
def test_our_gc_removes_the_go_mappings_of_containers_no_longer_valid(
    lab: Lab, iptables: str
) -> None:
    """Go pods 1 and 2 on NETWORK, one on OTHER; GC of NETWORK with pod 1 valid removes
    pod 2's jumps and chain only, and flushes the conntrack of its UDP mapping."""
    ext, conf = add_ext(lab), conflist(lab, plugins=("portmap",))
    bystander(lab, conf)  # ours before Go's: see bystander
    go = go_chain(lab, iptables)
    other = other_network(lab, conf)
    pod2, podm = lab.new_netns("gopod2"), lab.new_netns("gopodm")
    go.add(conf, lab.ctr, f"{PORT + 1}:80/tcp", container_id=GO_POD)
    address2 = address_of(
        go.add(conf, pod2, f"{PORT}:80/tcp", f"{PORT + 2}:53/udp", container_id="gopod2")
    )
    go.add(other, podm, f"{PORT + 3}:80/tcp", container_id="gopodm")
    save = f"{iptables}-save"
    chains = {cid: go_chain_name(cid) for cid in (GO_POD, "gopod2")}
    chains["gopodm"] = ("CNI-DN-" + sha512_hex((OTHER + "gopodm").encode()))[:28]
    before = lab.host.run(save, "-t", "nat")
    assert all(f":{c} " in before for c in chains.values()), before
    udp_flow(ext, HOST4, PORT + 2)
    assert f"dport={PORT + 2}" in conntrack_udp(lab.host, PORT + 2)

    go_gc(lab, GO_POD)

    after = lab.host.run(save, "-t", "nat")
    assert chains["gopod2"] not in after and "gopod2" not in after, after
    assert f":{chains[GO_POD]} " in after and f":{chains['gopodm']} " in after, after
    assert "gopod1" in after and "gopodm" in after, after  # their jumps' comments
    assert f"dport={PORT + 2}" not in conntrack_udp(lab.host, PORT + 2)
    with echo_server(lab.ctr, 80, "tcp", "go1"), echo_server(podm, 80, "tcp", "gom"):
        assert reaches(ext, HOST4, PORT + 1) == b"go1:ping"
        assert reaches(ext, HOST4, PORT + 3) == b"gom:ping"
    new_pod_gets_the_port(lab, ext, conf, address2)


# ---------------------------------------------------------------------------- ours -> Go


# The command of docs/differences.md "Taking over from the Go plugins", run once no pod we
# set up is left (the iptables backend's rules are Go's: Go's DEL removes them).
FORGET_OUR_MAPPINGS = "nft delete table inet cni_meta_portmap"


@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_go_del_of_our_pod_leaves_only_our_nftables_mappings_which_the_readme_removes(
    lab: Lab, backend: str
) -> None:
    ext = add_ext(lab)
    conf = conflist(lab)
    raw = json.loads(conf.read_text())
    raw["plugins"][1]["backend"] = backend
    conf.write_text(json.dumps(raw))
    result = lab.chain.add(conf, lab.ctr, f"{PORT}:80/tcp", container_id="ourpod",
                           bandwidth="10mbit", mac=MAC)  # fmt: skip
    address = address_of(result)

    go_chain(lab).delete(conf, lab.ctr, f"{PORT}:80/tcp", container_id="ourpod",
                         bandwidth="10mbit", mac=MAC)  # fmt: skip

    # Go's bandwidth deletes the ifb by its name (ours has the same), Go's tuning restores
    # from our backup file (same name, Go's keys) and removes it; Go's portmap removes
    # our iptables chain and jumps (Go's names), not our nftables table.
    left = leftovers(lab, "ourpod", address)
    assert not [x for x in left if x.startswith(("ip link", "tuning backup"))], left
    if backend == "iptables":
        assert left == []
    else:
        assert [x for x in left if x.startswith("nft:")], left
        lab.host.run("sh", "-c", FORGET_OUR_MAPPINGS)
        assert leftovers(lab, "ourpod", address) == []
    pod = lab.new_netns("gonew")
    go_chain(lab).add(conf, pod, f"{PORT}:80/tcp", container_id="gonew")
    with echo_server(pod, 80, "tcp", "gonew"):
        assert reaches(ext, HOST4, PORT) == b"gonew:ping"
    go_chain(lab).delete(conf, pod, f"{PORT}:80/tcp", container_id="gonew")

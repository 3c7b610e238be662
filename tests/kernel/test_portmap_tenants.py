"""One tenant of a shared node against another, on the real kernel in the lab's
namespaces (tests/fake/test_portmap_tenants.py runs the same cases on the fake):

* GC of a network whose name shares the 32-bit hash of another's leaves the other's pod
  forwarding (traffic);
* the runtime's second DEL, on a node whose other pods hold large ranges, asks the
  kernel one lookup in the owners set and reads nothing of theirs (the requests are
  counted, in a plugin run inside the lab's host netns);
* a DEL of our attachment of a container leaves the Go portmap's chain of a sibling
  attachment of the same container and network (Go's plugin from /usr/lib/cni), which
  keeps forwarding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.digest import sha512_hex
from common.identity import Attachment
from portmap.nft import owner_element
from tests.harness.lab import Lab, LabChain
from tests.harness.names import colliding_names
from tests.harness.netns import Netns
from tests.harness.plugins import GO_BIN, load_conflist, our, run_plugin
from tests.harness.portmap_world import HOST4, add_ext, comments
from tests.harness.traffic import echo_server, reaches

pytestmark = pytest.mark.root

VICTIM, ATTACKER = colliding_names()


def network(lab: Lab, name: str, bridge: str, subnet: str, **portmap: Any) -> Path:
    """conflists/portmap-ipv4.conflist as network `name` on its own bridge and subnet."""
    raw = json.loads(load_conflist("portmap-ipv4.conflist", lab.workdir).read_text())
    raw["name"] = name
    raw["plugins"][0]["bridge"] = bridge
    raw["plugins"][0]["ipam"]["ranges"] = [[{"subnet": subnet}]]
    raw["plugins"][1].update(portmap)
    out = lab.workdir / f"{name}.conflist"
    out.write_text(json.dumps(raw, indent=2))
    return out


def add(lab: Lab, conf: Path, ctr: Netns, cid: str, *ports: str, ifname: str = "eth0") -> Any:
    return lab.chain.add(conf, ctr, *ports, container_id=cid, ifname=ifname)


def address(result: Any) -> str:
    return str(result["ips"][0]["address"]).split("/")[0]


# ---------------------------------------------------------------------------- finding 1


def test_gc_of_a_network_leaves_a_pod_of_another_whose_name_hashes_alike(lab: Lab) -> None:
    ext = add_ext(lab)
    victim = network(lab, VICTIM, "cmpvic0", "10.89.30.0/24")
    attacker = network(lab, ATTACKER, "cmpatk0", "10.89.31.0/24")
    pod = lab.new_netns("atk")
    add(lab, victim, lab.ctr, "victim", "18080:80/tcp")
    add(lab, attacker, pod, "attacker", "18081:80/tcp")
    with echo_server(lab.ctr, 80, "tcp", "victim"), echo_server(pod, 80, "tcp", "attacker"):
        assert reaches(ext, HOST4, 18080) == b"victim:ping"
        assert reaches(ext, HOST4, 18081) == b"attacker:ping"

        gc = {"cniVersion": "1.1.0", "name": ATTACKER, "type": "portmap",
              "cni.dev/valid-attachments": []}  # fmt: skip
        run_plugin(our("portmap"), "GC", gc, host=lab.host, env=lab.env).ok()

        assert reaches(ext, HOST4, 18080) == b"victim:ping"
        assert reaches(ext, HOST4, 18081) is None
    left = comments(lab.host)
    assert any(c.startswith(Attachment(VICTIM, "victim", "eth0").tag) for c in left), left
    assert not any(c.startswith(Attachment(ATTACKER, "attacker", "eth0").tag) for c in left)


# ---------------------------------------------------------------------------- finding 4

# A plugin run in the lab's host netns (ip netns exec), handed a kernel port that counts
# what it asks: every libnftables command and every netlink lookup of an element.
COUNTING_DEL = """
import io, json, os, sys
from common.skel import Plugin, run
from portmap.kernel import Kernel, NftKernel, XtablesKernel

asked = []

class Context:
    def __init__(self, inner):
        self.inner = inner
    def set_json_output(self, on):
        self.inner.set_json_output(on)
    def run(self, text):
        asked.append("nft: " + text)
        return self.inner.run(text)

class Counting(NftKernel):
    def context(self):
        return Context(super().context())
    def may_have_element(self, table, set_name, key=None):
        found = super().may_have_element(table, set_name, key)
        asked.append(f"lookup {set_name} {key.hex() if key else '-'}: {found}")
        return found

kernel = Kernel()
kernel.nft = Counting()
kernel.xtables = XtablesKernel(kernel.nft)
env = {**os.environ, "CNI_COMMAND": "DEL", "CNI_CONTAINERID": sys.argv[2],
       "CNI_IFNAME": "eth0", "CNI_NETNS": "", "CNI_PATH": "/nonexistent"}
out = io.BytesIO()
code = run(Plugin("portmap"), environ=env, stdin=io.BytesIO(sys.argv[1].encode()),
           stdout=out, stderr=io.StringIO(), kernel=kernel)
print(json.dumps({"code": code, "out": out.getvalue().decode(), "asked": asked}))
"""


def counted_del(lab: Lab, conf: dict[str, Any], cid: str) -> list[str]:
    argv = ["ip", "netns", "exec", lab.host.name, sys.executable, "-c", COUNTING_DEL,
            json.dumps(conf), cid]  # fmt: skip
    proc = subprocess.run(argv, env={**os.environ, **lab.env}, capture_output=True, check=True)
    answer = json.loads(proc.stdout)
    assert (answer["code"], answer["out"]) == (0, ""), proc.stderr
    return list(answer["asked"])


def owner_key(network: str, cid: str) -> str:
    return owner_element(Attachment(network, cid, "eth0")).key.replace(":", "")


def test_a_del_without_a_record_asks_one_lookup_whatever_the_others_hold(lab: Lab) -> None:
    """Two pods hold 4096-port ranges. A pod's second DEL (its record went with the
    first), with a config without mappings or with them and its prevResult, makes two
    netlink lookups and no libnftables call. A pod whose record was lost while its
    mappings stayed is found through its key and removed; the ranges stay."""
    conf = network(lab, "cmp-dos", "cmpdos0", "10.89.32.0/24")
    for i in range(2):
        start = 20000 + 4096 * i
        add(lab, conf, lab.new_netns(f"big{i}"), f"big{i}", f"{start}-{start + 4095}:20000/tcp")
    result = add(lab, conf, lab.ctr, "second", "18080:80/tcp")
    lab.chain.delete(conf, lab.ctr, "18080:80/tcp", container_id="second")
    before = comments(lab.host)
    assert len(before) > 2 * 4096
    plain = {"cniVersion": "1.1.0", "name": "cmp-dos", "type": "portmap"}
    mappings = {"portMappings": [{"hostPort": 18080, "containerPort": 80}]}
    full = {**plain, "prevResult": result, "runtimeConfig": mappings}
    absent = f"lookup owners {owner_key('cmp-dos', 'second')}: False"

    for second_del in (plain, full):
        assert counted_del(lab, second_del, "second") == [absent, "lookup owners -: True"]
    assert comments(lab.host) == before

    lost = lab.new_netns("lost")
    add(lab, conf, lost, "lost", "18081:80/tcp")
    tag = Attachment("cmp-dos", "lost", "eth0").tag
    (lab.state_root / "portmap" / f"{tag}.json").unlink()
    asked = counted_del(lab, plain, "lost")
    assert asked[0] == f"lookup owners {owner_key('cmp-dos', 'lost')}: True", asked
    assert comments(lab.host) == before


# ---------------------------------------------------------------------------- finding 9


def test_our_del_leaves_the_go_chain_of_a_sibling_attachment(lab: Lab) -> None:
    """The Go portmap ADDs sib/eth0, ours sib/eth1 on the same network (the same Go
    chain name): both DELs of eth1 leave eth0's chain, which keeps forwarding."""
    ext = add_ext(lab)
    conf = network(lab, "cmp-sib", "cmpsib0", "10.89.33.0/24")
    LabChain(lab, [GO_BIN]).add(conf, lab.ctr, "18080:80/tcp", container_id="sib")
    add(lab, conf, lab.ctr, "sib", "18081:80/tcp", ifname="eth1")
    chain = ("CNI-DN-" + sha512_hex(b"cmp-sib" + b"sib"))[:28]
    assert f":{chain} " in lab.host.run("iptables-save", "-t", "nat")

    for _ in range(2):
        lab.chain.delete(conf, lab.ctr, "18081:80/tcp", container_id="sib", ifname="eth1")

    assert f":{chain} " in lab.host.run("iptables-save", "-t", "nat")
    with echo_server(lab.ctr, 80, "tcp", "eth0"):
        assert reaches(ext, HOST4, 18080) == b"eth0:ping"
        assert reaches(ext, HOST4, 18081) is None


def test_our_del_leaves_the_go_nftables_rules_of_a_sibling_attachment(lab: Lab) -> None:
    """The Go portmap 1.6+ with `backend: nftables` (no such binary here: its rules as
    plugins/meta/portmap/portmap_nftables.go writes them) set up sib/eth0; ours is
    sib/eth1. Its DELs, with eth1's prevResult and without, leave eth0's rules; a DEL of
    eth0 with its own prevResult removes them."""
    conf = network(lab, "cmp-sibn", "cmpsibn0", "10.89.34.0/24")
    result = add(lab, conf, lab.ctr, "sib", "18081:80/tcp", ifname="eth1")
    eth0 = "10.89.34.250"
    assert address(result) != eth0
    t = "ip cni_hostport"
    rules = f"""
add table {t}
add chain {t} hostports
add chain {t} masquerading {{ type nat hook postrouting priority srcnat ; }}
add rule {t} hostports tcp dport 18080 dnat to {eth0}:80 comment "sib"
add rule {t} masquerading ip saddr {eth0} ip daddr {eth0} masquerade comment "sib"
"""
    path = lab.workdir / "go-sib.nft"
    path.write_text(rules)
    lab.host.run("nft", "-f", str(path))
    before = lab.host.run("nft", "list", "table", *t.split())

    for _ in range(2):
        lab.chain.delete(conf, lab.ctr, "18081:80/tcp", container_id="sib", ifname="eth1")

    assert lab.host.run("nft", "list", "table", *t.split()) == before
    prev = {"cniVersion": "1.1.0", "ips": [{"address": f"{eth0}/24"}]}
    del_eth0 = {"cniVersion": "1.1.0", "name": "cmp-sibn", "type": "portmap", "prevResult": prev}
    run_plugin(our("portmap"), "DEL", del_eth0, host=lab.host, container_id="sib",
               env=lab.env).ok()  # fmt: skip
    assert '"sib"' not in lab.host.run("nft", "list", "table", *t.split())

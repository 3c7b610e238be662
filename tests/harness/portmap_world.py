"""A small world for portmap's kernel tests, inside the lab's namespaces.

    ext (another host) --veth-- host --bridge (Go bridge + host-local)-- ctr, sib

* the host has 192.168.77.1/24 + fd77::1/64 on the veth to `ext` (and 192.168.78.1 as a
  second local address), `ext` routes everything through it;
* containers get their addresses from the conflist run through cnichain in the host netns,
  so portmap is chained after the Go bridge exactly as a runtime would run it.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnichain import ChainError
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import load_conflist

HOST4 = "192.168.77.1"
HOST4B = "192.168.78.1"  # a second local address of the host
EXT4 = "192.168.77.2"
HOST6 = "fd77::1"
EXT6 = "fd77::2"
TABLE = "inet cni_meta_portmap"


def conflist(lab: Lab, name: str, **portmap_keys: Any) -> Path:
    """conflists/<name> with the portmap entry's keys overridden (backend, snat, ...)."""
    path = load_conflist(name, lab.workdir)
    raw = json.loads(path.read_text())
    for plugin in raw["plugins"]:
        if plugin["type"] == "portmap":
            plugin.update(portmap_keys)
    out = lab.workdir / f"{len(list(lab.workdir.glob('*.conflist')))}-{name}"
    out.write_text(json.dumps(raw, indent=2))
    return out


def add_ext(lab: Lab) -> Netns:
    """Another host, routed to the lab host over a veth."""
    ext = lab.new_netns("ext")
    lab.host.ip("link", "add", "vext", "type", "veth", "peer", "name", "eth0", "netns", ext.name)
    lab.host.ip("addr", "add", f"{HOST4}/24", "dev", "vext")
    lab.host.ip("addr", "add", f"{HOST4B}/24", "dev", "vext")
    lab.host.ip("addr", "add", f"{HOST6}/64", "dev", "vext", "nodad")
    lab.host.ip("link", "set", "vext", "up")
    ext.ip("addr", "add", f"{EXT4}/24", "dev", "eth0")
    ext.ip("addr", "add", f"{EXT6}/64", "dev", "eth0", "nodad")
    ext.ip("link", "set", "eth0", "up")
    ext.ip("route", "add", "default", "via", HOST4)
    ext.ip("-6", "route", "add", "default", "via", HOST6)
    return ext


@dataclass
class World:
    lab: Lab
    ext: Netns
    conflist: Path
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def attach(self, ctr: Netns, *port_specs: str, check: bool = True) -> dict[str, Any]:
        """ADD `ctr` with the mappings; with `check` false, a refused ADD's error as
        {"error": text}."""
        try:
            result = self.lab.chain.add(self.conflist, ctr, *port_specs)
        except ChainError as e:
            if check:
                raise
            return {"error": str(e)}
        self.results[ctr.name] = result
        return dict(result)

    def detach(self, ctr: Netns) -> None:
        self.lab.chain.delete(self.conflist, ctr)

    def ip(self, ctr: Netns, family: int = 4) -> str:
        for ipc in self.results[ctr.name]["ips"]:
            addr = str(ipc["address"]).split("/")[0]
            if (":" in addr) == (family == 6):
                return addr
        raise AssertionError(f"{ctr.name} has no IPv{family} address")

    def gateway(self, family: int = 4) -> str:
        for result in self.results.values():
            for ipc in result["ips"]:
                gw = str(ipc.get("gateway", ""))
                if gw and (":" in gw) == (family == 6):
                    return gw
        raise AssertionError("no gateway")


def make_world(lab: Lab, name: str = "portmap-ipv4.conflist", **portmap_keys: Any) -> World:
    return World(lab, add_ext(lab), conflist(lab, name, **portmap_keys))


def nft_elements(ns: Netns) -> dict[str, list[Any]]:
    """set/map name -> its elements, read back with the nft CLI (not our parser)."""
    out = ns.run("nft", "-j", "list", "table", *TABLE.split(), check=False)
    if not out.strip():
        return {}
    sets: dict[str, list[Any]] = {}
    for obj in json.loads(out)["nftables"]:
        body = obj.get("set") or obj.get("map")
        if body:
            sets[body["name"]] = body.get("elem", [])
    return sets


def comments(ns: Netns) -> list[str]:
    found = []
    for elems in nft_elements(ns).values():
        for item in elems:
            item = item[0] if isinstance(item, list) else item
            if isinstance(item, dict) and "elem" in item:
                found.append(str(item["elem"].get("comment", "")))
    return found


def udp_flow(src: Netns, dst: str, port: int) -> None:
    """Send one UDP datagram (creates a conntrack entry even if nobody answers)."""
    fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with src.entered():
        s = socket.socket(fam, socket.SOCK_DGRAM)
    with s:
        s.sendto(b"x", (dst, port))


def conntrack_udp(ns: Netns, port: int, family: int = 4) -> str:
    return ns.run(
        "conntrack", "-L", "-f", "ipv6" if family == 6 else "ipv4", "-p", "udp",
        "--orig-port-dst", str(port), check=False,
    )  # fmt: skip

"""tuning's world on a real kernel: a veth into the lab's container, our tuning run on
it, and the link and sysctls read back with `ip -j` and /proc/sys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import PluginRun, our, run_plugin

TUNING = our("tuning")
MAC = "02:42:0a:59:00:07"
PER_IF = "net.ipv4.conf.IFNAME.accept_redirects"
NS_WIDE = "net.ipv4.ip_unprivileged_port_start"
SOMAXCONN = "net.core.somaxconn"


def make_veth(lab: Lab, ctr: Netns | None = None, ifname: str = "eth0") -> None:
    """A veth pair: the host end in lab.host, the other end in the container as `ifname`."""
    ctr = ctr or lab.ctr
    host_end = "vh" + ctr.name[-8:]
    lab.host.ip("link", "add", host_end, "type", "veth", "peer", "name", ifname, "netns", ctr.name)
    lab.host.ip("link", "set", host_end, "up")
    ctr.ip("link", "set", ifname, "up")


def config(
    lab: Lab, ctr: Netns | None = None, version: str = "1.0.0", **keys: Any
) -> dict[str, Any]:
    ctr = ctr or lab.ctr
    prev = {
        "cniVersion": version,
        "interfaces": [
            {"name": "vhost", "mac": "aa:bb:cc:00:00:01"},
            {"name": "eth0", "mac": "aa:bb:cc:00:00:02", "sandbox": ctr.path},
        ],
        "ips": [{"address": "10.99.0.2/24", "interface": 1}],
    }
    return {"cniVersion": version, "name": "tunenet", "type": "tuning", "prevResult": prev, **keys}


def run(lab: Lab, command: str, conf: Any, ctr: Netns | None = None, **kw: Any) -> PluginRun:
    exe = kw.pop("exe", TUNING)
    env = {**lab.env, **kw.pop("env", {})}
    return run_plugin(exe, command, conf, host=lab.host, netns=(ctr or lab.ctr).path, env=env, **kw)


def link(ns: Netns, ifname: str = "eth0") -> dict[str, Any]:
    info = json.loads(ns.ip("-j", "-d", "link", "show", ifname))[0]
    return {
        "mac": info["address"],
        "mtu": info["mtu"],
        "promisc": info.get("promiscuity", 0) > 0 or "PROMISC" in info["flags"],
        "allmulti": "ALLMULTI" in info["flags"],
        "txqlen": info.get("txqlen"),
    }


def sysctl(ns: Netns, key: str, ifname: str = "eth0") -> str:
    return ns.sysctl(key.replace("IFNAME", ifname))


def live(ns: Netns, *keys: str) -> dict[str, Any]:
    """Everything tuning may change, as the kernel reports it."""
    return {"link": link(ns), **{k: sysctl(ns, k) for k in keys}}


def backup_file(lab: Lab, cid: str = "ctr1", ifname: str = "eth0") -> Path:
    return lab.state_root / "tuning" / f"{cid}_{ifname}.json"


def failed(p: PluginRun, code: int) -> dict[str, Any]:
    assert p.returncode != 0, p.stdout
    err: dict[str, Any] = p.json
    assert err["code"] == code, err
    assert err["cniVersion"]
    return err


EVERYTHING: dict[str, Any] = {
    "mac": MAC,
    "mtu": 1400,
    "promisc": True,
    "allmulti": True,
    "txQLen": 77,
    "sysctl": {PER_IF: "0", NS_WIDE: "80", SOMAXCONN: "1234"},
}

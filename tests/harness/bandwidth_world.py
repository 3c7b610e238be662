"""bandwidth's world on a real kernel: an attachment made by the Go bridge + host-local
and our bandwidth through cnichain's API (conflists/bandwidth.conflist), and the kernel read
back with `tc -j` / `ip -j`, never from the plugin's own report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cnichain.runner import parse_bandwidth
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import PluginRun, container_address, load_conflist, our, run_plugin

BANDWIDTH = our("bandwidth")
NETWORK = "bwnet"  # the name in conflists/bandwidth.conflist
GATEWAY = "10.88.7.1"  # the bridge's address in that list
SECONDS = 2.5


def tc_json(ns: Netns, *args: str) -> list[dict[str, Any]]:
    out = ns.run("tc", "-j", *args)
    return json.loads(out) if out.strip() else []


def qdiscs(ns: Netns, dev: str) -> list[dict[str, Any]]:
    return [q for q in tc_json(ns, "qdisc", "show", "dev", dev) if q["kind"] != "noqueue"]


def root_tbf(ns: Netns, dev: str) -> dict[str, Any] | None:
    return next((q for q in qdiscs(ns, dev) if q["kind"] == "tbf" and q.get("root")), None)


def redirect_targets(ns: Netns, dev: str) -> list[str]:
    out = []
    for f in tc_json(ns, "filter", "show", "dev", dev, "ingress"):
        for action in f.get("options", {}).get("actions", []):
            if action.get("kind") == "mirred" and action.get("mirred_action") == "redirect":
                out.append(action["to_dev"])
    return out


def links(ns: Netns, kind: str = "ifb") -> dict[str, dict[str, Any]]:
    return {x["ifname"]: x for x in json.loads(ns.ip("-j", "-d", "link", "show", "type", kind))}


@dataclass
class Attachment:
    lab: Lab
    ctr: Netns
    container_id: str
    bandwidth: dict[str, int]
    result: dict[str, Any]
    conflist: Path

    @property
    def host_veth(self) -> str:
        return next(
            str(i["name"])
            for i in self.result["interfaces"]
            if i["name"].startswith("veth") and "sandbox" not in i
        )

    @property
    def ifb(self) -> str:
        names = [str(i["name"]) for i in self.result["interfaces"]]
        return next(n for n in names if n.startswith("bwp"))

    @property
    def ip(self) -> str:
        return container_address(self.result)

    def conf(self, version: str = "1.0.0", **overrides: Any) -> dict[str, Any]:
        """Our plugin's config as libcni builds it from the list (for direct calls)."""
        conf: dict[str, Any] = {
            "cniVersion": version,
            "name": NETWORK,
            "type": "bandwidth",
            "capabilities": {"bandwidth": True},
            "runtimeConfig": {"bandwidth": self.bandwidth},
            "prevResult": self.result,
        }
        conf.update(overrides)
        return conf

    def run(self, command: str, conf: dict[str, Any] | None = None, **kw: Any) -> PluginRun:
        return run_plugin(
            BANDWIDTH,
            command,
            conf if conf is not None else self.conf(),
            host=self.lab.host,
            container_id=self.container_id,
            netns=kw.pop("netns", self.ctr.path),
            env=self.lab.env,
            **kw,
        )


def attach(lab: Lab, spec: str, ctr: Netns | None = None, cid: str = "ctr1") -> Attachment:
    ctr = ctr or lab.ctr
    conflist = load_conflist("bandwidth.conflist", lab.workdir)
    rates = parse_bandwidth(spec)  # cni-chain's --bandwidth
    result = lab.network(conflist).add(cid, ctr.path, capability_args={"bandwidth": rates})
    return Attachment(lab, ctr, cid, rates, result, conflist)


def rate_spec(bits: int) -> str:
    return f"ingressRate={bits},egressRate={bits}"


def small_send_buffers(*namespaces: Netns) -> None:
    """Cap TCP send buffers (per netns): what a sender has queued when the measurement
    ends still drains at the shaped rate, which at 1 Mbit/s would take seconds."""
    for ns in namespaces:
        ns.sysctl("net.ipv4.tcp_wmem", "4096 16384 65536")


def assert_shaped(measured: float, configured: int, direction: str) -> None:
    ratio = measured / configured
    assert 0.5 <= ratio <= 1.10, (
        f"container {direction}: {measured / 1e6:.3f} Mbit/s measured for "
        f"{configured / 1e6:.3f} Mbit/s configured ({ratio:.2%})"
    )


def assert_clean(lab: Lab, host_veth: str | None = None) -> None:
    assert links(lab.host) == {}, "an ifb was left behind"
    if host_veth is not None and lab.host.ip("link", "show", host_veth, check=False):
        assert qdiscs(lab.host, host_veth) == []

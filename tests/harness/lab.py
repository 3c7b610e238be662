"""The lab every kernel test works in, and what such tests must leave as they found it.

A `Lab` is cnichain's `ChainLab` (what the project's pytest plugin hands its users): a
fresh "host" netns where the plugins run, a "container" netns, a private state root and
cache dir (tests/conftest.py's `lab` fixture makes one and removes it all, also when the
test fails). Its `chain` runs a conflist through the same API, with cni-chain's
conveniences; `cli` is the `cni-chain` command line itself, for the tests of the command.
`host_snapshot` is what no test may change on the machine itself: the session compares it
before and after, and the crash tests between trials.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cnichain import ChainLab, ConfList, Network
from cnichain.api import derived_container_id
from cnichain.runner import capability_args
from tests.harness import snapshot as snap
from tests.harness.netns import Netns
from tests.harness.plugins import GO_BIN, OUR_BIN, Chain

# The machine's own state dirs: the plugins' defaults (/run/cni/meta-plugins,
# /run/cni/tuning) and the runtimes' (/var/lib/cni: host-local leases, libcni and
# cni-chain caches). Tests use private ones; any change here is a leak. Lock files count
# too: no test may even lock there.
MACHINE_STATE_DIRS = ("/run/cni", "/var/lib/cni")


def host_snapshot() -> snap.Snapshot:
    """What tests must never change: the machine's own namespace (nft ruleset, legacy
    iptables tables of both families, links, qdiscs and filters, forwarding/route_localnet
    and the other watched sysctls) and its state dirs.

    Named namespaces are not in it: other software on the machine (a runtime, another
    test session) makes and removes its own while the tests run. The namespaces the tests
    make are judged by name instead (conftest's `host_untouched`: each process knows the
    ones it made)."""
    return {
        **snap.netns_snapshot(None),
        **snap.state_snapshot(MACHINE_STATE_DIRS),
    }


class Lab(ChainLab):
    """A ChainLab whose namespaces are the harness's (cmpt-*, judged by the session's leak
    check) and whose plugins are ours, then the Go ones."""

    host: Netns
    ctr: Netns

    def __init__(self, make_netns: Callable[[str], Netns], workdir: Path) -> None:
        super().__init__(make_netns, workdir)
        self.env["CNI_META_LOCK_TIMEOUT"] = "20"

    @property
    def chain(self) -> LabChain:
        """Chains run through the API, described as cni-chain's flags describe them."""
        return LabChain(self)

    @property
    def cli(self) -> Chain:
        """The `cni-chain` command line in this lab (for tests of the command line)."""
        return Chain(self.host, self.workdir, env=self.env)

    def network(
        self,
        conflist: ConfList | Mapping[str, Any] | str | os.PathLike[str],
        plugin_path: Sequence[str | os.PathLike[str]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Network:
        """ChainLab's, with our plugins then Go's unless `plugin_path` says otherwise."""
        dirs = [OUR_BIN, GO_BIN] if plugin_path is None else plugin_path
        return super().network(conflist, dirs, env)

    def new_netns(self, role: str) -> Netns:
        """`container(role)`, typed as the harness's namespaces (make_netns makes them)."""
        ns = self.container(role)
        assert isinstance(ns, Netns)
        return ns


@dataclass
class LabChain:
    """A conflist's ADD, CHECK and DEL through `lab.network` (cnichain.Network), with
    cni-chain's conveniences: port mappings as `--port` specs ("[HOSTIP:]HOST[-END]:CTR[/PROTO]"),
    `bandwidth` as `--bandwidth` reads it, `mac`, and without `container_id` the one
    cni-chain derives from the netns path. A failing plugin raises PluginError."""

    lab: Lab
    plugin_path: Sequence[Path] | None = None  # default: ours, then Go's
    env: dict[str, str] = field(default_factory=dict)  # over the lab's

    def _call(
        self, ctr: Netns | None, ports: Sequence[str], container_id: str, bandwidth: str, mac: str
    ) -> tuple[str, str, dict[str, Any]]:
        netns = ctr.path if ctr else ""
        caps = capability_args(ports, bandwidth, mac)
        return container_id or derived_container_id(netns), netns, caps

    def network(self, conflist: Path) -> Network:
        return self.lab.network(conflist, self.plugin_path, self.env)

    def add(
        self,
        conflist: Path,
        ctr: Netns,
        *ports: str,
        container_id: str = "",
        ifname: str = "eth0",
        bandwidth: str = "",
        mac: str = "",
    ) -> dict[str, Any]:
        cid, netns, caps = self._call(ctr, ports, container_id, bandwidth, mac)
        return self.network(conflist).add(cid, netns, ifname, capability_args=caps)

    def check(
        self,
        conflist: Path,
        ctr: Netns,
        *ports: str,
        container_id: str = "",
        ifname: str = "eth0",
        bandwidth: str = "",
        mac: str = "",
    ) -> None:
        cid, netns, caps = self._call(ctr, ports, container_id, bandwidth, mac)
        self.network(conflist).check(cid, netns, ifname, capability_args=caps)

    def delete(
        self,
        conflist: Path,
        ctr: Netns | None,
        *ports: str,
        container_id: str = "",
        ifname: str = "eth0",
        bandwidth: str = "",
        mac: str = "",
    ) -> None:
        cid, netns, caps = self._call(ctr, ports, container_id, bandwidth, mac)
        self.network(conflist).delete(cid, netns, ifname, capability_args=caps)

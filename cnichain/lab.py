"""ChainLab: what the `cni_chain` fixture hands a test (cnichain.pytest_plugin), usable
without pytest too.

A host namespace where the plugins run, container namespaces, and private state, log and
cache dirs, so that nothing a test does lands in the machine's own namespace, /run/cni or
/var/lib/cni.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cnichain.api import Attachment, ChainError, ConfList, Network, load_conflist
from cnichain.netns import Netns

__all__ = ["ChainLab"]

# IPAM types that keep leases in a dataDir (default /var/lib/cni/networks, the machine's)
LEASE_IPAMS = ("host-local", "flatnet-ipam")


class ChainLab:
    """A host namespace to run plugins in, containers to attach, and private dirs.

    `env` is given to every plugin: CNI_META_STATE_ROOT and CNI_META_LOG_FILE point into
    `workdir`, so the meta-plugins keep their state there (other plugins ignore them).
    """

    def __init__(self, make_netns: Callable[..., Netns], workdir: Path) -> None:
        self._make_netns = make_netns
        self.workdir = workdir
        self.host = make_netns("host")
        self.host.sysctl("net.ipv4.ip_forward", "1")
        self.host.sysctl("net.ipv6.conf.all.forwarding", "1")
        self.ctr = make_netns("ctr")
        self.env: dict[str, str] = {
            "CNI_META_STATE_ROOT": str(workdir / "state"),
            "CNI_META_LOG_FILE": str(workdir / "plugins.log"),
        }
        self.attached: list[Attachment] = []
        self._count = 0

    @property
    def state_root(self) -> Path:
        return Path(self.env["CNI_META_STATE_ROOT"])

    def container(self, role: str = "ctr") -> Netns:
        """Another container namespace (deleted after the test)."""
        return self._make_netns(role)

    def network(
        self,
        conflist: ConfList | Mapping[str, Any] | str | os.PathLike[str],
        plugin_path: Sequence[str | os.PathLike[str]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Network:
        """Bind a list (dict, file or ConfList) to this lab: plugins run in `host`,
        results are cached in `workdir`, and host-local and flatnet-ipam keep their
        leases in `workdir` unless the list sets its own dataDir. `plugin_path`:
        default_plugin_path(). `env` is added to the lab's `env` for this network's
        plugins (e.g. a PATH that finds other tools)."""
        parsed = conflist if isinstance(conflist, ConfList) else load_conflist(conflist)
        plugins = json.loads(json.dumps(parsed.plugins))  # a copy: the caller's list stays
        for plugin in plugins:
            ipam = plugin.get("ipam")
            if isinstance(ipam, dict) and ipam.get("type") in LEASE_IPAMS:
                ipam.setdefault("dataDir", str(self.workdir / "host-local"))
        own = parsed.replace(plugins=plugins)
        return Network(
            own,
            plugin_path,
            cache_dir=self.workdir / "cache",
            host=self.host.name,
            env={**self.env, **(env or {})},
        )

    def attach(
        self,
        network: Network,
        ctr: Netns | None = None,
        *,
        container_id: str | None = None,
        ifname: str = "eth0",
        capability_args: Mapping[str, Any] | None = None,
        cni_args: str = "",
    ) -> Attachment:
        """ADD `ctr` (default: the lab's container) to `network` now and return the
        attachment, as `Network.attach` does: `with` it to DEL when the block ends,
        `detach` it to DEL now; else it is DELeted after the test. Raises PluginError
        when ADD fails (what it left behind is DELeted after the test)."""
        ctr = ctr or self.ctr
        if container_id is None:
            self._count += 1
            container_id = f"{ctr.name}-{self._count}"
        caps = dict(capability_args or {})
        try:
            result = network.add(
                container_id, ctr.path, ifname, capability_args=caps, cni_args=cni_args
            )
        except BaseException:
            failed = Attachment(network, container_id, ctr.path, ifname, {}, caps, cni_args)
            self.attached.append(failed)
            raise
        att = Attachment(network, container_id, ctr.path, ifname, result, caps, cni_args)
        self.attached.append(att)
        return att

    def detach(self, att: Attachment) -> None:
        """DEL the attachment now."""
        att.delete()
        if att in self.attached:
            self.attached.remove(att)

    def teardown(self) -> list[str]:
        """DEL what is still attached (in reverse order); what went wrong, as text."""
        problems = []
        while self.attached:
            att = self.attached.pop()
            try:
                att.delete()
            except ChainError as e:
                problems.append(f"DEL of {att.container_id} failed: {e}")
        if not problems and self.state_root.exists():
            kept = sorted(
                str(p.relative_to(self.state_root))
                for p in self.state_root.rglob("*")
                if p.is_file() and not _is_lock(p.name)
            )
            if kept:
                problems.append(f"state files left after DEL: {kept}")
        return problems


def _is_lock(name: str) -> bool:
    """Lock files stay by design (removing one would race with its next user)."""
    return name == "lock" or name.endswith(".lock")

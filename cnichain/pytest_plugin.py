"""pytest fixtures that run real CNI chains in throwaway network namespaces.

Installed with the package and loaded by pytest on its own (the `pytest11` entry point).
Tests that use the fixtures need root; they never touch the machine's own namespace: the
plugins run inside a throwaway "host" namespace and the containers are others.

* `cni_netns` - a factory: `cni_netns("role")` makes a namespace that is deleted after the
  test.
* `cni_chain` - a `ChainLab`: a host namespace (IP forwarding on), a container namespace,
  private state, log and cache dirs, `network(conflist)` to bind a list to them and
  `attach(network)` to ADD a container; every attachment still up is DELeted afterwards.
* `cni_netns_prefix` - the namespaces' name prefix ("cnit"); override it in a conftest.py.

Cleanup runs after failing tests too. What cleanup cannot remove is not hidden: a DEL that
fails, a state file our plugins keep after DEL, or a namespace that still exists after
teardown makes the test end in an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cnichain.api import Attachment, ChainError, ConfList, Network, load_conflist
from cnichain.netns import DEFAULT_PREFIX, Netns, create, delete

# IPAM types that keep leases in a dataDir (default /var/lib/cni/networks, the machine's)
LEASE_IPAMS = ("host-local", "flatnet-ipam")

__all__ = ["ChainLab"]


@pytest.fixture
def cni_netns_prefix() -> str:
    """The prefix of the names of the namespaces the fixtures make."""
    return DEFAULT_PREFIX


@pytest.fixture
def cni_netns(cni_netns_prefix: str) -> Iterator[Callable[..., Netns]]:
    """`cni_netns(role="ns")` makes a throwaway namespace; all are deleted afterwards
    and the test errors if one is still there."""
    made: list[Netns] = []

    def make(role: str = "ns") -> Netns:
        ns = create(role, cni_netns_prefix)
        made.append(ns)
        return ns

    yield make
    for ns in made:
        delete(ns)
    left = [ns.name for ns in made if ns.exists()]
    if left:
        pytest.fail(f"network namespaces left behind: {left}", pytrace=False)


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
        plugin_path: list[str] | None = None,
    ) -> Network:
        """Bind a list (dict, file or ConfList) to this lab: plugins run in `host`,
        results are cached in `workdir`, and host-local and flatnet-ipam keep their
        leases in `workdir` unless the list sets its own dataDir. `plugin_path`:
        default_plugin_path()."""
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
            env=self.env,
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
        """ADD `ctr` (default: the lab's container) to `network`; DELeted after the test
        unless the test deletes it first (`detach`). Raises PluginError when ADD fails
        (what it left behind is DELeted after the test as well)."""
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
            self.attached.append(Attachment(network, container_id, ctr.path, ifname, {}))
            raise
        att = Attachment(network, container_id, ctr.path, ifname, result)
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


@pytest.fixture
def cni_chain(cni_netns: Callable[..., Netns], tmp_path: Path) -> Iterator[ChainLab]:
    """A ChainLab; its attachments are DELeted after the test and its namespaces deleted
    (by `cni_netns`). A DEL that fails or a leftover state file makes the test error."""
    workdir = tmp_path / "cni"
    workdir.mkdir()
    lab = ChainLab(cni_netns, workdir)
    yield lab
    problems = lab.teardown()
    if problems:
        pytest.fail("cni_chain cleanup:\n" + "\n".join(problems), pytrace=False)

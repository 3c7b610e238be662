"""The lab every kernel test works in, and what such tests must leave as they found it.

A `Lab` is a fresh "host" netns where the plugins run, a "container" netns, a private
state root and cache dir (tests/conftest.py's `lab` fixture makes one and removes it all,
also when the test fails). `host_snapshot` is what no test may change on the machine
itself: the session compares it before and after, and the crash tests between trials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cnichain import Network
from tests.harness import netns as nslib
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


@dataclass
class Lab:
    host: Netns
    ctr: Netns
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    extra: list[Netns] = field(default_factory=list)

    @property
    def chain(self) -> Chain:
        """The `cni-chain` command line in this lab (for tests of the command line)."""
        return Chain(self.host, self.workdir, env=self.env)

    def network(self, conflist: Path) -> Network:
        """`conflist` run through the API users call (cnichain.Network) in this lab: the
        plugins in `host` (ours, then Go's), the results cached where `chain` keeps them."""
        return Network(conflist, [OUR_BIN, GO_BIN], cache_dir=self.workdir / "cache",
                       host=self.host.name, env=self.env)  # fmt: skip

    @property
    def state_root(self) -> Path:
        return Path(self.env["CNI_META_STATE_ROOT"])

    def new_netns(self, role: str) -> Netns:
        ns = nslib.create(role)
        self.extra.append(ns)
        return ns

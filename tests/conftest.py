"""Fixtures shared by all tests.

Kernel tests (marked `root`) get a `lab`: a fresh "host" netns where the plugins run, a
"container" netns, a private state root and cache dir, all removed afterwards even when
the test fails. The session ends by checking that the machine's own namespace and state
dirs are exactly as they were found (`host_untouched`; what is compared: host_snapshot).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cnichain import netns as api_netns
from tests.harness import netns as nslib
from tests.harness import snapshot as snap
from tests.harness.netns import Netns
from tests.harness.plugins import Chain

IS_ROOT = os.geteuid() == 0

# The machines are shared and noisy: generation speed and per-example time are not what
# the property tests are about.
settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile(
    "fuzz", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=10_000
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (creates network namespaces)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


# The machine's own state dirs: the plugins' defaults (/run/cni/meta-plugins,
# /run/cni/tuning) and the runtimes' (/var/lib/cni: host-local leases, libcni and
# cni-chain caches). Tests use private ones; any change here is a leak. Lock files count
# too: no test may even lock there.
MACHINE_STATE_DIRS = ("/run/cni", "/var/lib/cni")


# Named namespaces of tests (cmpt-*: each process judges its own, see
# nslib.leftover_namespaces; cnit-*: cnichain's fixtures in the pytest sessions that
# tests/kernel/test_chain_pytest_plugin.py and tests/kernel/test_examples_wheel.py start, which check
# their own) and of benchmarks (cmpb-*), which may run beside a test session on a
# developer's machine.
OWN_NETNS_PREFIXES = (nslib.PREFIX + "-", api_netns.DEFAULT_PREFIX + "-", "cmpb-")


def _other_netns() -> str:
    """Named namespaces that are neither tests' nor benchmarks': none may appear or vanish."""
    try:
        names = os.listdir("/run/netns")
    except FileNotFoundError:
        return ""
    return "\n".join(sorted(n for n in names if not n.startswith(OWN_NETNS_PREFIXES)))


def host_snapshot() -> snap.Snapshot:
    """What tests must never change: the machine's own namespace (nft ruleset, legacy
    iptables tables of both families, links, qdiscs and filters, forwarding/route_localnet
    and the other watched sysctls), its state dirs and its named namespaces."""
    return {
        **snap.netns_snapshot(None),
        **snap.state_snapshot(MACHINE_STATE_DIRS),
        "named netns (not test-made)": _other_netns(),
    }


@pytest.fixture(scope="session", autouse=True)
def host_untouched() -> Iterator[None]:
    """The session fails when it leaves the machine different from how it found it."""
    if not IS_ROOT:
        yield
        return
    before = host_snapshot()
    yield
    changes = snap.diff(before, host_snapshot())
    # each xdist worker judges its own (the harness's and cnichain's fixtures')
    leftovers = nslib.leftover_namespaces() + api_netns.leftovers()
    assert not changes, "tests changed the machine's own namespace/state:\n" + snap.describe(
        changes
    )
    assert not leftovers, f"tests left network namespaces behind: {leftovers}"


@pytest.fixture
def cni_netns_prefix() -> str:
    """cnichain's fixtures (tests/kernel/test_chain.py) name their namespaces like the harness:
    the session's checks (host_untouched) know cmpt-* as tests' own."""
    return nslib.PREFIX


@dataclass
class Lab:
    host: Netns
    ctr: Netns
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    extra: list[Netns] = field(default_factory=list)

    @property
    def chain(self) -> Chain:
        return Chain(self.host, self.workdir, env=self.env)

    @property
    def state_root(self) -> Path:
        return Path(self.env["CNI_META_STATE_ROOT"])

    def new_netns(self, role: str) -> Netns:
        ns = nslib.create(role)
        self.extra.append(ns)
        return ns


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with nslib.namespaces("host", "ctr") as (host, ctr):
        host.sysctl("net.ipv4.ip_forward", "1")
        host.sysctl("net.ipv6.conf.all.forwarding", "1")
        env = {
            "CNI_META_STATE_ROOT": str(tmp_path / "state"),
            "CNI_META_LOG_FILE": str(tmp_path / "plugins.log"),
            "CNI_META_LOCK_TIMEOUT": "20",
        }
        lab = Lab(host, ctr, tmp_path, env)
        try:
            yield lab
        finally:
            for ns in lab.extra:
                nslib.delete(ns)

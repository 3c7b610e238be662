"""Fixtures shared by all tests.

Kernel tests (marked `root`) get a `lab`: a fresh "host" netns where the plugins run, a
"container" netns, a private state root and cache dir, all removed afterwards even when
the test fails. The session ends by checking that the machine's own namespace and state
dirs are exactly as they were found.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.harness import netns as nslib
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


def _host_snapshot() -> dict[str, str]:
    """What tests must never change in the machine's own namespace and state dirs."""

    def out(*argv: str) -> str:
        p = subprocess.run(argv, capture_output=True, text=True, check=False)
        return p.stdout

    state = "/run/cni/meta-plugins"
    return {
        "nft tables": out("nft", "list", "tables"),
        "iptables nat chains": "\n".join(
            line for line in out("iptables-save", "-t", "nat").splitlines() if line.startswith(":")
        ),
        "links": "\n".join(
            sorted(line.split(":")[1] for line in out("ip", "-o", "link").splitlines())
        ),
        "state dir": "\n".join(sorted(os.listdir(state))) if os.path.isdir(state) else "",
    }


@pytest.fixture(scope="session", autouse=True)
def host_untouched() -> Iterator[None]:
    if not IS_ROOT:
        yield
        return
    before = _host_snapshot()
    yield
    after = _host_snapshot()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    leftovers = nslib.leftover_namespaces()  # each xdist worker judges its own
    assert not changed, f"tests changed the machine's own namespace/state: {changed}"
    assert not leftovers, f"tests left network namespaces behind: {leftovers}"


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

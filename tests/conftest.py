"""Fixtures shared by all tests.

Kernel tests (marked `root`) get a `lab`: a fresh "host" netns where the plugins run, a
"container" netns, a private state root and cache dir, all removed afterwards even when
the test fails. The session ends by checking that the machine's own namespace and state
dirs are exactly as they were found (`host_untouched`; what is compared: host_snapshot).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cnichain import netns as api_netns
from tests.harness import netns as nslib
from tests.harness import snapshot as snap
from tests.harness.lab import Lab, host_snapshot

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
    leftovers = sorted({*nslib.leftover_namespaces(), *api_netns.leftovers()})
    assert not changes, "tests changed the machine's own namespace/state:\n" + snap.describe(
        changes
    )
    assert not leftovers, f"tests left network namespaces behind: {leftovers}"


@pytest.fixture
def cni_netns_prefix() -> str:
    """cnichain's fixtures (tests/kernel/test_chain.py) name their namespaces like the
    harness: the session's checks (host_untouched) know cmpt-* as tests' own."""
    return nslib.PREFIX


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A Lab; its namespaces (the ones `new_netns` adds too) are deleted afterwards, also
    when the test or the lab's own set-up failed. Attachments are not DELeted first: the
    tests judge what their DELs leave, and deleting the namespaces removes the rest."""
    made: list[nslib.Netns] = []

    def make(role: str) -> nslib.Netns:
        ns = nslib.create(role)
        made.append(ns)
        return ns

    try:
        yield Lab(make, tmp_path)
    finally:
        for ns in made:
            nslib.delete(ns)


@pytest.fixture(params=["nftables", "iptables-nft", "iptables-legacy"])
def backend(request: pytest.FixtureRequest, lab: Lab) -> str:
    """portmap's backend for a root test: nftables, or iptables forced to one variant
    (CNI_META_IPTABLES in the lab's env); the config's "backend" value is returned."""
    name = str(request.param)
    if name.startswith("iptables-"):
        lab.env["CNI_META_IPTABLES"] = name.split("-")[1]
        return "iptables"
    return name

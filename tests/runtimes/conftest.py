"""Fixtures for the runtime suites: an install of our plugins, the Go-vs-ours switch, an uplink.

Every runtime test runs twice: once with only the Go plugins (`go`: proves the harness and
states the behaviour to match) and once with ours installed first in the plugin path
(`ours`: what users get after `make install`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.lab import Lab
from tests.harness.runtimes import (
    CLIENT_ADDR,
    CLIENT_ADDR6,
    HOST_ADDR,
    HOST_ADDR6,
    Uplink,
    install_ours,
    plugin_dirs,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "runtime: drives a real container runtime or libcni")


@pytest.fixture(scope="session")
def our_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our plugins installed by deploy/install.sh into a private CNI bin dir."""
    base = tmp_path_factory.mktemp("install")
    return install_ours(base / "bin", base / "prefix")


@pytest.fixture(params=["go", "ours"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cni_dirs(flavour: str, our_bin: Path) -> list[str]:
    return plugin_dirs(flavour, our_bin)


@pytest.fixture
def uplink(lab: Lab) -> Iterator[Uplink]:
    """A client netns wired to the host netns: traffic that arrives from outside."""
    client = lab.new_netns("client")
    lab.host.ip("link", "add", "uplink0", "type", "veth", "peer", "name", "uplink1",
                "netns", client.name)  # fmt: skip
    lab.host.ip("addr", "add", f"{HOST_ADDR}/24", "dev", "uplink0")
    lab.host.ip("addr", "add", f"{HOST_ADDR6}/64", "dev", "uplink0", "nodad")
    lab.host.ip("link", "set", "uplink0", "up")
    client.ip("addr", "add", f"{CLIENT_ADDR}/24", "dev", "uplink1")
    client.ip("addr", "add", f"{CLIENT_ADDR6}/64", "dev", "uplink1", "nodad")
    client.ip("link", "set", "uplink1", "up")
    yield Uplink(client)

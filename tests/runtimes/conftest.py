"""Fixtures for the runtime suites: an install of our plugins, the Go-vs-ours switch, an uplink.

Every runtime test runs twice: once with only the Go plugins (`go`: proves the harness and
states the behaviour to match) and once with ours installed first in the plugin path
(`ours`: what users get after `make install`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Lab
from tests.harness.netns import Netns
from tests.harness.runtimes import install_ours, plugin_dirs

HOST_ADDR = "198.51.100.1"  # the host's "uplink" address, inside the test's host netns
CLIENT_ADDR = "198.51.100.2"  # a client machine on that uplink (its own netns)
HOST_ADDR6 = "2001:db8:51::1"
CLIENT_ADDR6 = "2001:db8:51::2"


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


@dataclass
class Uplink:
    client: Netns
    host_addr: str = HOST_ADDR
    client_addr: str = CLIENT_ADDR
    host_addr6: str = HOST_ADDR6
    client_addr6: str = CLIENT_ADDR6


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

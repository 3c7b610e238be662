"""Throwaway "host" and "container" network namespaces.

Every kernel test runs the plugins inside a host netns it created and puts the container
in another; deleting the namespaces removes every veth, bridge, ifb, qdisc, nft table and
iptables rule made inside them, so cleanup cannot miss a kind of object.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cnichain import netns as api_netns

PREFIX = "cmpt"  # every namespace a test makes starts with this
_created: set[str] = set()  # by this process: what the leak check holds it to


def sh(*argv: str, check: bool = True, netns: str | None = None) -> str:
    """Run a command (no shell), optionally inside a named netns; return stdout."""
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class Netns(api_netns.Netns):
    """The installed cnichain.netns.Netns (run, ip, entered, sysctl, socket), as a
    dataclass the harness builds by field (tests/harness/runtimes.py's PathNetns)."""

    name: str


def create(role: str) -> Netns:
    ns = Netns(f"{PREFIX}-{role}-{uuid.uuid4().hex[:10]}")
    sh("ip", "netns", "add", ns.name)
    _created.add(ns.name)
    ns.ip("link", "set", "lo", "up")
    return ns


def delete(ns: Netns) -> None:
    if os.path.exists(ns.path):
        sh("ip", "netns", "del", ns.name, check=False)


@contextmanager
def namespaces(*roles: str) -> Iterator[list[Netns]]:
    made: list[Netns] = []
    try:
        for role in roles:
            made.append(create(role))
        yield made
    finally:
        for ns in made:
            delete(ns)


def leftover_namespaces() -> list[str]:
    """Namespaces this process created that still exist."""
    return sorted(name for name in _created if os.path.exists(f"/run/netns/{name}"))

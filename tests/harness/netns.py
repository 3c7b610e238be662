"""Throwaway "host" and "container" network namespaces: cnichain.netns's, named cmpt-*.

Every kernel test runs the plugins inside a host netns it created and puts the container
in another; deleting the namespaces removes every veth, bridge, ifb, qdisc, nft table and
iptables rule made inside them, so cleanup cannot miss a kind of object. The namespaces
are made and removed by the API the project ships (cnichain.netns), as its users' are.
"""

from __future__ import annotations

import os
import subprocess
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
    ns = Netns(api_netns.create(role, PREFIX).name)
    _created.add(ns.name)
    return ns


def delete(ns: api_netns.Netns) -> None:
    api_netns.delete(ns)


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

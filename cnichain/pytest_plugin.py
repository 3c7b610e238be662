"""pytest fixtures that run real CNI chains in throwaway network namespaces.

Installed with the package and loaded by pytest on its own (the `pytest11` entry point).
Tests that use the fixtures need root (without it they are skipped, saying so); they
never touch the machine's own namespace: the plugins run inside a throwaway "host"
namespace and the containers are others. It imports no plugin and not their `common`
package, so a test suite's own `common` module stays importable.

* `cni_netns` - a factory: `cni_netns("role")` makes a namespace that is deleted after the
  test.
* `cni_chain` - a `ChainLab` (cnichain.lab): a host namespace (IP forwarding on), a
  container namespace, private state, log and cache dirs, `network(conflist)` to bind a
  list to them and `attach(network)` to ADD a container; every attachment still up is
  DELeted afterwards.
* `cni_netns_prefix` - the namespaces' name prefix ("cnit"); override it in a conftest.py.

Cleanup runs after failing tests too. What cleanup cannot remove is not hidden: a DEL that
fails, a state file our plugins keep after DEL, or a namespace that still exists after
teardown makes the test end in an error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cnichain.lab import ChainLab
from cnichain.netns import DEFAULT_PREFIX, Netns, create, delete

__all__ = ["ChainLab"]

NOT_ROOT = (
    "cnichain's cni_netns/cni_chain fixtures need root: they create network namespaces "
    "(run pytest as root, e.g. with sudo)"
)


@pytest.fixture
def cni_netns_prefix() -> str:
    """The prefix of the names of the namespaces the fixtures make."""
    return DEFAULT_PREFIX


@pytest.fixture
def cni_netns(cni_netns_prefix: str) -> Iterator[Callable[..., Netns]]:
    """`cni_netns(role="ns")` makes a throwaway namespace; all are deleted afterwards
    and the test errors if one is still there."""
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT)
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

"""The session's host check (tests/conftest.py `host_untouched`) judges only what the
tests made: other software on the machine may make and remove named namespaces while the
tests run."""

from __future__ import annotations

import os

import pytest

from tests.harness import snapshot as snap
from tests.harness.lab import host_snapshot

pytestmark = pytest.mark.root


def test_host_check_ignores_namespaces_other_software_makes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = host_snapshot()
    listdir = os.listdir

    def with_a_runtimes_netns(path: str = ".") -> list[str]:
        names = listdir(path)
        # What a runtime's `ip netns add` or podman's netns-UUID would add meanwhile.
        return [*names, "netns-0d1f6a2e-other-software"] if str(path) == "/run/netns" else names

    monkeypatch.setattr(os, "listdir", with_a_runtimes_netns)
    assert not snap.diff(before, host_snapshot())

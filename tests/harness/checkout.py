"""The checkout the tests run from: its root and the files git tracks in it (what a
user's clone holds)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tracked_files() -> list[Path]:
    """Every file git tracks, as a path under REPO; the test is skipped outside a git
    checkout (an unpacked sdist)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [REPO / name for name in out.decode().split("\0") if name]

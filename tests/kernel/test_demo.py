"""`make demo` keeps working: run it as the README's first command does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.harness.plugins import OUR_BIN, REPO

pytestmark = pytest.mark.root


def test_demo_runs_green_and_leaves_nothing() -> None:
    demo = REPO / "tests" / "demo.py"
    env = {**os.environ, "PATH": f"{OUR_BIN}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run(
        [sys.executable, str(demo)], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 failed" in proc.stdout
    assert "[FAIL]" not in proc.stdout

"""examples/ as a user runs them: from a fresh venv holding only the built wheel and
pytest, copied away from the clone, as root. They pass and leave no namespace or nftables
table behind (the fixtures of the installed pytest plugin clean up)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _netns_names() -> set[str]:
    try:
        return set(os.listdir("/run/netns"))
    except FileNotFoundError:
        return set()


def test_examples_pass_from_a_fresh_venv_with_only_the_wheel(tmp_path: Path) -> None:
    dist, venv, examples = tmp_path / "dist", tmp_path / "venv", tmp_path / "ex-copy"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)])
    (wheel,) = dist.glob("*.whl")
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "pip"), "install", "-q", str(wheel), "pytest"])
    shutil.copytree(REPO / "examples", examples)
    env = {k: v for k, v in os.environ.items() if k not in ("CNI_PATH", "PYTHONPATH")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # nothing of this clone's venv
    tables = _run(["nft", "list", "tables"]).stdout
    before = _netns_names()

    proc = subprocess.run(
        [str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", str(examples)],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip

    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert "4 passed" in proc.stdout
    assert not [n for n in _netns_names() - before if n.startswith("cnit-")]
    assert _run(["nft", "list", "tables"]).stdout == tables

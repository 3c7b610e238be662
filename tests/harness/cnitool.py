"""The libcni-based cnitool from ../shared/tools/cnitool, built once per machine.

libcni keeps its result cache in /var/lib/cni; `run_in_private_varlib` runs a script in a
private mount namespace with a tmpfs over /var/lib, so nothing reaches the machine's own.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".venv" / "cnitool"


def shared_dir() -> Path:
    for candidate in (REPO.parent / "shared", Path("/work/shared")):
        if (candidate / "tools" / "cnitool" / "build.sh").exists():
            return candidate
    raise FileNotFoundError("shared/tools/cnitool/build.sh not found beside the repository")


def build() -> str:
    """Path of a built cnitool (the build installs Go and libcni from Debian if needed)."""
    exe = CACHE / "cnitool"
    if not exe.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        script = shared_dir() / "tools" / "cnitool" / "build.sh"
        subprocess.run(["bash", str(script), str(CACHE)], check=True, capture_output=True)
    return str(exe)


def run_in_private_varlib(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a bash script whose /var/lib is a private tmpfs (libcni's cache stays in it)."""
    wrapped = "set -e\nmount --make-rprivate /\nmount -t tmpfs tmpfs /var/lib\n" + script
    return subprocess.run(
        ["unshare", "--mount", "bash", "-c", wrapped],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )

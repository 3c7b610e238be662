"""The project's libcni client (tests/harness/libcni_client/), built on first use.

It takes upstream cnitool's arguments (`add|check|del NETWORK NETNS`, NETCONFPATH, CNI_PATH,
CNI_ARGS, CAP_ARGS, ...), so the suites drive plugins through libcni exactly as runtimes
do. build.sh compiles it offline against Debian's golang-github-appc-cni-dev; the result is
kept under build/, in a directory named after a hash of the sources (an edit rebuilds it).

libcni keeps its result cache in /var/lib/cni; `run_in_private_varlib` runs a script in a
private mount namespace with a tmpfs over /var/lib, so nothing reaches the machine's own.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).resolve().parent / "libcni_client"
CACHE = REPO / "build" / "libcni-client"


def _source_key() -> str:
    digest = hashlib.sha256()
    for name in ("main.go", "build.sh"):
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes())
    return digest.hexdigest()[:16]


def build() -> str:
    """Path of the built client (built now if these sources have not been built yet)."""
    exe = CACHE / _source_key() / "libcni-client"
    if exe.exists():
        return str(exe)
    exe.parent.mkdir(parents=True, exist_ok=True)
    # Built under a name of this process and renamed: parallel test workers never run a
    # half-written file.
    tmp = exe.with_name(f"{exe.name}.tmp.{os.getpid()}")
    proc = subprocess.run(
        ["bash", str(SOURCE / "build.sh"), str(tmp)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building the libcni client failed:\n{proc.stderr}{proc.stdout}")
    os.replace(tmp, exe)
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

"""A clone is all the project needs: no file names a path of a particular machine, and the
libcni client the runtime suites use is built from the project's own sources.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.harness import cnitool

REPO = Path(__file__).resolve().parents[1]

# An absolute path under /work, or a directory beside the checkout ("../shared", "shared/"):
# neither exists in a user's clone. Spelled in pieces so this file does not match itself.
MACHINE_PATHS = re.compile("(?<![\\w.-])/" + "work/|(?<![\\w-])" + "shared/")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [REPO / name for name in out.decode().split("\0") if name]


def test_no_file_names_a_path_outside_the_clone() -> None:
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue  # deleted in the work tree, not yet committed
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # binary: images, archives
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATHS.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "paths that exist only on one machine:\n" + "\n".join(found)


@pytest.mark.slow
def test_libcni_client_builds_from_the_checkout() -> None:
    exe = cnitool.build()
    assert Path(exe).is_relative_to(REPO)
    proc = subprocess.run([exe], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert "usage: libcni-client add|check|del NETWORK NETNS" in proc.stderr

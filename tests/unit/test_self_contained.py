"""A clone is all the project needs: no file names a path of a particular machine, and the
libcni client the runtime suites use is built from the project's own sources.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.harness import cnitool
from tests.harness.checkout import REPO, tracked_files

# An absolute path of this project's development machines (under /work), or the "shared"
# directory beside their checkouts: neither exists in a user's clone. Spelled in pieces so
# this file does not match itself.
MACHINE_PATHS = re.compile("(?<![\\w.-])/" + "work/|(?<![\\w-])" + "sha" + "red/")


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


def makefile_list(text: str, name: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    match = re.search(rf"^{name} := (.*)$", joined, re.MULTILINE)
    assert match, f"{name} not in the Makefile"
    return match.group(1).replace("$(DEMO_APT)", "").split()


def test_readme_names_exactly_the_apt_packages_each_command_installs() -> None:
    makefile = (REPO / "Makefile").read_text()
    readme = (REPO / "README.md").read_text()
    demo = re.search(r"^- `make demo`: `([^`]+)`", readme, re.MULTILINE)
    test = re.search(r"^- `make test`: the demo's and `([^`]+)`", readme, re.MULTILINE)
    assert demo and test, "README's apt lists for make demo / make test not found"
    assert demo.group(1).split() == makefile_list(makefile, "DEMO_APT")
    assert test.group(1).split() == makefile_list(makefile, "TEST_APT")
    bench = re.search(r"^- `make bench`: the tests' and `([^`]+)`", readme, re.MULTILINE)
    assert bench, "README's apt list for make bench not found"
    assert bench.group(1).split() == makefile_list(makefile, "BENCH_APT")

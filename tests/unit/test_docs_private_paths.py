"""No documented recipe hands root to another local user.

A venv at a fixed path in a world-writable directory (/tmp/venv) can be created first by
anyone, with a `bin/pytest` of their own; a recipe that then runs it with sudo runs their
code as root (issue 29 finding 7). Recipes put venvs below $HOME or in `mktemp -d`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness.checkout import REPO, tracked_files

SHARED = r"""["']?(?:/tmp|/var/tmp|/dev/shm)/"""
# A venv made in a shared directory, or a program run from one as root.
RISKY = re.compile(
    rf"(?:-m\s+venv|virtualenv|uv\s+venv)\s+(?:--?\S+\s+)*{SHARED}|\bsudo\s+(?:-\S+\s+)*{SHARED}"
)
DOCS = re.compile(r"(\.md|\.rst|\.txt|\.sh|\.ya?ml|Makefile|Containerfile|README[^/]*)$")


def tracked_docs() -> list[Path]:
    return [
        p for p in tracked_files() if DOCS.search(p.relative_to(REPO).as_posix()) and p.is_file()
    ]


@pytest.mark.parametrize(
    ("line", "risky"),
    [
        ("python3 -m venv /tmp/venv && /tmp/venv/bin/pip install x.whl", True),
        ("sudo /tmp/venv/bin/pytest examples/", True),
        ("sudo -E '/var/tmp/v/bin/pytest'", True),
        ("virtualenv --clear /dev/shm/env", True),
        ('python3 -m venv "$HOME"/.venvs/cni-meta-examples', False),
        ('sudo "$venv"/bin/pytest examples/', False),
        ('cache_dir="/tmp/cni-cache"', False),
    ],
)
def test_the_pattern_knows_a_risky_recipe(line: str, risky: bool) -> None:
    assert bool(RISKY.search(line)) is risky


def test_no_tracked_doc_makes_a_venv_in_tmp_or_runs_root_from_there() -> None:
    docs = tracked_docs()
    assert any(p.name == "README.md" for p in docs)
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in docs
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if RISKY.search(line)
    ]
    assert not found, "recipes that let another local user plant code run as root:\n" + "\n".join(
        found
    )

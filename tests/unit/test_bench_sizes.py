"""bench/sizes.py's line counters (the side-by-side table of docs/architecture.md): which
lines are code, on small texts whose answers are counted by hand."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.sizes import Source, go_code_lines, physical_lines, python_code_lines

PYTHON = '''"""Module docstring,
two lines."""

# a comment
import os  # a comment after code


def f() -> str:
    """A docstring."""
    text = """a string that is
    not a docstring"""
    return text
'''

GO = """// Package x: a doc comment.
package x

/* a block
   comment */
import "fmt" /* after code */

func f() string {
	s := "// not a comment"
	r := '"'
	raw := `two
// lines of a raw string`
	return fmt.Sprint(s, r, raw) // a comment
}
"""


def test_physical_lines_are_what_wc_counts() -> None:
    assert physical_lines("a\nb\n") == 2
    assert physical_lines("a\nb") == 1  # a last line without its newline


def test_python_code_lines_leave_out_blanks_comments_and_docstrings() -> None:
    # import os; def f; text = """...""" (2 lines); return text
    assert python_code_lines(PYTHON) == 5


def test_go_code_lines_leave_out_blanks_and_comments_not_strings() -> None:
    # package; import; func; s :=; r :=; raw := (2 lines); return; }
    assert go_code_lines(GO) == 9


def test_a_bare_clone_is_counted_at_its_head(tmp_path: Path) -> None:
    repo = tmp_path / "repo"

    def git(*args: str, cwd: Path = repo) -> None:
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    repo.mkdir()
    (repo / "pkg").mkdir()
    (repo / "pkg" / "a.go").write_text(GO)
    (repo / "pkg" / "a_test.go").write_text("package x\n")
    (repo / "top.go").write_text("package y\n\n")
    try:
        git("init", "-q")
        git("add", ".")
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
        git("clone", "-q", "--bare", str(repo), str(tmp_path / "bare.git"), cwd=tmp_path)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"git cannot make a repository here: {e}")
    src = Source(tmp_path / "bare.git")
    assert len(src.commit) == 40
    assert src.files("pkg", ".go") == {"pkg/a.go": GO, "pkg/a_test.go": "package x\n"}
    assert src.files("", ".go", recursive=False) == {"top.go": "package y\n\n"}

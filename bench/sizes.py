"""The sizes of our rooms beside the Go reference plugins and knftables, counted from the
files themselves: the side-by-side table of docs/architecture.md.

For each of our packages (the .py files of common/, portmap/, ... cnichain/, as they are
in this work tree) and each comparable part of containernetworking/plugins and of
kubernetes-sigs/knftables (their .go files at the checkout's HEAD): files, physical
lines (what `wc -l` counts) and code lines (neither blank nor only comment; a Python
docstring counts as comment, as Go's doc comments do). Go's `_test.go` files and our
tests/ are counted apart, in a second table. Vendored code of the Go plugins is counted
only where a row names it (the CNI library they build on).

A source is a checkout or a bare clone (a mirror): its HEAD is what is counted, and its
commit is printed. Without --go-plugins or --knftables, those rows say "not given".

    .venv/bin/python bench/sizes.py --go-plugins PATH --knftables PATH
        [--update docs/architecture.md]   -> the tables on stdout; with --update, also
                                             written between the doc's sizes markers
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import sys
import tokenize
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import markdown_table

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python bench/sizes.py --go-plugins PATH --knftables PATH"
BEGIN = "<!-- sizes: made by bench/sizes.py, do not edit by hand -->"
END = "<!-- sizes: end -->"
# The rooms the Makefile's size guard counts together (SIZED): their total is shown so
# that the figure can be checked against `make lint`'s.
SIZED = ("common", "portmap", "bandwidth", "tuning")
CNI_LIBRARY = "vendor/github.com/containernetworking/cni"

# Our room -> the parts that do its work on the other side: (source, directory, label).
# A directory "" with source knftables is that module's own package (its top level).
PAIRS: list[tuple[str, list[tuple[str, str, str]]]] = [
    (
        "common",
        [
            ("go-plugins", "pkg", "`pkg/`"),
            ("go-plugins", CNI_LIBRARY + "/pkg", "the CNI library's `pkg/` (vendored)"),
        ],
    ),
    (
        "portmap",
        [
            ("go-plugins", "plugins/meta/portmap", "`plugins/meta/portmap/`"),
            ("knftables", "", "knftables (the nftables library they use)"),
        ],
    ),
    ("bandwidth", [("go-plugins", "plugins/meta/bandwidth", "`plugins/meta/bandwidth/`")]),
    ("tuning", [("go-plugins", "plugins/meta/tuning", "`plugins/meta/tuning/`")]),
    ("flatnet", [("go-plugins", "plugins/main/bridge", "`plugins/main/bridge/`")]),
    ("flatnet_ipam", [("go-plugins", "plugins/ipam/host-local", "`plugins/ipam/host-local/`")]),
    ("cnichain", [("go-plugins", CNI_LIBRARY + "/libcni", "the CNI library's `libcni/`")]),
]
# Our test tiers and what they share; "tests" alone: its own files (conftest.py, demo.py).
OUR_TESTS = ("tests/unit", "tests/fake", "tests/kernel", "tests/runtimes", "tests/harness", "tests")
COUNTED = [room for room, _ in PAIRS] + ["tests"]


@dataclass
class Count:
    files: int = 0
    lines: int = 0
    code: int = 0

    def add(self, lines: int, code: int) -> None:
        self.files += 1
        self.lines += lines
        self.code += code

    def __iadd__(self, other: Count) -> Count:
        self.files += other.files
        self.lines += other.lines
        self.code += other.code
        return self

    def cells(self) -> list[object]:
        return [f"{self.files:,}", f"{self.lines:,}", f"{self.code:,}"]


def physical_lines(text: str) -> int:
    """As `wc -l`: the newlines (a last line without one is not counted)."""
    return text.count("\n")


def python_code_lines(text: str) -> int:
    """Lines holding a token that is neither a comment nor part of a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                docstrings.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in skip or tok.type == tokenize.ENDMARKER:
            continue
        code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - docstrings)


def go_code_lines(text: str) -> int:
    """Lines holding anything but blanks and comments (// and /* */), strings and runes
    read as Go reads them (a comment marker inside one is text)."""
    code: set[int] = set()
    line, i, n = 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r":
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
        elif c in "\"'`":
            end = _string_end(text, i)
            code.update(range(line, line + text.count("\n", i, end) + 1))
            line += text.count("\n", i, end)
            i = end
        else:
            code.add(line)
            i += 1
    return len(code)


def _string_end(text: str, start: int) -> int:
    """Where the string or rune literal opened at `start` ends (past its quote)."""
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
        elif text[i] == quote or (text[i] == "\n" and quote != "`"):
            return i + 1
        else:
            i += 1
    return len(text)


class Source:
    """The files of one repository: this work tree, or a checkout's or bare clone's HEAD."""

    def __init__(self, path: Path, work_tree: bool = False, of: Sequence[str] = ()) -> None:
        """`of`: the directories whose last commit is the one to name (all: HEAD)."""
        self.path = path
        self.work_tree = work_tree
        self.commit = self._git("log", "-1", "--format=%H", "HEAD", "--", *of).strip()
        self._names = self._git("ls-tree", "-r", "--name-only", "-z", "HEAD").split("\0")

    def _git(self, *args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(self.path), *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"{self.path}: not a git checkout or clone: {done.stderr.strip()}")
        return done.stdout

    def describe(self) -> str:
        """The commit, and the nearest tag (`git describe`) for a reader."""
        return f"{self.commit[:12]} ({self._git('describe', '--tags', '--always').strip()})"

    def dirty(self, dirs: Iterable[str]) -> bool:
        return bool(self._git("status", "--porcelain", "--", *dirs).strip())

    def files(self, directory: str, suffix: str, recursive: bool = True) -> dict[str, str]:
        """name -> text of the files below `directory` ending in `suffix`."""
        if self.work_tree:  # as they are now, as the Makefile's size guard counts them
            top = self.path / directory
            paths = top.rglob("*" + suffix) if recursive else top.glob("*" + suffix)
            return {str(p.relative_to(self.path)): p.read_text() for p in sorted(paths)}
        prefix = directory.rstrip("/") + "/" if directory else ""
        names = [
            name
            for name in self._names
            if name.startswith(prefix)
            and name.endswith(suffix)
            and (recursive or "/" not in name[len(prefix) :])
        ]
        return dict(zip(names, self._show(names), strict=True))

    def _show(self, names: Sequence[str]) -> list[str]:
        """The texts of `names` at HEAD, through one `git cat-file --batch`."""
        done = subprocess.run(
            ["git", "-C", str(self.path), "cat-file", "--batch"],
            input="".join(f"HEAD:{name}\n" for name in names).encode(),
            capture_output=True,
            check=True,
        )
        out, at, texts = done.stdout, 0, []
        for _ in names:
            header_end = out.index(b"\n", at)
            size = int(out[at:header_end].split()[2])
            texts.append(out[header_end + 1 : header_end + 1 + size].decode())
            at = header_end + 1 + size + 1
        return texts


def count(texts: Iterable[str], code_lines: Callable[[str], int]) -> Count:
    total = Count()
    for text in texts:
        total.add(physical_lines(text), code_lines(text))
    return total


def go_parts(src: Source, directory: str) -> tuple[Count, Count]:
    """(code, tests) of the .go files of one part."""
    files = src.files(directory, ".go", recursive=bool(directory))
    tests = [text for name, text in files.items() if name.endswith("_test.go")]
    code = [text for name, text in files.items() if not name.endswith("_test.go")]
    return count(code, go_code_lines), count(tests, go_code_lines)


def tables(ours: Source, others: dict[str, Source | None]) -> str:
    rows: list[list[object]] = []
    go_tests: list[tuple[str, Count]] = []
    sized, sized_go, mine_all, go_all = Count(), Count(), Count(), Count()
    for room, parts in PAIRS:
        mine = count(ours.files(room, ".py", recursive=False).values(), python_code_lines)
        mine_all += mine
        if room in SIZED:
            sized += mine
        for i, (source, directory, label) in enumerate(parts):
            left = [f"`{room}/`", *mine.cells()] if i == 0 else ["", "", "", ""]
            src = others[source]
            if src is None:
                rows.append([*left, f"{label}: not given", "", "", ""])
                continue
            code, tests = go_parts(src, directory)
            go_all += code
            if room in SIZED:
                sized_go += code
            rows.append([*left, label, *code.cells()])
            if tests.files:  # vendored code comes without its tests
                go_tests.append((label, tests))
    rows.append(["the size guard's four", *sized.cells(), "their counterparts", *sized_go.cells()])
    rows.append(["all our rooms", *mine_all.cells(), "all the parts above", *go_all.cells()])

    test_rows: list[list[object]] = []
    mine_tests, go_tests_all = Count(), Count()
    for tier in OUR_TESTS:
        mine = count(ours.files(tier, ".py", tier != "tests").values(), python_code_lines)
        mine_tests += mine
        name = f"`{tier}/`" if tier != "tests" else "`tests/*.py`"
        test_rows.append([f"ours: {name}", *mine.cells()])
    test_rows.append(["all our tests", *mine_tests.cells()])
    for label, tests in go_tests:
        go_tests_all += tests
        test_rows.append([label, *tests.cells()])
    if go_tests:
        test_rows.append(["all their tests", *go_tests_all.cells()])

    head = ["ours", "files", "lines", "code", "Go plugins, knftables", "files", "lines", "code"]
    dirty = " and uncommitted changes" if ours.dirty(COUNTED) else ""
    sources = [f"ours as of {ours.commit[:12]}{dirty}"]
    sources += [f"{name} at {src.describe()}" for name, src in others.items() if src]
    return "\n".join(
        [
            BEGIN,
            f"Counted by `{COMMAND}`: {'; '.join(sources)}.",
            "",
            markdown_table(head, rows),
            "",
            markdown_table(["tests", "files", "lines", "code"], test_rows),
            END,
        ]
    )


def update(doc: Path, text: str) -> None:
    """Replace the block between the doc's markers (the markers included) with `text`."""
    old = doc.read_text()
    start, end = old.find(BEGIN), old.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{doc}: no sizes markers ({BEGIN} ... {END})")
    doc.write_text(old[:start] + text + old[end + len(END) :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--go-plugins", type=Path, help="containernetworking/plugins checkout")
    ap.add_argument("--knftables", type=Path, help="kubernetes-sigs/knftables checkout")
    ap.add_argument("--update", type=Path, help="a doc whose sizes block to rewrite")
    args = ap.parse_args()
    others: dict[str, Source | None] = {
        "go-plugins": Source(args.go_plugins) if args.go_plugins else None,
        "knftables": Source(args.knftables) if args.knftables else None,
    }
    # Ours: the work tree, named by the last commit that changed what is counted, so that
    # a rerun after a change elsewhere (this doc's) prints the same tables.
    ours = Source(REPO, work_tree=True, of=COUNTED)
    text = tables(ours, others)
    print(text)
    if args.update:
        update(args.update, text)


if __name__ == "__main__":
    main()

"""tests/ stays navigable by tier: every test file lives in its tier's folder, the
no-root folders hold no root test, and test modules share helpers only through
tests/harness/ (a test module importing another runs, and breaks with, the other's
collection)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "fake", "kernel", "runtimes")
NO_ROOT = ("unit", "fake")


def all_test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name.startswith("test_"))


def imported_modules(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "tests" and any(p.startswith("test_") or p == "conftest" for p in parts)


def test_every_test_file_is_in_a_tier_folder() -> None:
    misplaced = [
        str(p.relative_to(TESTS)) for p in all_test_files() if p.parent.parent != TESTS
        or p.parent.name not in TIERS
    ]  # fmt: skip
    assert all_test_files()
    assert not misplaced, f"put these under tests/{{{','.join(TIERS)}}}/: {misplaced}"


def test_no_test_module_imports_another() -> None:
    modules = [*all_test_files(), *TESTS.rglob("conftest.py"), *(TESTS / "harness").rglob("*.py")]
    found = {
        str(p.relative_to(TESTS)): sorted(m for m in imported_modules(p) if is_test_module(m))
        for p in modules
    }
    assert not {k: v for k, v in found.items() if v}, "move shared helpers into tests/harness/"


def root_marks(path: Path) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "root"
        and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"
    ]  # fmt: skip


def test_the_no_root_folders_hold_no_root_test() -> None:
    marked = {
        str(p.relative_to(TESTS)): root_marks(p)
        for p in all_test_files()
        if p.parent.name in NO_ROOT
    }
    assert not {k: v for k, v in marked.items() if v}, "a root test belongs in tests/kernel/"

"""examples/ as a user runs them: from a fresh venv holding only the built wheel and
pytest, copied away from the clone, as root. They pass and leave no namespace or nftables
table behind (the fixtures of the installed pytest plugin clean up)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
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


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the built wheel, a fresh venv holding only it and pytest)."""
    top = tmp_path_factory.mktemp("wheel")
    dist, venv = top / "dist", top / "venv"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(REPO)])
    (wheel,) = dist.glob("*.whl")
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "pip"), "install", "-q", str(wheel), "pytest"])
    return wheel, venv


def _user_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CNI_PATH", "PYTHONPATH")}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # nothing of this clone's venv
    return env


def test_examples_pass_from_a_fresh_venv_with_only_the_wheel(
    tmp_path: Path, wheel_venv: tuple[Path, Path]
) -> None:
    _, venv = wheel_venv
    examples = tmp_path / "ex-copy"
    shutil.copytree(REPO / "examples", examples)
    env = _user_env()
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


# A test author's own `common` module, and a test that uses it beside the fixtures.
USER_COMMON = """GREETING = b"hello from my own common"


def shout(text: str) -> str:
    return text.upper()
"""
USER_TEST = """
from common import GREETING, shout


def test_my_common_beside_the_fixtures(cni_netns):
    ns = cni_netns("mine")
    assert ns.exists() and shout("ok") == "OK" and GREETING.startswith(b"hello")
"""


def test_a_users_own_common_module_works_in_a_session_with_the_wheel(
    tmp_path: Path, wheel_venv: tuple[Path, Path]
) -> None:
    wheel, venv = wheel_venv
    project = tmp_path / "myproject"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "common.py").write_text(USER_COMMON)
    (project / "tests" / "test_mine.py").write_text(USER_TEST)
    before = _netns_names()
    proc = subprocess.run(
        [str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project, env=_user_env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    assert not [n for n in _netns_names() - before if n.startswith("cnit-")]
    # Loading the plugin and the whole API imports none of the wheel's plugin packages.
    probe = (
        "import sys, cnichain, cnichain.pytest_plugin, cnichain.runner;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'common', 'portmap',"
        " 'bandwidth', 'tuning'}))"
    )
    assert _run([str(venv / "bin" / "python"), "-c", probe]).stdout.strip() == "[]"
    # py.typed (PEP 561) and the license travel with the wheel.
    names = zipfile.ZipFile(wheel).namelist()
    assert "cnichain/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names), names  # fmt: skip

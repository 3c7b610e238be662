"""`make dist`'s artifacts work: the sdist holds what a build needs, and the wheel built from
it, pip-installed into a fresh venv, gives working plugin executables.

Built as `make dist` builds (`python -m build --no-isolation`: the sdist first, the wheel
from the unpacked sdist), from a copy of the checkout so the test writes nothing into it.
pip resolves the wheel's dependencies (pyroute2) as it does for `make deps`.

The wheel goes into a venv of the test's own Python, and of each interpreter named in
CNI_META_TEST_PYTHONS (space-separated paths, e.g. a Python 3.12 and a 3.13): the plugins
start there with CPython's private `_json` and `_sha2` in use, and without them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = ("portmap", "bandwidth", "tuning", "flatnet", "flatnet-ipam")  # executables
ALL_VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
# Local products and caches; everything else in the checkout is source.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("dist")
    src = base / "src"
    shutil.copytree(REPO, src, ignore=NOT_SOURCE)
    out = base / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


PYTHONS = [sys.executable, *os.environ.get("CNI_META_TEST_PYTHONS", "").split()]


@pytest.fixture(scope="module", params=PYTHONS)
def venv(
    dist: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Path:
    """A fresh venv with nothing but the wheel and what it depends on."""
    env_dir = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([request.param, "-m", "venv", str(env_dir)], check=True)
    (wheel,) = dist.glob("*.whl")
    proc = subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return env_dir


def test_sdist_holds_the_packages_and_the_build_config(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for needed in ("pyproject.toml", "README.md", "MANIFEST.in", "Makefile"):
        assert needed in names
    # A user of the sdist gets the examples that docs/python-api.md tells them to run.
    examples = {str(p.relative_to(REPO)) for p in (REPO / "examples").glob("*")}
    assert examples and examples <= names, examples - names
    for package in ("common", *(p.replace("-", "_") for p in PLUGINS)):
        sources = {str(p.relative_to(REPO)) for p in (REPO / package).glob("*.py")}
        assert sources <= names, sources - names


@pytest.mark.parametrize("plugin", PLUGINS)
def test_installed_wheel_answers_version(venv: Path, plugin: str) -> None:
    exe = venv / "bin" / plugin
    proc = subprocess.run(
        [str(exe)],
        input=b'{"cniVersion": "0.4.0"}',
        env={"PATH": os.defpath, "CNI_COMMAND": "VERSION"},
        cwd="/",
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads(proc.stdout)
    assert answer == {"cniVersion": "0.4.0", "supportedVersions": ALL_VERSIONS}


def test_installed_wheel_runs_from_the_venv_with_the_pinned_pyroute2(venv: Path) -> None:
    script = (
        "import importlib.metadata as m, json, portmap, bandwidth, tuning, flatnet, flatnet_ipam\n"
        "import pyroute2\n"
        "print(json.dumps({'files': [portmap.__file__, bandwidth.__file__, tuning.__file__,"
        " flatnet.__file__, flatnet_ipam.__file__],"
        " 'pyroute2': m.version('pyroute2'),"
        " 'requires': m.requires('cni-meta-plugins')}))"
    )
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    info = json.loads(proc.stdout)
    for path in info["files"]:
        assert Path(path).is_relative_to(venv), path
    assert any(r.startswith("pyroute2") and "<0.10" in r for r in info["requires"])
    major, minor, *_ = (int(part) for part in info["pyroute2"].split("."))
    assert (major, minor) == (0, 9)


# Whether the fast path is live on this interpreter, and the plugin without it.
FAST_PATH = """
import hashlib, json, sys
from common import digest, jsontext
text = '{"a": [1, 2.5, "\\u00e9", null, true], "k": 1, "k": 2}'
value = jsontext.loads(text)
assert repr(value) == repr(json.loads(text)) and value.repeated == "k"
assert jsontext.dumps(value, sort_keys=True) == json.dumps(value, sort_keys=True)
assert digest.sha512_hex(b"x") == hashlib.sha512(b"x").hexdigest()
print(sys.version_info[:2], jsontext._scan is not None, type(digest._constructor("sha512")))
"""
WITHOUT_PRIVATE = (
    "import sys\n"
    "sys.modules.update(dict.fromkeys(('_json', '_sha2', '_sha256', '_sha512')))\n"
    "from portmap.__main__ import main\n"
    "main()\n"
)


def test_installed_wheel_uses_the_private_modules_and_works_without(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    out = subprocess.run(
        [python, "-I", "-c", FAST_PATH], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    assert out.rstrip().endswith("True <class 'builtin_function_or_method'>"), out
    proc = subprocess.run(
        [python, "-I", "-c", WITHOUT_PRIVATE],
        input=b'{"cniVersion": "1.0.0"}',
        env={"PATH": os.defpath, "CNI_COMMAND": "VERSION"},
        capture_output=True,
        check=False,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout) == {"cniVersion": "1.0.0", "supportedVersions": ALL_VERSIONS}

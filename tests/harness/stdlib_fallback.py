"""The plugins as executables that cannot import CPython's private accelerator modules
(`_json`, `_sha2`...): `sys.modules[name] = None` makes `import name` raise ImportError,
so common/jsontext.py and common/digest.py take their public fallbacks."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.harness.plugins import REPO

PRIVATE = ("_json", "_sha2", "_sha256", "_sha512")
BLOCK = f"import sys\nsys.modules.update(dict.fromkeys({PRIVATE!r}))\n"


def wrappers(directory: Path) -> Path:
    """portmap, bandwidth and tuning as executables that block the private modules first."""
    directory.mkdir()
    for plugin in ("portmap", "bandwidth", "tuning"):
        exe = directory / plugin
        exe.write_text(
            f"#!{sys.executable} -I\n{BLOCK}"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            f"from {plugin}.__main__ import main\nmain()\n"
        )
        exe.chmod(0o755)
    return directory

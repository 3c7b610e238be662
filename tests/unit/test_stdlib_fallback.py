"""The plugins without CPython's private accelerator modules.

For a cheap start-up the plugins use `_json` (common/jsontext.py) and `_sha2`/`_sha512`
(common/digest.py) directly instead of `json` and `hashlib`. Those are private: another
build or a later CPython may lack them or change them. Each module then falls back to the
public one, and these tests force that path by making the private modules unimportable
(`sys.modules[name] = None`, which makes `import name` raise ImportError) in the plugin's
own process: the same results, and VERSION from all three plugins (a whole chain's ADD,
CHECK and DEL with real traffic: tests/kernel/test_stdlib_fallback.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common import jsontext
from common.digest import sha256_hex, sha512_hex
from tests.harness.plugins import our, run_plugin
from tests.harness.stdlib_fallback import BLOCK, wrappers

REPO = Path(__file__).resolve().parents[2]
ALL_VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]

SAMPLE = '{"b": [1, 2.5, "\\u00e9", null, true, NaN], "a": {"k": 1, "k": 2}}'
EXERCISE = """
from common import jsontext
from common.digest import sha256_hex, sha512_hex
value = jsontext.loads(SAMPLE.encode())
out = {
    "decoded": repr(value),
    "repeated": value["a"].repeated,
    "encoded": jsontext.dumps(value, sort_keys=True),
    "sha256": sha256_hex(b"cni"),
    "sha512": sha512_hex(b"cni"),
}
out["public"] = sorted(m for m in ("json", "hashlib") if m in sys.modules)
try:
    jsontext.loads('{"a": }')
except ValueError as e:
    out["error"] = f"{type(e).__name__}: {e}"
print(jsontext.dumps(out))
"""


def exercise(block: bool) -> dict[str, object]:
    code = (BLOCK if block else "import sys\n") + f"SAMPLE = {SAMPLE!r}\n" + EXERCISE
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_without_the_private_modules_json_and_digests_are_the_same() -> None:
    fast, fallback = exercise(block=False), exercise(block=True)
    assert fast.pop("public") == []  # the fast path: neither json nor hashlib imported
    assert fallback.pop("public") == ["hashlib", "json"]
    assert fallback == fast
    assert fast["repeated"] == "k"
    assert fast["sha256"] == sha256_hex(b"cni") and fast["sha512"] == sha512_hex(b"cni")
    assert fast["error"] == "JSONDecodeError: Expecting value: line 1 column 7 (char 6)"
    encoded = str(fast["encoded"])
    assert repr(jsontext.loads(encoded)) == repr(json.loads(encoded))


@pytest.mark.parametrize("plugin", ["portmap", "bandwidth", "tuning"])
def test_version_and_a_decode_error_without_the_private_modules(
    tmp_path: Path, plugin: str
) -> None:
    """The same answers, byte for byte, as the plugin gives with the private modules."""
    exe = str(wrappers(tmp_path / "bin") / plugin)
    for command, data in (("VERSION", b'{"cniVersion": "0.4.0"}'), ("DEL", b'{"name": ')):
        fallback, fast = (run_plugin(x, command, data) for x in (exe, our(plugin)))
        assert (fallback.returncode, fallback.stdout) == (fast.returncode, fast.stdout)
        assert "Traceback" not in fallback.stderr
    version = run_plugin(exe, "VERSION", b'{"cniVersion": "0.4.0"}').ok().json
    assert version == {"cniVersion": "0.4.0", "supportedVersions": ALL_VERSIONS}
    error = run_plugin(exe, "DEL", b'{"name": ').json
    assert error["code"] == 6

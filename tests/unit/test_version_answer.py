"""VERSION answers in a version the plugin speaks: the requested one when it is supported,
else the latest (never an echo of a version it does not know)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.skel import version_answer

SUPPORTED = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


@pytest.mark.parametrize(
    ("stdin", "answer"),
    [
        (b'{"cniVersion": "0.3.1"}', "0.3.1"),
        (b'{"cniVersion": "1.0.0"}', "1.0.0"),
        (b'{"cniVersion": "9.9.9"}', "1.1.0"),
        (b'{"cniVersion": "0.5.0"}', "1.1.0"),
        (b'{"cniVersion": "1.0"}', "1.1.0"),
        (b'{"cniVersion": ""}', "1.1.0"),
        (b"", "1.1.0"),
        (b"garbage", "1.1.0"),
    ],
)
def test_version_answers_in_a_supported_version(stdin: bytes, answer: str) -> None:
    assert version_answer(stdin) == {"cniVersion": answer, "supportedVersions": SUPPORTED}


def test_an_installed_plugin_answers_an_unsupported_request_in_its_latest() -> None:
    portmap = Path(sys.executable).parent / "portmap"
    proc = subprocess.run(
        [portmap], input=b'{"cniVersion": "9.9.9"}', env={"CNI_COMMAND": "VERSION"},
        capture_output=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["cniVersion"] == "1.1.0"

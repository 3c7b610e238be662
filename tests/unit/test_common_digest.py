"""common.digest: the same digests as hashlib, without loading OpenSSL into a plugin.

hashlib's import loads OpenSSL's _hashlib (time and memory in every process);
every name the plugins derive from a hash (portmap tags and chains, nft lanes, bandwidth's
ifb, tuning's long backup file names) goes through common.digest instead.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from common.digest import sha256_hex, sha512_hex

REPO = Path(__file__).resolve().parents[2]


@given(st.binary(max_size=2048))
def test_digests_equal_hashlib(data: bytes) -> None:
    assert sha256_hex(data) == hashlib.sha256(data).hexdigest()
    assert sha512_hex(data) == hashlib.sha512(data).hexdigest()


DERIVE_EVERY_NAME = """
import sys
from common.identity import Attachment, network_tag
from portmap.xtables import chain_name
from portmap.nft import Lane
from bandwidth.plan import ifb_name
from tuning.backup import Backup
att = Attachment("net", "c" * 64, "eth0")
names = [att.tag, network_tag("net"), chain_name(att), Lane(4, ("x",)).suffix,
         ifb_name("net", "c1"), Backup.file_name(Attachment("net", "c" * 1024, "eth0"))]
assert all(names), names
print(sorted(m for m in ("hashlib", "_hashlib") if m in sys.modules))
"""


def test_no_plugin_loads_hashlib_to_name_things() -> None:
    code = f"import sys; sys.path.insert(0, {str(REPO)!r})\n{DERIVE_EVERY_NAME}"
    out = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout  # fmt: skip
    assert out.strip() == "[]"

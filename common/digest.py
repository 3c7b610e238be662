"""sha512/sha256 hex digests without importing hashlib (every plugin's names and tags).

hashlib loads OpenSSL's _hashlib (paid on every container start); the builtin
modules CPython ships give the same digests for the few bytes hashed here. They are
private: where neither is importable, hashlib does the work (tests/unit/test_stdlib_fallback.py
forces that path).
"""

from __future__ import annotations

from functools import cache

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


@cache  # a failed import searches sys.path anew: each constructor is looked up once
def _constructor(name: str) -> Any:
    for module in ("_sha2", f"_{name}"):  # _sha2 since Python 3.12, _sha512 before
        try:
            return getattr(__import__(module), name)
        except (ImportError, AttributeError):
            continue
    import hashlib

    return getattr(hashlib, name)


def sha512_hex(data: bytes) -> str:
    return str(_constructor("sha512")(data).hexdigest())


def sha256_hex(data: bytes) -> str:
    return str(_constructor("sha256")(data).hexdigest())

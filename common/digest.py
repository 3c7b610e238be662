"""sha512/sha256 hex digests (every plugin's names and tags) from CPython's builtin modules,
without hashlib, which loads OpenSSL's _hashlib on every container start. They are private:
where neither is importable, hashlib does the work (tests/unit/test_stdlib_fallback.py)."""

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

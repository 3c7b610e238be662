"""JSON text in and out, as `json.loads` / `json.dumps` with their default settings, without
importing `json`: its decoder and scanner compile regular expressions when imported
(pulling in `re`, `enum`, `functools`, `collections`: a cost of every plugin start), which
CPython's C scanner and encoder in `_json`, doing the actual work, never use. This module
drives those, so the results are json's; malformed input is still json's JSONDecodeError
(a ValueError) with its message: only then is `json` imported. Where `_json` is missing or
its constructors take other arguments, `loads` and `dumps` are json's own
(tests/unit/test_stdlib_fallback.py forces that path).

One addition: an object with a key twice (the last value wins, as with json.loads) comes
back as a `RepeatedKeys` dict that names it (tuning refuses a sysctl given twice).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WHITESPACE = " \t\n\r"


class RepeatedKeys(dict[str, "Any"]):  # a string: `typing` is not imported at run time
    """A decoded object that had a key more than once: `repeated` is the first key seen again."""

    __slots__ = ("repeated",)
    repeated: str


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    marked = RepeatedKeys(obj)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked.repeated = key
            break
        seen.add(key)
    return marked


class _ScannerSettings:
    """The attributes `_json.make_scanner` reads from a json.JSONDecoder."""

    strict = True
    object_hook = None
    object_pairs_hook = staticmethod(_object)
    parse_float = float
    parse_int = int
    parse_constant = {
        "NaN": float("nan"),
        "Infinity": float("inf"),
        "-Infinity": float("-inf"),
    }.__getitem__


_scan: Callable[[str, int], tuple[Any, int]] | None
try:
    from _json import encode_basestring_ascii, make_encoder, make_scanner

    _scan = make_scanner(_ScannerSettings())  # type: ignore[arg-type]
except (ImportError, TypeError):
    _scan = None


def _encoding_of(data: bytes) -> str:
    """The encoding json.loads assumes for bytes: UTF-8, unless a BOM or a NUL byte in front
    says UTF-16 or -32 (RFC 8259 allows them too), which json.detect_encoding then tells."""
    if data[:1] not in (b"\0", b"\xef", b"\xfe", b"\xff") and data[1:2] != b"\0":
        return "utf-8"
    from json import detect_encoding

    return detect_encoding(data)


def loads(data: str | bytes) -> Any:
    """json.loads(data)."""
    if _scan is not None:
        text = data.decode(_encoding_of(data), "surrogatepass") if isinstance(data, bytes) else data
        end = len(text)
        start = 0
        while start < end and text[start] in _WHITESPACE:
            start += 1
        try:
            value, stop = _scan(text, start)
        except (StopIteration, SystemError):
            pass  # malformed (a str's BOM too): json says what is wrong, below
        else:
            while stop < end and text[stop] in _WHITESPACE:
                stop += 1
            if stop == end:
                return value
    # Without `_json`, and for malformed input: only json makes its JSONDecodeError (with
    # its message and position), as `_json` itself does once json.decoder is imported.
    import json

    return json.loads(data, object_pairs_hook=_object)


def _not_serializable(value: object) -> None:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """json.dumps(value, sort_keys=...)."""
    if _scan is None:
        import json

        return json.dumps(value, sort_keys=sort_keys)
    encode = make_encoder(
        {},  # markers: refuse circular references, as json.dumps does
        _not_serializable,
        encode_basestring_ascii,
        None,  # indent
        ": ",
        ", ",
        sort_keys,
        False,  # skipkeys
        True,  # allow_nan
    )
    return "".join(encode(value, 0))

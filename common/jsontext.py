"""JSON text in and out, as `json.loads` / `json.dumps` with their default settings, without
importing the `json` package.

`import json` is a cost of every plugin start: json.decoder and json.scanner compile
regular expressions when they are imported (pulling in `re`, `enum`, `functools`,
`collections`), although the C scanner and encoder of CPython's `_json`, which do the
actual work, never use them. This module drives that same C scanner and encoder, so the
results are the ones `json` gives. Malformed input is still a `json.JSONDecodeError` (a
ValueError) with json's message: only then is `json` imported, to make it.

`_json` is CPython's private module: where it is missing (another implementation, a build
without it) or its constructors no longer take these arguments, `loads` and `dumps` are
json's own, with the same results (tests/unit/test_stdlib_fallback.py forces that path).

One addition: an object that has a key twice (the last value wins, as with json.loads)
comes back as a `RepeatedKeys` dict that names it, which json.loads cannot tell (tuning
refuses a sysctl given twice).
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


def _error(message: str, text: str, position: int) -> ValueError:
    from json import JSONDecodeError

    return JSONDecodeError(message, text, position)


def _encoding_of(data: bytes) -> str:
    """The encoding json.loads assumes for bytes (RFC 8259 allows UTF-8, -16 and -32)."""
    if data.startswith((b"\x00\x00\xfe\xff", b"\xff\xfe\x00\x00")):
        return "utf-32"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    if data.startswith(b"\xef\xbb\xbf"):
        return "utf-8-sig"
    if len(data) >= 4:
        if not data[0]:
            return "utf-16-be" if data[1] else "utf-32-be"
        if not data[1]:
            return "utf-16-le" if data[2] or data[3] else "utf-32-le"
    elif len(data) == 2:
        if not data[0]:
            return "utf-16-be"
        if not data[1]:
            return "utf-16-le"
    return "utf-8"


def loads(data: str | bytes) -> Any:
    """json.loads(data)."""
    if _scan is None:
        import json

        return json.loads(data, object_pairs_hook=_object)
    if isinstance(data, bytes):
        text = data.decode(_encoding_of(data), "surrogatepass")
    else:
        text = data
        if text.startswith("\ufeff"):
            raise _error("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    end = len(text)
    start = 0
    while start < end and text[start] in _WHITESPACE:
        start += 1
    try:
        value, stop = _scan(text, start)
    except StopIteration as e:
        raise _error("Expecting value", text, e.value) from None
    except SystemError:
        # `_json` reports malformed input inside a value as json.decoder.JSONDecodeError,
        # which it can only make once json.decoder is imported: let json say what is wrong.
        import json

        return json.loads(data)
    while stop < end and text[stop] in _WHITESPACE:
        stop += 1
    if stop != end:
        raise _error("Extra data", text, stop)
    return value


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

"""Reading JSON objects the way Go's encoding/json does.

Runtimes written in Go decode config keys case-insensitively, and some send them
capitalised ("HostPort", "IngressRate"). Keys match ignoring case; when several do, the last
one in the document wins, as in Go. Unknown keys are ignored. Type errors become CNI error 7
naming the field's path, so the user knows what to fix.
"""

from __future__ import annotations

from common.errors import invalid_config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any, TypeVar

    T = TypeVar("T")

_MISSING: Any = object()
_TYPE_NAMES = (
    (type(None), "null"),
    (bool, "a boolean"),  # before int: bool is an int subclass in Python
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "an array"),
    (dict, "an object"),
)


def _type_name(value: object) -> str:
    return next((name for t, name in _TYPE_NAMES if isinstance(value, t)), type(value).__name__)


def split_known(raw: Mapping[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """The entries of raw whose key is not one of `known` (compared ignoring case)."""
    folded = {k.casefold() for k in known}
    return {k: v for k, v in raw.items() if k.casefold() not in folded}


class JsonObject:
    """A read-only view of one JSON object with typed, case-insensitive getters; `where` is
    its path in error messages ("runtimeConfig.portMappings[2]"). A key present with a JSON
    null counts as absent, as in Go."""

    __slots__ = ("raw", "where")

    def __init__(self, raw: Mapping[str, Any], where: str = "config") -> None:
        self.raw = raw
        self.where = where

    @classmethod
    def of(cls, value: object, where: str) -> JsonObject:
        if not isinstance(value, dict):
            raise invalid_config(f"{where} must be a JSON object, got {_type_name(value)}")
        return cls(value, where)

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        """The value Go would bind to `key`: every key matching it ignoring case is assigned
        in document order, so with both "hostPort" and "HostPort" the last one wins."""
        folded = key.casefold()
        value = None
        for k, v in self.raw.items():
            if k.casefold() == folded:
                value = v
        return default if value is None else value

    def _typed(self, key: str, types: tuple[type, ...], want: str, default: Any) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            return default
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise invalid_config(f"{self.path(key)} must be {want}, got {_type_name(value)}")
        return value

    def string(self, key: str, default: Any = None) -> Any:
        return self._typed(key, (str,), "a string", default)

    def boolean(self, key: str, default: Any = None) -> Any:
        return self._typed(key, (bool,), "a boolean (true or false)", default)

    def integer(
        self,
        key: str,
        default: Any = None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> Any:
        value = self._typed(key, (int,), "an integer", _MISSING)
        if value is _MISSING:
            return default
        if minimum is not None and value < minimum:
            raise invalid_config(f"{self.path(key)} must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise invalid_config(f"{self.path(key)} must be at most {maximum}, got {value}")
        return value

    def child(self, key: str) -> JsonObject | None:
        value = self._typed(key, (dict,), "a JSON object", None)
        return None if value is None else JsonObject(value, self.path(key))

    def array(self, key: str) -> list[Any] | None:
        value: list[Any] | None = self._typed(key, (list,), "a JSON array", None)
        return value

    def objects(self, key: str) -> list[JsonObject]:
        """A JSON array of objects, each wrapped; absent means empty."""
        items = self.array(key) or []
        return [JsonObject.of(item, f"{self.path(key)}[{i}]") for i, item in enumerate(items)]


# ---------------------------------------------------------------------------- one value
# Checks of one JSON value that is present and not null, as the record codecs use them
# (common.records.Key): each returns the value or raises ValueError saying what it is not
# (the caller puts the key in front of it).


def _of_type(kind: type[T], what: str) -> Callable[[Any], T]:
    def decode(value: Any) -> T:
        if not isinstance(value, kind):
            raise ValueError(f"is not {what}")
        return value

    return decode


text = _of_type(str, "a string")
flag = _of_type(bool, "true or false")
listed = _of_type(list, "a list")


def non_empty(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("is not a non-empty string")
    return value


def integer(low: int, high: int) -> Callable[[Any], int]:
    def decode(value: Any) -> int:
        if type(value) is not int or not low <= value <= high:  # (a bool is an int too)
            raise ValueError(f"is not an integer from {low} to {high}")
        return value

    return decode


def one_of(*choices: str) -> Callable[[Any], str]:
    def decode(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"is none of {', '.join(map(repr, choices))}")
        return str(value)

    return decode

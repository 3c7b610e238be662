"""Base of the plain value classes (configs, plans, kernel observations): what `@dataclass`
gives, without importing `dataclasses` (which imports `inspect`, `re` and more, on every
container start). A class that only declares its fields (`index: int`, `up: bool = True`)
gets `__slots__`, an `__init__` taking them in that order (`field(default_factory=list)`
for a fresh list per instance), equality, hashing, a repr and `replace`; `OrderedValue`
adds ordering. Type checkers see the same through `dataclass_transform` (PEP 681). A
class may still write its own `__init__`, or narrow what equality compares (`_fields`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is costly to import (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, ClassVar, Self, TypeVar, dataclass_transform

    T = TypeVar("T")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda cls: cls


_MISSING = object()


class _Factory:
    """A `field`'s default_factory."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], T]) -> T:
    """A default made afresh for each instance (a list or dict must not be shared)."""
    return _Factory(default_factory)  # type: ignore[return-value]


@dataclass_transform(eq_default=True, field_specifiers=(field,))
class _ValueMeta(type):
    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> _ValueMeta:
        annotations = ns.get("__annotations__", {})
        own = [f for f, kind in annotations.items() if not str(kind).startswith("ClassVar")]
        base: Mapping[str, Any] = next(
            (b.__dict__ for b in bases if "_field_names" in b.__dict__), {}
        )
        inherited: tuple[str, ...] = base.get("_field_names", ())
        defaults = dict(base.get("_defaults", {}))
        for attr in own:
            value = ns.pop(attr, _MISSING)
            if value is not _MISSING:
                defaults[attr] = value
        ns.setdefault("__slots__", tuple(own))
        ns["_field_names"] = inherited + tuple(own)
        ns["_defaults"] = defaults
        return super().__new__(mcs, name, bases, ns)


class Value(metaclass=_ValueMeta):
    __slots__ = ()
    _field_names: ClassVar[tuple[str, ...]]
    _defaults: ClassVar[dict[str, object]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = self._field_names
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}() takes {len(names)} fields, got {len(args)}")
        for name, value in zip(names, args, strict=False):
            setattr(self, name, value)
        for name in names[len(args) :]:
            value = kwargs.pop(name, _MISSING)
            if value is _MISSING:
                value = self._defaults.get(name, _MISSING)
                if value is _MISSING:
                    raise TypeError(f"{type(self).__name__}() is missing field {name!r}")
                if type(value) is _Factory:
                    value = value.make()
            setattr(self, name, value)
        if kwargs:
            raise TypeError(f"{type(self).__name__}() got unknown fields {sorted(kwargs)}")

    def _fields(self) -> tuple[object, ...]:
        """What equality, hashing and ordering compare (a class may leave a field out)."""
        return tuple(getattr(self, name) for name in self._field_names)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def fields(self) -> dict[str, object]:
        """The declared fields by name (what `dataclasses.asdict` gave, one level deep)."""
        return {name: getattr(self, name) for name in self._field_names}

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes` (what `dataclasses.replace` does)."""
        return type(self)(**{**self.fields(), **changes})

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._field_names)
        return f"{type(self).__qualname__}({fields})"


class OrderedValue(Value):
    """A value that sorts by its fields in the order they are declared (`<`: what sorting
    uses; `>` is its reflection)."""

    __slots__ = ()

    def __lt__(self, other: OrderedValue) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() < other._fields()

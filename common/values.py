"""Base of the plain value classes (configs, plans, kernel observations).

What `@dataclass` gave them, without importing `dataclasses` (which imports `inspect`,
`re` and more: ~10 ms on every container start): each class lists its fields in
`__slots__`, declares them with their types in the class body, and sets them in an
explicit `__init__`; equality, hashing, ordering and the repr come from here and take the
declared fields in the order of their declarations, as a dataclass's would.
"""

from __future__ import annotations


class Value:
    __slots__ = ()

    def _names(self) -> list[str]:
        return list(vars(type(self)).get("__annotations__", ()))

    def _fields(self) -> tuple[object, ...]:
        """What equality, hashing and ordering compare (a class may leave a field out)."""
        return tuple(getattr(self, name) for name in self._names())

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def fields(self) -> dict[str, object]:
        """The declared fields by name (what `dataclasses.asdict` gave, one level deep)."""
        return {name: getattr(self, name) for name in self._names()}

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._names())
        return f"{type(self).__qualname__}({fields})"


class OrderedValue(Value):
    """A value that sorts by its fields, in the order they are declared."""

    __slots__ = ()

    def __lt__(self, other: OrderedValue) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() < other._fields()

    def __le__(self, other: OrderedValue) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() <= other._fields()

    def __gt__(self, other: OrderedValue) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() > other._fields()

    def __ge__(self, other: OrderedValue) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() >= other._fields()

"""Records: what the store keeps of one attachment, and how it is spelled in JSON,
declared once per record type: a common.values.Value with the owner (`network`,
`container_id`, `ifname`) and `committed` (common.attachment) from `Record`, its own
fields, and in `KEYS` the JSON key and decoder of each (`Key("device", non_empty)`).

An absent key (or null) gives the field's default, but for a `required` key of a strict
record, which is unusable without it. A value its decoder refuses (ValueError) makes the
whole record unusable, naming the key (the store then ignores the file, DEL forgets it,
GC removes it), unless the type is `TOLERANT`: then the field takes its default, for
files that other programs write too. A field whose value (or encoding) is None is not
written.

Files are named after the attachment's tag (`<network hash>-<attachment hash>.json`), so
that GC can tell a network's files by their names alone; a type may keep another name
(tuning keeps Go's, for takeover).
"""

from __future__ import annotations

from common import jsontext as json
from common.identity import Attachment
from common.jsonobj import flag, non_empty
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, Self, TypeVar
    from typing import Generic as Generic

    R = TypeVar("R", bound="Record")  # a record type: the store's and the engine's
    Keys = dict[str, "Key | Flat"]
else:

    class Generic:
        """typing.Generic to type checkers; at run time `Generic[R]` is this empty base
        (typing is not imported on a plugin's call path)."""

        __slots__ = ()

        def __class_getitem__(cls, _: object) -> type:
            return cls

    R = "a record type"


def _same(value: Any) -> Any:
    return value


class Key(Value):
    """A field's JSON key, its decoder, (when the JSON is not the value) its encoder, and
    whether a strict record is unusable without it (else its absence is the default)."""

    json: str
    decode: Callable[[Any], Any]
    encode: Callable[[Any], Any] = _same
    required: bool = False


class Flat(Value):
    """A field that is a Value of its own, whose keys sit in the record's object."""

    of: type[Value]
    keys: Keys


# A strict record is nobody's without its owner.
BASE_KEYS: Keys = {
    "network": Key("network", non_empty, required=True),
    "container_id": Key("containerID", non_empty, required=True),
    "ifname": Key("ifname", non_empty, required=True),
    "committed": Key("committed", flag),
}


def _encode(value: Value, keys: Keys, out: dict[str, Any]) -> None:
    for field, key in keys.items():
        item = getattr(value, field)
        if isinstance(key, Flat):
            _encode(item, key.keys, out)
            continue
        if item is not None:
            item = key.encode(item)
        if item is not None:
            out[key.json] = item


def _decode(of: type[Value], raw: dict[str, Any], keys: Keys, tolerant: bool) -> Any:
    fields: dict[str, Any] = {}
    for field, key in keys.items():
        if isinstance(key, Flat):
            fields[field] = _decode(key.of, raw, key.keys, tolerant)
            continue
        value = raw.get(key.json)
        if value is None:
            if key.required and not tolerant:
                raise ValueError(f"{key.json} is missing")
            continue
        try:
            fields[field] = key.decode(value)
        except ValueError as e:
            if not tolerant:
                raise ValueError(f"{key.json} {e}") from None
    return of(**fields)


class Record(Value):
    """The base of every record type (see the module's docstring)."""

    network: str = ""
    container_id: str = ""
    ifname: str = ""
    committed: bool = False
    KEYS: ClassVar[Keys] = {}
    TOLERANT: ClassVar[bool] = False

    @property
    def attachment(self) -> Attachment:
        return Attachment(self.network, self.container_id, self.ifname)

    @staticmethod
    def file_name(attachment: Attachment) -> str:
        return attachment.tag + ".json"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        _encode(self, BASE_KEYS | self.KEYS, out)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Self | None:
        """The record in `raw` (None when it is not even an object); ValueError when one
        of its values is not as `to_json` writes it (see the module's docstring)."""
        if not isinstance(raw, dict):
            return None
        record: Self = _decode(cls, raw, BASE_KEYS | cls.KEYS, cls.TOLERANT)
        return record


def decode(data: bytes) -> tuple[Any, str]:
    """(content, "") of a state file's bytes, or (None, why) for bytes that are not JSON we
    can decode: a damaged or planted file must not make every DEL fail (RecursionError:
    thousands of nested arrays; ValueError: not JSON, not UTF-8)."""
    try:
        return json.loads(data), ""
    except (ValueError, RecursionError) as e:
        return None, f"{type(e).__name__}: {e}"

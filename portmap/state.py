"""portmap's record in the attachment store: what each attachment installed, typed by
its backend (NftRecord, XtablesRecord) and decoded by the store.

The kernel stays the authority on ownership (every nft element and iptables rule names
its owner); the record only says where to look, so DEL and a repeated ADD touch this
attachment's objects without listing everybody's. It is written *before* a transaction
as the union of what may exist afterwards, so a plugin killed mid-ADD leaves a file that
still covers whatever reached the kernel.
"""

from __future__ import annotations

from common.env import plugin_dir
from common.errors import CONFLICT, CniError
from common.identity import network_tag
from common.jsonobj import listed, text
from common.records import Key, Record
from common.store import AttachmentStore
from common.values import Value
from portmap.config import CHAIN_PREFIX

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from common.identity import Attachment
    from common.log import Log

PLUGIN = "portmap"
VARIANTS = ("nft", "legacy")  # the iptables tools' variants, as records name them


def store(log: Log | None = None) -> Store:
    return AttachmentStore(plugin_dir(PLUGIN), Recorded, log)


class Recorded(Record):
    """An attachment's record, decoded as its backend's (NftRecord, XtablesRecord); one of
    neither reads as this. Tolerant: what is not as written reads as "" or is left out
    (the kernel decides). Named by the attachment's tag (Attachment.tag), which
    its kernel objects carry too."""

    backend: str = ""
    TOLERANT = True
    KEYS = {"backend": Key("backend", text)}

    @classmethod
    def from_json(cls, raw: Any) -> Any:
        backend = raw.get("backend") if isinstance(raw, dict) else None
        kind = _KINDS.get(backend) if isinstance(backend, str) else None
        return super().from_json(raw) if kind in (None, cls) else kind.from_json(raw)


# What nftables set names and element keys of ours are made of (addresses, protocol
# names, ports, " . " between them). Keys read back from a record or a listing go into
# `get`/`delete element` text, so one holding anything else (a quote, a brace, a
# newline) is not ours.
_SET_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
_KEY_CHARS = frozenset("0123456789abcdef.:/ tpus")


def plain(name: Any, key: Any) -> bool:
    if not (isinstance(name, str) and isinstance(key, str) and name and key):
        return False
    return set(name) <= _SET_NAME_CHARS and set(key) <= _KEY_CHARS


def _elements(value: Any) -> tuple[tuple[str, str], ...]:
    pairs = [i for i in listed(value) if isinstance(i, list) and len(i) == 2]
    return tuple((name, key) for name, key in pairs if plain(name, key))


class NftRecord(Recorded):
    """(set, key) of each element the attachment owns, the plain ones."""

    backend: str = "nftables"
    elements: tuple[tuple[str, str], ...] = ()
    KEYS = {**Recorded.KEYS, "elements": Key("objects", _elements, lambda e: [*map(list, e)])}


class Chain(Value):
    """One family's chain of an attachment, in that variant's nat table."""

    family: int
    name: str
    variant: str


def _chains(value: Any) -> tuple[Chain, ...]:
    out = []
    for item in listed(value):
        # (family, chain, variant); anything else is not as written, and not ours
        if isinstance(item, list) and len(item) == 3 and item[0] in (4, 6):
            family, name, variant = item
            ours = isinstance(name, str) and name.startswith(CHAIN_PREFIX) and len(name) <= 28
            if ours and variant in VARIANTS:
                out.append(Chain(int(family), name, str(variant)))
    return tuple(out)


def _chains_json(chains: tuple[Chain, ...]) -> list[list[Any]]:
    return [[c.family, c.name, c.variant] for c in chains]


class XtablesRecord(Recorded):
    """The attachment's chain of each family."""

    backend: str = "iptables"
    chains: tuple[Chain, ...] = ()
    KEYS = {**Recorded.KEYS, "chains": Key("objects", _chains, _chains_json)}


_KINDS: dict[str, type[Recorded]] = {"nftables": NftRecord, "iptables": XtablesRecord}


Store = AttachmentStore[Recorded]


_HEX = frozenset("0123456789abcdef")


def _file_owner(store: Store, tag: str) -> Attachment | None:
    """The owner the record of `tag` names, when it is the attachment that file is named
    after (tag: an Attachment.tag, which its kernel objects' comments start with)."""
    net, dash, att = tag.partition("-")
    if not (dash and len(net) == 8 and len(att) == 16 and set(net + att) <= _HEX):
        return None  # not a tag: names no file of ours
    entry = store.read(f"{tag}.json")
    if entry is None or not (entry.network and entry.container_id and entry.ifname):
        return None
    try:
        return entry.attachment if store.file_of(entry.attachment) == f"{tag}.json" else None
    except CniError:  # an owner no file could be named after: not this file's
        return None


def owner_name(store: Store, comment: str) -> str:
    """'network/container/ifname' of the attachment whose kernel objects carry `comment`
    (portmap.config.comment: its tag, then a readable name), as well as we know it."""
    tag, _, readable = comment.partition(" ")
    owner = _file_owner(store, tag)
    return str(owner) if owner else readable or tag


def owner_network(store: Store, comment: str) -> str:
    """The network of the attachment whose kernel objects carry `comment`, "" when nothing
    proves it. Never the tag's first part alone: that is a 32-bit hash of the name, which
    two names can share. Its record says it, else the readable part of the comment, which
    starts with the network's name and a "/" (names are plain, without "/", and pass into
    comments unchanged) unless it was cut shorter."""
    tag, _, readable = comment.partition(" ")
    owner = _file_owner(store, tag)
    if owner is not None:
        return owner.network
    network, slash, _ = readable.partition("/")
    return network if slash else ""


def port_taken(where: str, owner: str) -> CniError:
    """The conflict of an ADD whose host port another attachment maps already."""
    return CniError(
        CONFLICT,
        f"host port {where} is already mapped by attachment {owner}",
        "remove that mapping first (or use another host port); nothing was changed",
    )


def unusable_prefix(store: Store, network: str) -> str | None:
    """What the names of the files start with that GC of `network` removes when no call
    can use them (common.store's `unusable`): the network's tag; None (none goes) while a
    record of another network's shares that tag (32 bits of a hash: two names can), as
    nothing then says whose such a file was. Their DEL forgets them either way."""
    prefix = network_tag(network) + "-"
    for name in store.names():
        if name.startswith(prefix):
            record = store.read(name)
            if record is not None and record.network not in ("", network):
                return None
    return prefix

"""portmap's entry in the attachment store: what each attachment installed.

The kernel stays the authority on ownership (every nft element and iptables rule names
its owner); the entry only says where to look, so DEL and a repeated ADD touch this
attachment's objects without listing everybody's. It is written *before* a transaction
as the union of what may exist afterwards, so a plugin killed mid-ADD leaves a file that
still covers whatever reached the kernel.
"""

from __future__ import annotations

from common.env import plugin_dir
from common.errors import CONFLICT, CniError
from common.jsonobj import listed, text
from common.records import Key, Record
from common.store import AttachmentStore
from common.values import field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from common.log import Log

PLUGIN = "portmap"


def store(log: Log | None = None) -> Store:
    return AttachmentStore(plugin_dir(PLUGIN), Recorded, log)


class Recorded(Record):
    """`objects` as the backend spells them. Tolerant: what is not as written reads as ""
    or empty (the kernel decides). Named by the attachment's tag (Attachment.tag), which
    its kernel objects carry too."""

    backend: str = ""
    objects: list[Any] = field(default_factory=list)
    TOLERANT = True
    KEYS = {"backend": Key("backend", text), "objects": Key("objects", listed)}


Store = AttachmentStore[Recorded]


def owner_name(store: Store, comment: str) -> str:
    """'network/container/ifname' of the attachment whose kernel objects carry `comment`
    (portmap.config.comment: its tag, then a readable name), as well as we know it."""
    tag, _, readable = comment.partition(" ")
    entry = store.read(f"{tag}.json")
    if entry is not None and entry.network and entry.container_id and entry.ifname:
        return str(entry.attachment)
    return readable or tag


_HEX = frozenset("0123456789abcdef")


def _is_tag(tag: str) -> bool:
    """An Attachment.tag: 8 hex digits, '-', 16 hex digits (safe to name a file by)."""
    net, dash, att = tag.partition("-")
    return bool(dash) and len(net) == 8 and len(att) == 16 and set(net + att) <= _HEX


def owner_network(store: Store, comment: str) -> str:
    """The network of the attachment whose kernel objects carry `comment`
    (portmap.config.comment), "" when nothing proves it. Never the tag's first part alone:
    that is a 32-bit hash of the name, which two names can share. The attachment's
    record says it, when its owner is the one its file is named after; else the readable
    part of the comment, which starts with the network's name and a "/" (names are plain,
    without "/", and pass into comments unchanged) unless it was cut shorter."""
    tag, _, readable = comment.partition(" ")
    if _is_tag(tag):
        entry = store.read(f"{tag}.json")
        if entry is not None and entry.network and entry.container_id and entry.ifname:
            try:
                if store.file_of(entry.attachment) == f"{tag}.json":
                    return str(entry.network)
            except CniError:  # an owner no file could be named after: not this file's
                pass
    network, slash, _ = readable.partition("/")
    return network if slash else ""


def forgetting(tags: set[str]) -> Callable[[Recorded], None]:
    """A teardown for the engine's GC sweep: the tag of each stale record it forgets
    goes into `tags` (of the network swept: the sweep picks its records by their
    network), for the kernel sweep that follows."""

    def teardown(record: Recorded) -> None:
        tags.add(record.attachment.tag)

    return teardown


def port_taken(store: Store, comment: str, where: str) -> CniError:
    """The conflict of an ADD whose host port `where` (config.host_ports) the attachment
    with `comment` maps already."""
    return CniError(
        CONFLICT,
        f"host port {where} is already mapped by attachment {owner_name(store, comment)}",
        "remove that mapping first (or use another host port); nothing was changed",
    )

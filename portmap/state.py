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


def port_taken(store: Store, comment: str, where: str) -> CniError:
    """The conflict of an ADD whose host port `where` (config.host_ports) the attachment
    with `comment` maps already."""
    return CniError(
        CONFLICT,
        f"host port {where} is already mapped by attachment {owner_name(store, comment)}",
        "remove that mapping first (or use another host port); nothing was changed",
    )

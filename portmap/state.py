"""portmap's entry in the attachment store: what each attachment installed.

The kernel stays the authority on ownership (every nft element and iptables rule names
its owner); the entry only says where to look, so DEL and a repeated ADD touch this
attachment's objects without listing everybody's. It is written *before* a transaction
as the union of what may exist afterwards, so a plugin killed mid-ADD leaves a file that
still covers whatever reached the kernel.
"""

from __future__ import annotations

from common.errors import CONFLICT, CniError
from common.state import AttachmentStore, plugin_dir
from common.values import Value
from portmap.config import Attachment

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from common.log import Log

PLUGIN = "portmap"


def store(log: Log | None = None) -> AttachmentStore:
    return AttachmentStore(plugin_dir(PLUGIN), Recorded, log)


class Recorded(Value):
    """`objects` as the backend spells them; `committed`: they are known to exist and be
    ours (False: an intent, written before a transaction that may not have happened)."""

    network: str
    container_id: str
    ifname: str
    backend: str
    objects: list[Any]
    committed: bool = True

    @staticmethod
    def file_name(network: str, container_id: str, ifname: str) -> str:
        return f"{Attachment(network, container_id, ifname).tag}.json"

    def to_json(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "containerID": self.container_id,
            "ifname": self.ifname,
            "backend": self.backend,
            "objects": self.objects,
            "committed": self.committed,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Recorded | None:
        """Tolerant: what is not as written reads as "" or empty (the kernel decides)."""
        if not isinstance(raw, dict):
            return None

        def text(key: str) -> str:
            value = raw.get(key)
            return value if isinstance(value, str) else ""

        objects = raw.get("objects")
        return cls(
            text("network"),
            text("containerID"),
            text("ifname"),
            text("backend"),
            objects if isinstance(objects, list) else [],
            raw.get("committed") is True,
        )


def owner_name(store: AttachmentStore, comment: str) -> str:
    """'network/container/ifname' of the attachment whose kernel objects carry `comment`
    (Attachment.comment: its tag, then a readable name), as well as we know it."""
    tag, _, readable = comment.partition(" ")
    entry = store.read(f"{tag}.json")
    if entry is not None and entry.network and entry.container_id and entry.ifname:
        return f"{entry.network}/{entry.container_id}/{entry.ifname}"
    return readable or tag


def port_taken(store: AttachmentStore, comment: str, where: str) -> CniError:
    """The conflict of an ADD whose host port `where` (config.host_ports) the attachment
    with `comment` maps already."""
    return CniError(
        CONFLICT,
        f"host port {where} is already mapped by attachment {owner_name(store, comment)}",
        "remove that mapping first (or use another host port); nothing was changed",
    )

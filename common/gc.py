"""GC input: the attachments a runtime says are still alive (which of the others were
still being ADDed when GC started, AttachmentStore.sweep says)."""

from __future__ import annotations

from common.errors import invalid_config
from common.identity import Attachment

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.jsonobj import JsonObject

VALID_ATTACHMENTS = "cni.dev/valid-attachments"
LEGACY_ATTACHMENTS = "cni.dev/attachments"


def valid_attachments(network: str, body: JsonObject) -> set[Attachment]:
    """cni.dev/valid-attachments (or the legacy cni.dev/attachments) of `network`'s config.
    Neither key means "no attachment is valid", as the spec says of an empty list: a
    plugin removes everything it owns on this network."""
    key = VALID_ATTACHMENTS if body.get(VALID_ATTACHMENTS) is not None else LEGACY_ATTACHMENTS
    out: set[Attachment] = set()
    for entry in body.objects(key):
        cid = entry.string("containerID", "")
        ifname = entry.string("ifname", "")
        if not cid or not ifname:
            raise invalid_config(f"{entry.where} needs both 'containerID' and 'ifname'")
        out.add(Attachment(network, cid, ifname))
    return out

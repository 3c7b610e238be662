"""GC input: the attachments a runtime says are still alive.

Which of the others were still being ADDed when GC started, the attachment store says
(common/state.py, AttachmentStore.sweep).
"""

from __future__ import annotations

from common.errors import invalid_config
from common.jsonobj import JsonObject
from common.values import OrderedValue

VALID_ATTACHMENTS = "cni.dev/valid-attachments"
LEGACY_ATTACHMENTS = "cni.dev/attachments"


class AttachmentId(OrderedValue):
    """Container id and ifname; the network is the config's name."""

    container_id: str
    ifname: str


def valid_attachments(body: JsonObject) -> set[AttachmentId]:
    """Parse cni.dev/valid-attachments (or the legacy cni.dev/attachments) from a config.

    Neither key present means "no attachment is valid"; that is what the spec says a GC
    with an empty list means, so a plugin removes everything it owns on this network.
    """
    key = VALID_ATTACHMENTS if body.get(VALID_ATTACHMENTS) is not None else LEGACY_ATTACHMENTS
    out: set[AttachmentId] = set()
    for entry in body.objects(key):
        cid = entry.string("containerID", "")
        ifname = entry.string("ifname", "")
        if not cid or not ifname:
            raise invalid_config(f"{entry.where} needs both 'containerID' and 'ifname'")
        out.add(AttachmentId(cid, ifname))
    return out

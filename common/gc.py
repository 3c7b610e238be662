"""GC input: the attachments a runtime says are still alive, and which of the rest are
still being ADDed.

A runtime lists what it knows; an attachment whose ADD has not returned yet is not in
that list, yet it is about to be alive. GC cannot tell it from a leak by the list, so it
asks the state files: every ADD (re)writes its attachment's file at its end, under the
plugin's lock that GC takes too. A file that appeared or was replaced after GC started
belongs to an ADD that was in flight then: GC leaves that attachment alone, and the next
GC (whose list was made after the ADD returned) decides. A file exactly as it was when GC
started belongs to a call that had ended before: fair game.
"""

from __future__ import annotations

import os

from common.errors import invalid_config
from common.jsonobj import JsonObject
from common.values import OrderedValue

VALID_ATTACHMENTS = "cni.dev/valid-attachments"
LEGACY_ATTACHMENTS = "cni.dev/attachments"


class AttachmentId(OrderedValue):
    """Container id and ifname; the network is the config's name."""

    __slots__ = ("container_id", "ifname")

    container_id: str
    ifname: str

    def __init__(self, container_id: str, ifname: str) -> None:
        self.container_id = container_id
        self.ifname = ifname


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


Stamps = dict[str, tuple[int, int]]


def stamps(directory: str) -> Stamps:
    """name -> (inode, mtime) of each state file in `directory`, taken when GC starts,
    before it waits for the lock that an ADD in flight may hold."""
    out: Stamps = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out
    for name in names:
        if name.endswith(".json"):
            try:
                st = os.stat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            out[name] = (st.st_ino, st.st_mtime_ns)
    return out


def written_since(directory: str, before: Stamps) -> set[str]:
    """The state files (names) created or replaced since `before` was taken: those of ADDs
    in flight when GC started. Call it holding the lock that ADD writes under."""
    now = stamps(directory)
    return {name for name, stamp in now.items() if before.get(name) != stamp}

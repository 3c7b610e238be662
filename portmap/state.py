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
from common.state import AttachmentStore, Key, Record
from common.values import field
from portmap.config import Attachment, network_tag

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from common.gc import AttachmentId
    from common.log import Log
    from common.state import Stamps

PLUGIN = "portmap"


def store(log: Log | None = None) -> AttachmentStore:
    return AttachmentStore(plugin_dir(PLUGIN), Recorded, log)


class Recorded(Record):
    """`objects` as the backend spells them. Tolerant: what is not as written reads as ""
    or empty (the kernel decides). Named by the attachment's tag (common.state.tagged_name),
    which its kernel objects carry too."""

    backend: str = ""
    objects: list[Any] = field(default_factory=list)
    TOLERANT = True
    KEYS = {"backend": Key("backend", text), "objects": Key("objects", listed)}


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


def sweep(
    store: AttachmentStore,
    backend: str,
    network: str,
    valid: set[AttachmentId],
    before: Stamps,
) -> Callable[[str], bool]:
    """The start of a backend's GC, holding its lock: forgets `backend`'s stale entries of
    `network` and returns whether an owner tag found in the kernel is stale (of `network`,
    neither valid nor of an ADD in flight, see AttachmentStore.sweep)."""
    stale, in_flight = store.sweep(network, valid, before)
    for recorded in stale:
        if recorded.backend == backend:
            store.forget(recorded)
    keep = {Attachment(network, a.container_id, a.ifname).tag for a in [*valid, *in_flight]}
    prefix = network_tag(network) + "-"
    return lambda tag: tag.startswith(prefix) and tag not in keep


def drop_unusable(store: AttachmentStore, network: str, before: Stamps, log: Log) -> None:
    """GC: remove `network`'s state files that no call can use (AttachmentStore.unusable;
    a file's name starts with its network's tag). Outside the backends' locks, which
    guard one backend each while such a file says neither: should an ADD replace it
    between the check and the removal, that attachment is left without an entry, which
    DEL and GC tolerate (the kernel's owner tags stay the authority)."""
    for name, problem in store.unusable(before, network_tag(network) + "-"):
        store.remove(name)
        log.warning(f"gc: removed unusable state file {store.path(name)}: {problem}")

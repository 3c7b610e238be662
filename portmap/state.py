"""What each attachment installed, remembered between ADD and DEL.

The kernel stays the authority on ownership (every nft element and iptables rule names
its owner); the state file only says where to look, so DEL and a repeated ADD touch this
attachment's objects without listing everybody's. It is written *before* a transaction
as the union of what may exist afterwards, so a plugin killed mid-ADD leaves a file that
still covers whatever reached the kernel.
"""

from __future__ import annotations

from common.state import StateDir
from portmap.config import Attachment

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from common.gc import Stamps

PLUGIN = "portmap"


def state_dir() -> StateDir:
    return StateDir.for_plugin(PLUGIN)


def _name(attachment: Attachment) -> str:
    return f"{attachment.tag}.json"


def read(sd: StateDir, attachment: Attachment) -> dict[str, Any] | None:
    data = sd.read_json(_name(attachment))
    return data if isinstance(data, dict) else None


def write(
    sd: StateDir, attachment: Attachment, backend: str, objects: list[Any], committed: bool = True
) -> None:
    """`committed`: the objects are known to exist and be ours (False: an intent, written
    before a transaction that may not have happened)."""
    sd.write_json(
        _name(attachment),
        {
            "network": attachment.network,
            "containerID": attachment.container_id,
            "ifname": attachment.ifname,
            "backend": backend,
            "objects": objects,
            "committed": committed,
        },
    )


def remove(sd: StateDir, attachment: Attachment) -> None:
    sd.remove(_name(attachment))


def owner_name(sd: StateDir, tag: str, fallback: str) -> str:
    """'network/container/ifname' of the attachment with this tag, as well as we know it."""
    data = sd.read_json(f"{tag}.json")
    if isinstance(data, dict) and all(
        isinstance(data.get(k), str) for k in ("network", "containerID", "ifname")
    ):
        return f"{data['network']}/{data['containerID']}/{data['ifname']}"
    return fallback


def tags_of_network(sd: StateDir, network_tag: str) -> list[str]:
    return [n[: -len(".json")] for n in sd.names() if n.startswith(network_tag + "-")]


def in_flight_tags(sd: StateDir, before: Stamps) -> set[str]:
    """Tags of the attachments whose ADD was running when GC started (common/gc.py)."""
    from common.gc import written_since

    return {n[: -len(".json")] for n in written_since(sd.directory, before)}


def remove_tag(sd: StateDir, tag: str) -> None:
    sd.remove(f"{tag}.json")

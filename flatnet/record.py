"""flatnet's record in the attachment store: what an ADD made, so that DEL (with or
without the container's namespace) and GC remove exactly that: the host veth, the
masquerade (and whether this attachment still holds its network's), the lease."""

from __future__ import annotations

from common import records
from common.env import plugin_dir
from common.jsonobj import listed, non_empty, one_of, text
from common.records import Key
from common.store import AttachmentStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from common.log import Log

PLUGIN = "flatnet"


def store(log: Log | None = None) -> AttachmentStore[Record]:
    return AttachmentStore(plugin_dir(PLUGIN), Record, log)


def _cidrs(value: Any) -> tuple[str, ...]:
    items = listed(value)
    if not all(isinstance(item, str) and "/" in item for item in items):
        raise ValueError("is not a list of addresses with prefix lengths")
    return tuple(items)


def _cidrs_json(value: tuple[str, ...]) -> list[str] | None:
    return list(value) or None


class Record(records.Record):
    """Strict: a record that is not as written would make DEL delete what is not ours."""

    bridge: str = ""
    host_veth: str = ""
    netns: str = ""
    ipam: str = ""  # the IPAM type whose lease DEL releases ("": none)
    masq: str = ""  # the masquerade backend ("": none)
    addresses: tuple[str, ...] = ()  # the container's, once IPAM gave them
    KEYS = {
        "bridge": Key("bridge", non_empty, required=True),
        "host_veth": Key("hostVeth", non_empty, required=True),
        "netns": Key("netns", text),
        "ipam": Key("ipam", text),
        "masq": Key("masq", one_of("", "nftables", "iptables")),
        "addresses": Key("addresses", _cidrs, _cidrs_json),
    }

"""bandwidth's entry in the attachment store: where an attachment was shaped and what it
created there.

The kernel alone cannot tell DEL whether the ingress qdisc on a host veth was made by us
or was already there (someone else's, to be kept), nor which device was shaped once the
prevResult is gone. The store (common.state) keeps one Record per attachment, under
<state root>/bandwidth/. The ifb additionally carries its owner in its alias, so GC still
finds leftovers when a state file is lost.
"""

from __future__ import annotations

from bandwidth.model import CONTAINER, HOST
from bandwidth.plan import Ownership
from common import jsontext as json
from common.digest import sha256_hex
from common.env import plugin_dir
from common.state import AttachmentStore
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from common.log import Log

PLUGIN = "bandwidth"
# The keys of a record that must hold a non-empty string.
_NAMES = ("network", "containerID", "ifname", "mode", "device", "ifb")
_OWNS = ("ownsDeviceTbf", "ownsIngressQdisc")  # optional: absent is False
MAX_IFINDEX = 2**31 - 1  # the kernel's ifindex is a positive int


def store(log: Log | None = None) -> AttachmentStore:
    return AttachmentStore(plugin_dir(PLUGIN), Record, log)


class Record(Value):
    network: str
    container_id: str
    ifname: str
    mode: str  # HOST or CONTAINER
    device: str  # the shaped device's name ...
    device_index: int  # ... and ifindex, so that a reused name is not mistaken for it
    netns: str  # the container netns (where CONTAINER mode shapes)
    ifb: str
    ownership: Ownership

    @staticmethod
    def file_name(network: str, container_id: str, ifname: str) -> str:
        # Hashed: network names and container ids may both contain "_", so joining them
        # would not be unambiguous; the file itself holds the clear names.
        key = json.dumps([network, container_id, ifname]).encode()
        return sha256_hex(key)[:40] + ".json"

    def to_json(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "containerID": self.container_id,
            "ifname": self.ifname,
            "mode": self.mode,
            "device": self.device,
            "deviceIndex": self.device_index,
            "netns": self.netns,
            "ifb": self.ifb,
            "ownsDeviceTbf": self.ownership.device_tbf,
            "ownsIngressQdisc": self.ownership.ingress_qdisc,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Record | None:
        """A record; None for what is not even an object. Nothing is coerced: a value that
        is not as to_json writes it is a ValueError naming it (the store then treats the
        file as unusable, which DEL and GC remove), where a "deviceIndex" of 1e400 or -1
        or an "ownsDeviceTbf" of "false" would make DEL look at, or remove, what is not
        ours."""
        if not isinstance(raw, dict):
            return None
        for key in _NAMES:
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise ValueError(f"{key} is not a non-empty string")
        if raw["mode"] not in (HOST, CONTAINER):
            raise ValueError(f"mode is neither {HOST!r} nor {CONTAINER!r}")
        index = raw.get("deviceIndex")
        if type(index) is not int or not 0 < index <= MAX_IFINDEX:  # (a bool is an int too)
            raise ValueError(f"deviceIndex is not an ifindex (1 to {MAX_IFINDEX})")
        netns = raw.get("netns", "")
        if not isinstance(netns, str):
            raise ValueError("netns is not a string")
        owns = [raw.get(key, False) for key in _OWNS]
        if not all(isinstance(v, bool) for v in owns):
            raise ValueError(f"{' or '.join(_OWNS)} is not true or false")
        return cls(
            network=raw["network"],
            container_id=raw["containerID"],
            ifname=raw["ifname"],
            mode=raw["mode"],
            device=raw["device"],
            device_index=index,
            netns=netns,
            ifb=raw["ifb"],
            ownership=Ownership(*owns),
        )

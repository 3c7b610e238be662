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
from common.state import AttachmentStore, plugin_dir
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PLUGIN = "bandwidth"


def store() -> AttachmentStore:
    return AttachmentStore(plugin_dir(PLUGIN), Record)


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
        """A record, or None for anything that is not one (a foreign or damaged file)."""
        if not isinstance(raw, dict):
            return None
        try:
            record = cls(
                network=str(raw["network"]),
                container_id=str(raw["containerID"]),
                ifname=str(raw["ifname"]),
                mode=str(raw["mode"]),
                device=str(raw["device"]),
                device_index=int(raw["deviceIndex"]),
                netns=str(raw.get("netns", "")),
                ifb=str(raw["ifb"]),
                ownership=Ownership(
                    bool(raw.get("ownsDeviceTbf")), bool(raw.get("ownsIngressQdisc"))
                ),
            )
        except (KeyError, TypeError, ValueError):
            return None
        return record if record.mode in (HOST, CONTAINER) else None

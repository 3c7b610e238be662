"""bandwidth's record in the attachment store: where an attachment was shaped and what it
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
from common import state
from common.digest import sha256_hex
from common.state import AttachmentStore, Flat, Key, flag, integer, name, one_of, plugin_dir, text
from common.values import field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.log import Log

PLUGIN = "bandwidth"
MAX_IFINDEX = 2**31 - 1  # the kernel's ifindex is a positive int


def store(log: Log | None = None) -> AttachmentStore:
    return AttachmentStore(plugin_dir(PLUGIN), Record, log)


class Record(state.Record):
    """Strict: a value that is not as written (a "deviceIndex" of 1e400 or -1, an
    "ownsDeviceTbf" of "false") makes the file unusable rather than make DEL look at,
    or remove, what is not ours."""

    mode: str = HOST  # HOST or CONTAINER
    device: str = ""  # the shaped device's name ...
    device_index: int = 0  # ... and ifindex, so that a reused name is not mistaken for it
    ifb: str = ""
    netns: str = ""  # the container netns (where CONTAINER mode shapes)
    ownership: Ownership = field(default_factory=Ownership)
    KEYS = {
        "mode": Key("mode", one_of(HOST, CONTAINER), required=True),
        "device": Key("device", name, required=True),
        "device_index": Key("deviceIndex", integer(1, MAX_IFINDEX), required=True),
        "ifb": Key("ifb", name, required=True),
        "netns": Key("netns", text),
        "ownership": Flat(Ownership, {"device_tbf": Key("ownsDeviceTbf", flag),
                                      "ingress_qdisc": Key("ownsIngressQdisc", flag)}),
    }  # fmt: skip

    @staticmethod
    def former_name(network: str, container_id: str, ifname: str) -> str:
        """Where earlier versions kept the record: still read (a pod added before an
        upgrade keeps its file) and replaced by the record's next save."""
        key = json.dumps([network, container_id, ifname]).encode()
        return sha256_hex(key)[:40] + ".json"

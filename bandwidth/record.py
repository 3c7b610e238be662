"""bandwidth's record in the attachment store: where an attachment was shaped and what it
created there.

The kernel alone cannot tell DEL whether the ingress qdisc on a host veth was made by us
or was already there (someone else's, to be kept), nor which device was shaped once the
prevResult is gone. The ifb also names its owner in its alias, so GC still finds
leftovers when a state file is lost.
"""

from __future__ import annotations

from bandwidth.model import CONTAINER, HOST
from bandwidth.plan import Ownership
from common import records
from common.env import plugin_dir
from common.jsonobj import flag, integer, non_empty, one_of, text
from common.records import Flat, Key
from common.store import AttachmentStore
from common.values import field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.log import Log

PLUGIN = "bandwidth"
MAX_IFINDEX = 2**31 - 1  # the kernel's ifindex is a positive int


def store(log: Log | None = None) -> AttachmentStore[Record]:
    return AttachmentStore(plugin_dir(PLUGIN), Record, log)


class Record(records.Record):
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
        "device": Key("device", non_empty, required=True),
        "device_index": Key("deviceIndex", integer(1, MAX_IFINDEX), required=True),
        "ifb": Key("ifb", non_empty, required=True),
        "netns": Key("netns", text),
        "ownership": Flat(Ownership, {"device_tbf": Key("ownsDeviceTbf", flag),
                                      "ingress_qdisc": Key("ownsIngressQdisc", flag)}),
    }  # fmt: skip

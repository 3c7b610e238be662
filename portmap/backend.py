"""Which backend serves a call: the one place that maps the config, the host and the
attachments' records to a backend object, and the interface both backends implement.
Nothing else knows the backends' names (a record keeps its backend's, for DEL and GC).
"""

from __future__ import annotations

from common.log import Log
from common.state import AttachmentStore
from portmap.config import BACKENDS, Options
from portmap.plan import Plan, UdpTargets

# The interface both backends implement (for the type checker; nothing checks it at run
# time, and `typing` is not imported on the call path).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from common.gc import AttachmentId
    from common.state import Stamps
    from portmap.config import Attachment
    from portmap.kernel import Kernel
    from portmap.state import Recorded

    class Backend(Protocol):
        name: str  # what its records say

        def owns(self, recorded: Recorded | None) -> bool: ...  # the record is of this backend

        def add(self, plan: Plan) -> None: ...

        def delete(self, att: Attachment, plan: Plan | None) -> UdpTargets: ...

        def check(self, plan: Plan) -> list[str]: ...  # what differs from the plan

        def gc(self, network: str, valid: set[AttachmentId], before: Stamps) -> UdpTargets: ...

        def status(self) -> None: ...


NFTABLES, IPTABLES = BACKENDS  # the config's "backend" values, and a record's


def _make(name: str, sd: AttachmentStore, log: Log, kernel: Kernel) -> Backend:
    if name == IPTABLES:
        from portmap.xtables import XtablesBackend

        return XtablesBackend(sd, log, kernel.xtables)
    from portmap.nft import NftBackend

    return NftBackend(sd, log, kernel.nft)


def _configured(options: Options, kernel: Kernel) -> str:
    """The configured backend; for auto, iptables when the config uses what only iptables
    has (externalSetMarkChain, iptables-style conditions: Go picks iptables for them, so
    a config written for Go means the same here), else nftables where libnftables works."""
    if options.backend:
        return options.backend
    if options.external_set_mark_chain or any(
        options.conditions(family).iptables_style for family in (4, 6)
    ):
        return IPTABLES
    return NFTABLES if kernel.nft.usable() else IPTABLES


def choose(options: Options, sd: AttachmentStore, log: Log, kernel: Kernel) -> Backend:
    """The backend of an ADD, CHECK or STATUS."""
    return _make(_configured(options, kernel), sd, log, kernel)


def of_attachment(
    options: Options, recorded: Recorded | None, sd: AttachmentStore, log: Log, kernel: Kernel
) -> Backend:
    """The backend of a DEL: the one that recorded the attachment, else the config's."""
    if recorded is not None and recorded.backend in BACKENDS:
        return _make(recorded.backend, sd, log, kernel)
    return choose(options, sd, log, kernel)


def for_gc(
    options: Options, network: str, sd: AttachmentStore, log: Log, kernel: Kernel
) -> list[Backend]:
    """Every backend that may hold mappings of `network`: the config's, those of its
    records, and iptables wherever CNI-HOSTPORT-DNAT is: its chains are the Go portmap's
    too, made perhaps before ours was installed (a cheap look)."""
    names = {_configured(options, kernel)}
    names |= {e.backend for e in sd.entries(network).values() if e.backend in BACKENDS}
    top = "CNI-HOSTPORT-DNAT"
    if any(kernel.xtables.may_have(v, f, top) for v in ("nft", "legacy") for f in (4, 6)):
        names.add(IPTABLES)
    return [_make(name, sd, log, kernel) for name in sorted(names)]

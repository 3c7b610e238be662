"""Which backend serves a request, and the interface both backends implement."""

from __future__ import annotations

from common.log import Log
from common.state import AttachmentStore
from portmap.config import Attachment, Options, looks_like_iptables
from portmap.plan import Plan, UdpTargets

# The interface both backends implement (for the type checker; nothing checks it at run
# time, and `typing` costs ~5 ms to import).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from common.gc import AttachmentId
    from common.state import Stamps

    class Backend(Protocol):
        name: str

        def add(self, plan: Plan) -> None: ...

        def delete(self, att: Attachment, plan: Plan | None) -> UdpTargets: ...

        def check(self, plan: Plan) -> list[str]: ...  # what differs from the plan

        def gc(self, network: str, valid: set[AttachmentId], before: Stamps) -> UdpTargets: ...

        def status(self) -> None: ...


def make(name: str, sd: AttachmentStore, log: Log) -> Backend:
    if name == "iptables":
        from portmap.xtables import XtablesBackend

        return XtablesBackend(sd, log)
    from portmap.nft import NftBackend

    return NftBackend(sd)


def resolve(options: Options) -> str:
    """The configured backend; for auto, iptables when the config uses what only iptables
    has (externalSetMarkChain, iptables-style conditions: Go picks iptables for them, so
    a config written for Go means the same here), else nftables where libnftables works."""
    if options.backend:
        return options.backend
    if options.external_set_mark_chain or any(
        looks_like_iptables(options.conditions(family)) for family in (4, 6)
    ):
        return "iptables"
    from portmap import libnftables

    try:
        libnftables.load()  # the kernel's side is proven by the first transaction
    except OSError:
        return "iptables"
    return "nftables"


def choose(options: Options, sd: AttachmentStore, log: Log) -> Backend:
    return make(resolve(options), sd, log)

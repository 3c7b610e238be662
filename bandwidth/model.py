"""The kernel objects bandwidth deals with, as plain values.

`tc.py` reads the kernel into these; `plan.py` compares them with what the config wants.
Numbers are kept in the kernel's own units (bytes, bytes per second, psched ticks) so
that a comparison is exact.
"""

from __future__ import annotations

from common.values import Value

# tc handles and parents (linux/pkt_sched.h)
TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1
INGRESS_HANDLE = 0xFFFF0000  # "ffff:", the ingress qdisc and its filters' parent
CLSACT_INGRESS = 0xFFFFFFF2  # parent of ingress filters when the qdisc is clsact
TBF_HANDLE = 0x00010000  # "1:", as upstream
FILTER_PRIO = 1  # as upstream
FLOW_ID = 0x00010001  # "1:1", upstream's classid on the redirect filter
ETH_P_ALL = 0x0003

HOST = "host"  # shape on the host-side veth (and an ifb in the host netns)
CONTAINER = "container"  # shape on the container interface itself (not a veth)


class Link(Value):
    index: int
    name: str
    kind: str  # IFLA_INFO_KIND: "veth", "ifb", "macvlan", ... ("" when the kernel gives none)
    mtu: int
    up: bool = True
    alias: str = ""
    mac: str = ""
    peer_index: int | None = None  # IFLA_LINK: a veth's peer, a macvlan's parent


class TbfParams(Value):
    """What tbf reports back (TCA_TBF_PARMS): the fields bandwidth sets."""

    rate: int  # bytes per second
    buffer: int  # psched ticks: the burst expressed as transmit time at the rate
    limit: int  # bytes that may wait in the queue


class Tbf(Value):
    """A tbf as bandwidth means it: TbfParams plus the burst in bytes it came from."""

    rate: int
    burst: int
    buffer: int
    limit: int

    @property
    def params(self) -> TbfParams:
        return TbfParams(self.rate, self.buffer, self.limit)

    def rate_and_burst(self) -> str:
        return f"{self.rate * 8} bit/s burst {self.burst} bytes"

    def describe(self) -> str:
        return (
            f"tbf rate {self.rate_and_burst()} (buffer {self.buffer} ticks) "
            f"limit {self.limit} bytes"
        )


class Qdisc(Value):
    kind: str
    handle: int
    parent: int
    tbf: TbfParams | None = None

    def describe(self) -> str:
        """As tc names it, e.g. "htb 2:" (the handle's major:minor in hex)."""
        major, minor = self.handle >> 16, self.handle & 0xFFFF
        return f"{self.kind} {major:x}:" + (f"{minor:x}" if minor else "")


class Filter(Value):
    """One entry of a filter dump on the ingress hook.

    A u32 filter dumps as several entries of one priority: the classifier head, its hash
    table, and the rule nodes. Only the nodes carry a match and actions (`is_rule`).
    """

    parent: int
    prio: int
    kind: str
    protocol: int = ETH_P_ALL
    handle: int = 0
    is_rule: bool = False
    match_all: bool = False  # u32 selector that matches every packet
    redirect_to: int | None = None  # ifindex of a mirred egress redirect action
    other_actions: bool = False  # any action besides one mirred egress redirect


class DeviceState(Value):
    """The shaped device: the host veth, or the container interface."""

    link: Link
    qdiscs: tuple[Qdisc, ...] = ()
    filters: tuple[Filter, ...] = ()  # on its ingress hook, in the kernel's order (by prio)
    # False: the hook holds more filters than were read (tc.MAX_FILTER_ENTRIES); the last
    # group read may go on beyond them, and others follow it: none of that is ours.
    complete: bool = True

    @property
    def root(self) -> Qdisc | None:
        return next((q for q in self.qdiscs if q.parent == TC_H_ROOT), None)

    @property
    def ingress(self) -> Qdisc | None:
        return next((q for q in self.qdiscs if q.kind in ("ingress", "clsact")), None)

    @property
    def filter_parent(self) -> int:
        ingress = self.ingress
        clsact = ingress is not None and ingress.kind == "clsact"
        return CLSACT_INGRESS if clsact else INGRESS_HANDLE


class IfbState(Value):
    link: Link
    root: Qdisc | None = None


class Observed(Value):
    """What the kernel holds for one attachment, in the netns where it is shaped."""

    device: DeviceState | None
    ifb: IfbState | None
    live_indexes: frozenset[int] = frozenset()  # redirect targets alive

"""What one attachment wants of its container namespace, and how the live state compares.

Pure data and functions: the kernel is read and written by tuning.apply only.
"""

from __future__ import annotations

from common.result import Result
from common.values import Value
from tuning.config import LinkSettings, TuningConf

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

IFNAME = "IFNAME"  # the placeholder a key uses for CNI_IFNAME


class SysctlWrite(Value):
    __slots__ = ("key", "path", "value")

    key: str  # as configured, e.g. net.ipv4.conf.IFNAME.accept_redirects
    path: str  # relative to /proc/sys, e.g. net/ipv4/conf/eth0/accept_redirects
    value: str

    def __init__(self, key: str, path: str, value: str) -> None:
        self.key = key
        self.path = path
        self.value = value


class Plan(Value):
    __slots__ = ("ifname", "link", "sysctls")

    ifname: str
    sysctls: tuple[SysctlWrite, ...]
    link: LinkSettings

    def __init__(self, ifname: str, sysctls: tuple[SysctlWrite, ...], link: LinkSettings) -> None:
        self.ifname = ifname
        self.sysctls = sysctls
        self.link = link

    @property
    def empty(self) -> bool:
        return not self.sysctls and self.link.empty


class LinkState(Value):
    """The attributes of the container interface that tuning can change, as observed."""

    __slots__ = ("allmulti", "index", "mac", "max_mtu", "min_mtu", "mtu", "promisc", "tx_qlen")

    index: int
    mac: str
    mtu: int
    promisc: bool
    allmulti: bool
    tx_qlen: int
    min_mtu: int | None
    max_mtu: int | None

    def __init__(
        self,
        index: int,
        mac: str,
        mtu: int,
        promisc: bool,
        allmulti: bool,
        tx_qlen: int,
        min_mtu: int | None = None,
        max_mtu: int | None = None,
    ) -> None:
        self.index = index
        self.mac = mac
        self.mtu = mtu
        self.promisc = promisc
        self.allmulti = allmulti
        self.tx_qlen = tx_qlen
        self.min_mtu = min_mtu
        self.max_mtu = max_mtu


def sysctl_path(components: tuple[str, ...], ifname: str) -> str:
    """The path below /proc/sys; CNI_IFNAME replaces whole IFNAME components only."""
    return "/".join(ifname if c == IFNAME else c for c in components)


def make_plan(conf: TuningConf, ifname: str) -> Plan:
    writes = tuple(
        SysctlWrite(s.key, sysctl_path(s.components, ifname), s.value) for s in conf.sysctls
    )
    return Plan(ifname, writes, conf.link)


# ---------------------------------------------------------------------------- CHECK


def same_sysctl_value(wanted: str, live: str) -> bool:
    """Compare as the kernel prints: multi-value sysctls come back tab separated
    (ip_local_port_range "32768\\t60999"), and integers in their canonical form."""
    want_fields, live_fields = wanted.split(), live.split()
    if len(want_fields) != len(live_fields):
        return False
    for w, v in zip(want_fields, live_fields, strict=True):
        if w == v:
            continue
        try:
            if int(w) != int(v):
                return False
        except ValueError:
            return False
    return True


def sysctl_differences(plan: Plan, live: Mapping[str, str | None]) -> list[str]:
    """`live` has no entry for a sysctl that does not exist, and None for one that cannot
    be read back (write-only): that one cannot be compared, so it is not a difference."""
    out = []
    for w in plan.sysctls:
        if w.path not in live:
            out.append(f"sysctl {w.key}: /proc/sys/{w.path} does not exist")
            continue
        current = live[w.path]
        if current is not None and not same_sysctl_value(w.value, current):
            out.append(f"/proc/sys/{w.path} is {current.strip()!r}, configured {w.value!r}")
    return out


def link_differences(ifname: str, want: LinkSettings, live: LinkState) -> list[str]:
    rows: list[tuple[str, object, object]] = [
        ("MAC", want.mac, live.mac.lower()),  # netlink prints lower case; configs may not
        ("MTU", want.mtu, live.mtu),
        ("promiscuous mode", _on(want.promisc), _on(live.promisc)),
        ("all-multicast mode", _on(want.allmulti), _on(live.allmulti)),
        ("txqueuelen", want.tx_qlen, live.tx_qlen),
    ]
    return [
        f"{ifname} {what} is {current}, configured {wanted}"
        for what, wanted, current in rows
        if wanted is not None and wanted != current
    ]


def _on(flag: bool | None) -> str | None:
    return None if flag is None else ("on" if flag else "off")


# ---------------------------------------------------------------------------- report


def report(prev: Result | None, plan: Plan) -> Result:
    """prevResult with the container interface's new MAC (and, for 1.1.0, MTU)."""
    result = prev if prev is not None else Result()
    if plan.link.mac is None and plan.link.mtu is None:
        return result
    named = [i for i in result.interfaces if i.name == plan.ifname]
    # The container side has a sandbox; an old plugin may not say so, then the name decides.
    targets = [i for i in named if i.sandbox] or named
    for iface in targets:
        if plan.link.mac is not None:
            iface.mac = plan.link.mac
        if plan.link.mtu is not None:
            iface.mtu = plan.link.mtu
    return result

"""What one attachment wants of its container namespace, and how the live state compares.

Pure data and functions: the kernel is read and written by tuning.apply only.
"""

from __future__ import annotations

from common.result import Result
from common.values import Value
from tuning.config import LINK_OPTIONS, LinkSettings, TuningConf

IFNAME = "IFNAME"  # the placeholder a key uses for CNI_IFNAME


class SysctlWrite(Value):
    key: str  # as configured, e.g. net.ipv4.conf.IFNAME.accept_redirects
    path: str  # relative to /proc/sys, e.g. net/ipv4/conf/eth0/accept_redirects
    value: str


class Plan(Value):
    ifname: str
    sysctls: tuple[SysctlWrite, ...]
    link: LinkSettings

    @property
    def empty(self) -> bool:
        return not self.sysctls and self.link.empty


class LinkState(LinkSettings):
    """The container interface as observed: every attribute tuning can change (none is
    None), and what decides whether a change fits."""

    index: int = 0
    min_mtu: int | None = None
    max_mtu: int | None = None


def make_plan(conf: TuningConf, ifname: str) -> Plan:
    # CNI_IFNAME replaces whole IFNAME components only
    writes = tuple(
        SysctlWrite(s.key, "/".join(ifname if c == IFNAME else c for c in s.components), s.value)
        for s in conf.sysctls
    )
    return Plan(ifname, writes, conf.link)


def _as_printed(sysctl: str) -> list[int | str]:
    """A sysctl value as the kernel prints it: multi-value sysctls come back tab separated
    (ip_local_port_range "32768\\t60999"), and integers in their canonical form."""
    out: list[int | str] = []
    for word in sysctl.split():
        try:
            out.append(int(word))
        except ValueError:
            out.append(word)
    return out


def same_sysctl_value(wanted: str, live: str) -> bool:
    return _as_printed(wanted) == _as_printed(live)


def sysctl_differences(plan: Plan, live: dict[str, str | None]) -> list[str]:
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


def link_differences(ifname: str, want: LinkSettings, live: LinkState | None) -> list[str]:
    if live is None:
        return [f"there is no interface {ifname}"]
    out = []
    for option in LINK_OPTIONS:
        # a MAC compares as it is: the config's is normalised and netlink's is lower case
        wanted, current = getattr(want, option.field), getattr(live, option.field)
        if wanted is not None and wanted != current:
            out.append(f"{ifname} {option.label} is {_shown(current)}, configured {_shown(wanted)}")
    return out


def _shown(value: object) -> object:
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


def report(prev: Result | None, plan: Plan) -> Result:
    """prevResult with the container interface's new MAC (and, for 1.1.0, MTU)."""
    result = prev if prev is not None else Result()
    named = [i for i in result.interfaces if i.name == plan.ifname]
    # The container side has a sandbox; an old plugin may not say so, then the name decides.
    targets = [i for i in named if i.sandbox] or named
    for iface in targets:
        if plan.link.mac is not None:
            iface.mac = plan.link.mac
        if plan.link.mtu is not None:
            iface.mtu = plan.link.mtu
    return result

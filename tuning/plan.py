"""What one attachment wants of its container namespace, what it keeps to undo that (the
Backup), and how the live state compares.

Pure data and functions: the kernel is read and written by tuning.apply only.
"""

from __future__ import annotations

from common.result import Result
from common.state import Flat, Key, Record, listed, safe_file_name
from common.values import Value, field
from tuning.config import LINK_OPTIONS, LinkSettings, TuningConf

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

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
    out = []
    for option in LINK_OPTIONS:
        wanted, current = getattr(want, option.field), getattr(live, option.field)
        if isinstance(current, str):
            current = current.lower()  # netlink prints a MAC in lower case; configs may not
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


# ---------------------------------------------------------------------------- the backup
# The originals of what ADD changed, kept in the attachment store until DEL puts them back,
# in ``<dataDir>/<containerID>_<ifName>.json`` in a format Go's tuning reads too
# (docs/tuning.md shows it).

LOCK_NAME = "tuning.lock"
# NAME_MAX less room for a ".tmp.<pid>" suffix: the limit every backup file was named under.
MAX_FILE_NAME = 255 - len(".tmp.4194304")


def _sysctls(value: Any) -> tuple[tuple[str, str], ...]:
    return tuple(
        (e["path"], e["value"])
        for e in listed(value)
        if isinstance(e, dict)
        and isinstance(e.get("path"), str)
        and isinstance(e.get("value"), str)
    )


def _sysctls_json(sysctls: tuple[tuple[str, str], ...]) -> list[dict[str, str]] | None:
    return [{"path": p, "value": v} for p, v in sysctls] or None


class Backup(Record):
    """Original values; None (or absent from `sysctls`) means "not changed by us".

    Tolerant: a file from Go's tuning reads fine, and a value of the wrong type is
    dropped rather than making DEL fail forever. The link attributes are written with
    Go's keys (LINK_OPTIONS), which Go's tuning reads back; the owner is ours alone."""

    link: LinkSettings = field(default_factory=LinkSettings)
    # (path below /proc/sys, original value), in the order they were first changed
    sysctls: tuple[tuple[str, str], ...] = ()
    TOLERANT = True
    KEYS = {
        "link": Flat(LinkSettings, {o.field: Key(o.key, o.decode) for o in LINK_OPTIONS}),
        "sysctls": Key("sysctls", _sysctls, _sysctls_json),
    }

    @staticmethod
    def file_name(network: str, container_id: str, ifname: str) -> str:
        """Go's name (the network is not part of it), unless it would not fit in a directory
        entry (MAX_FILE_NAME, leaving room for the suffix of an atomic write): runtimes
        may send container ids of up to 1024 characters, which then get a hashed name.
        Go's tuning cannot write such a file at all, so no compatibility is lost."""
        name = safe_file_name(container_id, ifname) + ".json"
        if len(name.encode()) <= MAX_FILE_NAME:
            return name
        from common.digest import sha256_hex

        digest = sha256_hex(container_id.encode())[:32]
        return safe_file_name(f"{container_id[:64]}-{digest}", ifname) + ".json"

    def keeping_older(self, older: Backup | None) -> Backup:
        """This backup with `older`'s values where both have one: a second ADD must not
        record the values the first ADD set as "originals"."""
        if older is None:
            return self
        known = {path for path, _ in older.sysctls}
        kept = {name: v for name, v in older.link.fields().items() if v not in (None, "")}
        return self.replace(
            link=self.link.replace(**kept),
            sysctls=older.sysctls + tuple((p, v) for p, v in self.sysctls if p not in known),
        )


def originals(plan: Plan, link: LinkState | None, sysctls: Mapping[str, str | None]) -> Backup:
    """The live values of exactly what `plan` is about to change. `sysctls` holds the values
    read before the change; one absent or None (unreadable) has no original to save."""
    changed: dict[str, Any] = {}
    if link is not None:
        fields = [option.field for option in LINK_OPTIONS]
        changed = {f: getattr(link, f) for f in fields if getattr(plan.link, f) is not None}
    saved = tuple((w.path, v) for w in plan.sysctls if (v := sysctls.get(w.path)) is not None)
    return Backup(link=LinkSettings(**changed), sysctls=saved)

"""The only part of tuning that talks to the kernel, all of it through its port
(tuning.ports; `Kernel` and `ContainerNetns` here are the host's), so that what tuning
reads, changes and restores runs on the tests' fake as on the host."""

from __future__ import annotations

import errno
import os
from contextlib import ExitStack

from common.attachment import UndoFailed
from common.errors import INVALID_CONFIG, KERNEL_FAILURE, CniError, invalid_config
from common.netns import entered
from common.sysctl import read_sysctl, write_sysctl
from common.values import Value
from tuning.backup import Backup, originals
from tuning.config import LINK_OPTIONS, LinkSettings
from tuning.plan import LinkState, Plan, SysctlWrite

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

    from common.rtnl import RtnlSocket
    from tuning import ports

PROC_SYS = "/proc/sys"
# Errors that mean "this value or key is wrong", as opposed to "the kernel failed".
_CONFIG_ERRNOS = frozenset({errno.EINVAL, errno.ERANGE, errno.EADDRNOTAVAIL, errno.EACCES})
# What restoring meets when the interface went away meanwhile (with its netns, or deleted):
# its sysctl files vanish (ENOENT) or refuse a write already opened (ENODEV), a link
# request names an ifindex that no longer exists (ENODEV). Nothing is left to put back.
_GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENODEV})
IPV6_MIN_MTU = 1280  # below it the kernel removes IPv6 from a device

# How rtnetlink carries each link option (tuning.config.LINK_OPTIONS): a netlink attribute
# (pyroute2's name) with the type of its value, or a flag of the ifinfomsg (common.rtnl's
# name). Reading and changing a link both go by these two tables.
ATTRIBUTES = {"mac": ("IFLA_ADDRESS", str), "mtu": ("IFLA_MTU", int),
              "tx_qlen": ("IFLA_TXQLEN", int)}  # fmt: skip
FLAGS = {"promisc": "IFF_PROMISC", "allmulti": "IFF_ALLMULTI"}


def resolve_sysctl(path: str, root: str = PROC_SYS) -> str:
    """The file for `path` (relative to root), refused unless it really is under root/net/:
    the last line against a backup file edited by hand, and against a symlink inside
    /proc/sys that would lead elsewhere (realpath follows it before we compare)."""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] != "net":
        raise invalid_config(f"refusing sysctl path {path[:120]!r}: not below {root}/net")
    real = os.path.realpath(os.path.join(root, path))
    net_root = os.path.join(os.path.realpath(root), "net") + os.sep
    if not real.startswith(net_root):
        raise invalid_config(
            f"refusing sysctl {path[:120]!r}: it resolves to {real[:120]}, outside {net_root}"
        )
    return real


def _sysctl_error(what: str, e: OSError, ifname: str) -> CniError:
    if e.errno in (errno.ENOENT, errno.ENOTDIR):  # ENOTDIR: a key below a file (rp_filter/x)
        return invalid_config(
            f"{what} does not exist in the container's network namespace",
            f"check the key; IFNAME stands for {ifname}, and some keys exist only in the "
            "host's namespace",
        )
    if e.errno in _CONFIG_ERRNOS:
        return invalid_config(f"the kernel refused {what}: {e.strerror}")
    return CniError(KERNEL_FAILURE, f"cannot access {what}", str(e))


def read_sysctls(
    plan: Plan, ns: ports.ContainerNetns, *, missing_ok: bool
) -> dict[str, str | None]:
    """{path: live value} for every key, resolving (and so refusing) every path first.

    None is a sysctl that exists but cannot be read: write-only ones such as
    net.ipv4.route.flush (mode 0200), or net.ipv6.conf.*.stable_secret before it is set
    (EIO). There is no original to save for those, and nothing to compare.
    """
    files = [(w, resolve_sysctl(w.path)) for w in plan.sysctls]
    out: dict[str, str | None] = {}
    for w, file in files:
        try:
            out[w.path] = ns.read_sysctl(file)
        except OSError as e:
            if e.errno == errno.ENOENT and missing_ok:
                continue
            if e.errno in (errno.EACCES, errno.EPERM, errno.EIO):
                out[w.path] = None
                continue
            raise _sysctl_error(f"sysctl {w.key} (/proc/sys/{w.path})", e, plan.ifname) from None
    return out


class Observed(Value):
    """The live state of what a plan changes, read before changing anything."""

    link: LinkState | None
    sysctls: dict[str, str | None]


def preload_links() -> None:
    """Load pyroute2's link message class (a costly import) before the dataDir lock, not
    while holding it: every other tuning ADD and DEL of the node waits for that lock."""
    from common.rtnl import pyroute2

    pyroute2()


class Kernel:
    """tuning.ports.Kernel on the host."""

    def netns(self, path: str) -> ContainerNetns:
        return ContainerNetns(path)


class ContainerNetns:
    """The container's network namespace, entered for a with-block. Sysctls and the IPv6
    address list are files under /proc, opened inside (which namespace a /proc/sys file
    shows is decided by the thread that opens it). Links go over rtnetlink: pyroute2's
    `ifinfmsg` on common.rtnl's small blocking socket, opened inside on first use
    (IPRoute(netns=...) forks, and its import is heavy)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._rtnl: RtnlSocket | None = None
        self._inside = ExitStack()  # left in reverse: the socket closed, then the netns

    def __enter__(self) -> ContainerNetns:
        self._inside.enter_context(entered(self.path))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._inside.close()

    def rtnl(self) -> RtnlSocket:
        if self._rtnl is None:
            from common.rtnl import RtnlSocket

            self._rtnl = RtnlSocket()
            self._inside.callback(self._rtnl.close)
        return self._rtnl

    def read_sysctl(self, file: str) -> str:
        return read_sysctl(file)

    def write_sysctl(self, file: str, value: str) -> None:
        write_sysctl(file, value)

    def if_inet6(self) -> str:
        """/proc's list of IPv6 addresses (thread-self: setns switched this thread only)."""
        with open("/proc/thread-self/net/if_inet6") as f:
            return f.read()


def read_link(ns: ports.ContainerNetns, ifname: str) -> LinkState | None:
    """The interface's attributes, or None when there is no such interface."""
    from common import rtnl

    try:
        msg = ns.rtnl().link(ifname)
    except rtnl.NetlinkError as e:
        raise CniError(KERNEL_FAILURE, f"cannot read interface {ifname}", str(e)) from None
    if msg is None:
        return None
    flags = int(msg["flags"])
    values = {f: kind(msg.get_attr(nla) or kind()) for f, (nla, kind) in ATTRIBUTES.items()}
    values.update((f, bool(flags & getattr(rtnl, bit))) for f, bit in FLAGS.items())
    return LinkState(
        index=int(msg["index"]),
        min_mtu=msg.get_attr("IFLA_MIN_MTU"),
        max_mtu=msg.get_attr("IFLA_MAX_MTU"),
        **values,
    )


def change_link(
    ns: ports.ContainerNetns, ifname: str, index: int, want: LinkSettings, *, gone_ok: bool = False
) -> None:
    """One RTM_NEWLINK (a "set") with every attribute to change. `gone_ok`: an interface
    that no longer exists is not an error (restoring: nothing to restore)."""
    from common import rtnl

    given = {f: v for f, v in want.fields().items() if v is not None}
    flags = change = 0
    for f, bit in FLAGS.items():
        if f in given:
            change |= getattr(rtnl, bit)
            flags |= getattr(rtnl, bit) if given[f] else 0
    sock = ns.rtnl()
    msg = sock.modules.ifinfmsg()
    msg["index"], msg["flags"], msg["change"] = index, flags, change
    msg["attrs"] = [[nla, given[f]] for f, (nla, _) in ATTRIBUTES.items() if f in given]
    try:
        sock.request(msg, rtnl.RTM_NEWLINK, tolerate=(errno.ENODEV,) if gone_ok else ())
    except rtnl.NetlinkError as e:
        code = e.errno or 0
        keys = sorted(o.key for o in LINK_OPTIONS if o.field in given)
        what = f"the kernel refused to set {', '.join(keys)} on {ifname}"
        if code in _CONFIG_ERRNOS:
            hint = os.strerror(code)
            if want.mtu is not None and code == errno.EINVAL:
                hint += f"; can {ifname} (and the device below it) take mtu {want.mtu}?"
            raise invalid_config(what, hint) from None
        raise CniError(KERNEL_FAILURE, what, os.strerror(code)) from None


def check_link_fits(ifname: str, want: LinkSettings, link: LinkState) -> None:
    """Refuse a MAC or an MTU the device cannot take, before anything is changed."""
    if want.mac is not None and (link.mac or "").replace("0", "").replace(":", "") == "":
        # loopback (00:00:00:00:00:00) and devices without a link-layer address: the
        # kernel may take a MAC for some of them but refuses the original back on DEL.
        raise invalid_config(
            f"{ifname} has no Ethernet address to change ({link.mac or 'none'})",
            "set mac only on an Ethernet-like interface (veth, macvlan, ...)",
        )
    if want.mtu is None:
        return
    if link.max_mtu and want.mtu > link.max_mtu:
        raise invalid_config(f"mtu {want.mtu} is above the maximum of {ifname}: {link.max_mtu}")
    if link.min_mtu and want.mtu < link.min_mtu:
        raise invalid_config(f"mtu {want.mtu} is below the minimum of {ifname}: {link.min_mtu}")


def check_ipv6_survives(
    ifname: str, want: LinkSettings, link: LinkState, ns: ports.ContainerNetns
) -> None:
    """Refuse lowering the MTU below 1280 while the interface has IPv6 addresses.

    The kernel then removes IPv6 from the device altogether: its addresses, routes and
    per-interface IPv6 sysctls are gone, and putting the MTU back on DEL brings IPv6 back
    with default settings but without the addresses the runtime assigned.
    """
    if want.mtu is None or want.mtu >= IPV6_MIN_MTU or (link.mtu or 0) < IPV6_MIN_MTU:
        return
    try:
        lines = ns.if_inet6().splitlines()
    except OSError:
        return  # no IPv6 in this kernel
    import ipaddress

    # Its addresses other than link-local (scope 0x20) and loopback (0x10) ones.
    addresses = [
        ipaddress.IPv6Address(int(fields[0], 16)).compressed
        for fields in map(str.split, lines)
        if len(fields) == 6 and fields[5] == ifname and int(fields[3], 16) not in (0x10, 0x20)
    ]
    if addresses:
        raise invalid_config(
            f"mtu {want.mtu} is below {IPV6_MIN_MTU}, the IPv6 minimum: the kernel would "
            f"remove IPv6 from {ifname} with its address(es) {', '.join(addresses[:3])}",
            f"use an mtu of at least {IPV6_MIN_MTU} on an interface with IPv6 addresses",
        )


def observe(plan: Plan, ns: ports.ContainerNetns) -> Observed:
    """Read (and so validate) everything the plan touches. Changes nothing."""
    link = None
    if not plan.link.empty:
        link = read_link(ns, plan.ifname)
        if link is None:
            raise CniError(
                KERNEL_FAILURE,
                f"there is no interface {plan.ifname} in the container's network namespace",
                "tuning changes an interface a previous plugin created; check the chain",
            )
        check_link_fits(plan.ifname, plan.link, link)
        check_ipv6_survives(plan.ifname, plan.link, link, ns)
    return Observed(link, read_sysctls(plan, ns, missing_ok=False))


def apply(plan: Plan, before: Observed, ns: ports.ContainerNetns) -> None:
    """Make the namespace match the plan; on failure put back what was already changed,
    and raise UndoFailed instead of the failure's error when that did not work either."""
    done: list[SysctlWrite] = []
    try:
        if before.link is not None:
            change_link(ns, plan.ifname, before.link.index, plan.link)
        for w in plan.sysctls:
            try:
                ns.write_sysctl(resolve_sysctl(w.path), w.value)
            except OSError as e:
                what = f"value {w.value!r} for sysctl {w.key}"
                raise _sysctl_error(what, e, plan.ifname) from None
            done.append(w)
    except CniError as e:
        changed = {w.path: before.sysctls.get(w.path) for w in done}
        failures, refused = restore(originals(plan, before.link, changed), plan.ifname, ns)
        failures += refused
        if failures:
            undo = f"; could not put back {len(failures)} value(s): {'; '.join(failures)}"
            raise UndoFailed(e.code, e.msg, e.details + undo) from None
        raise


def restore(backup: Backup, ifname: str, ns: ports.ContainerNetns) -> tuple[list[str], list[str]]:
    """Put the originals back, in reverse order of change; what no longer exists (the
    interface, a per-interface sysctl) is skipped, also when it vanishes midway.

    Returns (failures, refused): failures may pass on a retry (the backup is kept for
    it); refused are originals that can never be put back (a path outside /proc/sys/net,
    a value the kernel or a write refuses, as a backup edited by hand may hold): a DEL
    that kept the backup for them would fail forever."""
    failures: list[str] = []
    refused: list[str] = []
    for path, value in reversed(backup.sysctls):
        what = f"sysctl {path[:120]!r} = {value[:80]!r}"
        try:
            ns.write_sysctl(resolve_sysctl(path), value)
        except OSError as e:
            if e.errno in _CONFIG_ERRNOS:
                refused.append(f"{what}: {e.strerror}")
            elif e.errno not in _GONE_ERRNOS:
                failures.append(f"{what}: {e}")
        except (CniError, ValueError) as e:  # outside /proc/sys/net; a NUL or lone surrogate
            refused.append(f"{what}: {e}")
    if not backup.link.empty:
        try:
            link = read_link(ns, ifname)
            if link is not None:
                change_link(ns, ifname, link.index, backup.link, gone_ok=True)
        except CniError as e:
            (refused if e.code == INVALID_CONFIG else failures).append(str(e))
    return failures, refused

"""portmap's kernel ports (declared in portmap.ports) on the host.

Each opens what it needs on first use only: libnftables is not loaded by the iptables
backend's mappings, nor a netlink socket by a call that asks nothing through one. The
netlink questions need no pyroute2: their few messages are built here and travel on
common.rtnl's NetlinkSocket. The localhost guard (see `guard_nft_text`) is made with
nftables where libnftables works, whatever the backend (one mechanism per host), else
with the host's iptables tools.
"""

from __future__ import annotations

import _socket  # not socket: that imports selectors and enum
import os
import struct

from common.sysctl import read_sysctl, write_sysctl
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from common.libnftables import Context

# The only directories an iptables tool is run from (absolute, root's own), never PATH:
# runtimes exec plugins with all sorts of PATHs (or none, or relative entries).
TOOL_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/local/bin")
_NFT_SUBSYS = 10 << 8
_MSG_GETTABLE, _MSG_GETCHAIN, _MSG_GETSET, _MSG_GETSETELEM = 1, 4, 10, 13
_NFPROTO_INET, _NFPROTO_IPV4 = 1, 2
_ENOENT = 2
_LEGACY_NAMES = {4: "/proc/net/ip_tables_names", 6: "/proc/net/ip6_tables_names"}
# the variant the iptables backend is forced to (portmap.xtables.VARIANT_ENV, which
# imports this module), for the localhost guard's tools too
IPTABLES_VARIANT_ENV = "CNI_META_IPTABLES"


class NftKernel:
    def usable(self) -> bool:
        """The kernel's side is proven by the first transaction."""
        from common import libnftables

        try:
            libnftables.load()
        except OSError:
            return False
        return True

    def context(self) -> Context:
        from common.libnftables import Context

        return Context()

    def has(self, family: int, table: str, chain: str | None = None) -> bool:
        """One nfnetlink request, answered with the object or with an error (ENOENT: not
        there; no nf_tables here: nothing of ours in it either)."""
        from common.rtnl import nla_string

        if chain is None:
            msg_type, attrs = _MSG_GETTABLE, nla_string(1, table)  # NFTA_TABLE_NAME
        else:
            msg_type = _MSG_GETCHAIN
            # NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME
            attrs = nla_string(1, table) + nla_string(3, chain)
        return _nft_get(msg_type, nfgenmsg(family) + attrs) == 0

    def may_have_element(self, table: str, set_name: str, key: bytes | None = None) -> bool:
        """Whether the inet table's set may hold the element with this key (None: whether
        the set is there): one nfnetlink request, answered with the element or with an
        error, whatever else the set holds (libnftables' `get element` reads every set's
        elements first). False for sure; True also when the kernel cannot say."""
        return element_errno(_NFPROTO_INET, table, set_name, key) != _ENOENT


def element_errno(nfproto: int, table: str, set_name: str, key: bytes | None) -> int:
    """The errno of a look at the set (or at its element `key`): 0 when it is there."""
    from common.rtnl import NLA_F_NESTED, nla, nla_string

    # NFTA_SET_ELEM_LIST_TABLE and _SET (NFTA_SET_TABLE and _NAME: the same numbers)
    attrs = nla_string(1, table) + nla_string(2, set_name)
    msg_type = _MSG_GETSET
    if key is not None:
        msg_type = _MSG_GETSETELEM
        # NFTA_SET_ELEM_LIST_ELEMENTS > NFTA_LIST_ELEM > NFTA_SET_ELEM_KEY > NFTA_DATA_VALUE
        element = nla(1 | NLA_F_NESTED, nla(1 | NLA_F_NESTED, nla(1, key)))
        attrs += nla(3 | NLA_F_NESTED, element)
    return _nft_get(msg_type, struct.pack("=BBH", nfproto, 0, 0) + attrs)


def _nft_get(msg_type: int, body: bytes) -> int:
    """The errno of one nf_tables GET request (0: the kernel answered with the object;
    -1: it cannot be asked)."""
    from common.rtnl import NETLINK_NETFILTER, NetlinkSocket

    try:
        with NetlinkSocket(NETLINK_NETFILTER) as nl:
            nl.call(_NFT_SUBSYS | msg_type, 0, body)
    except OSError as e:
        return e.errno or -1
    return 0


class XtablesKernel:
    def __init__(self, nft: NftKernel) -> None:
        self.nft = nft

    def tool(self, variant: str, family: int, kind: str) -> str | None:
        name = f"{'ip6tables' if family == 6 else 'iptables'}-{variant}-{kind}"
        for d in TOOL_DIRS:
            path = os.path.join(d, name)
            if os.access(path, os.X_OK):
                return path
        return None

    def run(self, argv: list[str], data: bytes = b"") -> tuple[int, str]:
        """posix_spawn and pipes, not subprocess (its imports would be paid on every call).
        stdin is written whole first: iptables-restore reads all of it before it answers,
        and the save tools read none. stdout and stderr share one pipe, so neither can
        fill up while the other is read.
        """
        out_r, out_w = os.pipe()
        in_r, in_w = os.pipe() if data else (os.open(os.devnull, os.O_RDONLY), -1)
        actions = [
            (os.POSIX_SPAWN_DUP2, in_r, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1),
            (os.POSIX_SPAWN_DUP2, out_w, 2),
        ]
        env = {"PATH": ":".join(TOOL_DIRS), "LC_ALL": "C"}
        if "XTABLES_LOCKFILE" in os.environ:
            env["XTABLES_LOCKFILE"] = os.environ["XTABLES_LOCKFILE"]
        try:
            pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
        finally:
            for fd in (in_r, out_w):
                os.close(fd)
        if in_w >= 0:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(in_w, view) :]
            except BrokenPipeError:
                pass  # it stopped reading (a parse error): its message says why
            finally:
                os.close(in_w)
        with os.fdopen(out_r, "rb") as f:
            out = f.read()
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), out.decode(errors="replace")

    def host_variant(self) -> str:
        """Debian's and RHEL's alternatives, looked up in TOOL_DIRS only, never in PATH:
        PATH is whatever the runtime had, and an entry in it that is relative (or empty:
        the working directory) or writable by others would make root run the `iptables`
        it names."""
        for d in TOOL_DIRS:
            path = os.path.join(d, "iptables")
            if not os.access(path, os.X_OK):
                continue
            real = os.path.basename(os.path.realpath(path))
            for variant in ("nft", "legacy"):
                if variant in real:
                    return variant
            _, out = self.run([path, "-V"])
            return "legacy" if "legacy" in out else "nft"
        return "nft"

    def legacy_nat_exists(self, family: int) -> bool:
        """Its rules can only be read through a raw IP socket (what iptables-legacy-save
        does), and asking a legacy tool for a missing table creates it: where it exists,
        the tools look."""
        try:
            with open(_LEGACY_NAMES[family]) as f:
                return "nat" in f.read().split()
        except OSError:
            return False

    def may_have(self, variant: str, family: int, chain: str) -> bool:
        """Without running a tool (True may still find nothing)."""
        if variant == "nft":
            return self.nft.has(family, "nat", chain)
        return self.legacy_nat_exists(family)


# ---------------------------------------------------------------------------- localhost guard

# While route_localnet is on for an interface, whatever is on its link can send to
# 127.0.0.0/8 and reach the node's services bound to localhost (Kubernetes CVE-2020-8558).
# The guard drops such packets on input, as kube-proxy's fix does, but only for the
# interfaces portmap switched: new connections that are not DNAT'd. What
# 127.0.0.1:hostPort needs passes: its packets are DNAT'd on output, the container's
# replies are ESTABLISHED. 127.0.0.0/8 is IPv4 only (IPv6's ::1 off `lo` is always martian).
GUARD_NAME = "cni_meta_localnet"
GUARD_TABLE = f"ip {GUARD_NAME}"
GUARD_SET = "interfaces"
GUARD_CHAIN = "CNI-META-LOCALNET"  # iptables: in the filter table, jumped to from INPUT
GUARD_COMMENT = "cni-meta-plugins portmap: containers do not reach the node localhost"
LOCALHOST_NET = "127.0.0.0/8"
GUARD_JUMP = ["-d", LOCALHOST_NET, "-m", "comment", "--comment", GUARD_COMMENT, "-j", GUARD_CHAIN]
GUARD_DROP = ["-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP"]
_IFNAMSIZ = 16  # an nft ifname key: the name, NUL-padded to this


def guard_nft_text(interfaces: list[str], replace: bool = True) -> str:
    """The guard's table, made anew (or removed, for no interfaces) in one transaction:
    `add` before `delete` makes the delete succeed whether the table is there or not;
    without `replace` (no table there) nothing is deleted, which costs a grace period
    (see guard_nft). A packet without conntrack (untracked, invalid) matches neither
    `return` and drops."""
    t = GUARD_TABLE
    lines = [f"add table {t}", f"delete table {t}"] if replace else []
    if interfaces:
        names = ", ".join(f'"{name}"' for name in interfaces)
        lines += [
            f'add table {t} {{ comment "{GUARD_COMMENT}; managed, do not edit"; }}',
            f"add set {t} {GUARD_SET} {{ type ifname; elements = {{ {names} }}; }}",
            f"add chain {t} input {{ type filter hook input priority filter; policy accept; }}",
            f"add chain {t} guard",
            f"add rule {t} input ip daddr {LOCALHOST_NET} iifname @{GUARD_SET} jump guard",
            f"add rule {t} guard ct state established,related return",
            f"add rule {t} guard ct status dnat return",
            f"add rule {t} guard drop",
        ]
    return "\n".join(lines) + "\n"


def guard_iptables_lines(interfaces: list[str], jump: bool, chain: bool) -> list[str]:
    """The iptables-restore --noflush lines (filter table) that leave the guard on exactly
    `interfaces`, given whether the INPUT jump and the chain are there. Declaring a chain
    that exists flushes it: its rules are always written whole. The jump goes first in
    INPUT: an ACCEPT before it would end the table's walk for the packet."""
    if interfaces:
        lines = [f":{GUARD_CHAIN} - [0:0]"]
        lines += [" ".join(["-A", GUARD_CHAIN, "-i", name, *GUARD_DROP]) for name in interfaces]
        if not jump:
            lines.append(" ".join(["-I", "INPUT", "1", *map(_restore_word, GUARD_JUMP)]))
        return lines
    lines = [" ".join(["-D", "INPUT", *map(_restore_word, GUARD_JUMP)])] if jump else []
    return lines + ([f"-F {GUARD_CHAIN}", f"-X {GUARD_CHAIN}"] if chain else [])


def _restore_word(word: str) -> str:
    return f'"{word}"' if " " in word else word


# ---------------------------------------------------------------------------- netlink

# linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h
NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_GET, IPCTNL_MSG_CT_DELETE = 1, 2
CTA_TUPLE_ORIG, CTA_ZONE = 1, 18  # in a conntrack entry
CTA_TUPLE_IP, CTA_TUPLE_PROTO = 1, 2  # in CTA_TUPLE_ORIG
CTA_IP_V4_DST, CTA_IP_V6_DST = 2, 4  # in CTA_TUPLE_IP
CTA_PROTO_NUM, CTA_PROTO_DST_PORT = 1, 3  # in CTA_TUPLE_PROTO
IPPROTO_UDP = 17


def nfgenmsg(family: int) -> bytes:
    """The nfnetlink header of a request about IPv4 or IPv6 (4/6): AF_INET or AF_INET6
    (NFPROTO_IPV4/IPV6 are the same numbers), version 0, res_id 0."""
    return struct.pack("=BBH", _socket.AF_INET6 if family == 6 else _socket.AF_INET, 0, 0)


def _deletion(payload: bytes, wanted: dict[int, set[bytes | None]]) -> bytes:
    """What deletes one conntrack entry (its CTA_TUPLE_ORIG and CTA_ZONE) when it is UDP
    to a wanted port (and address, unless None is wanted); b"" when it is not."""
    from common.rtnl import NLA_F_NESTED, nla, nlas

    entry = dict(nlas(payload[4:]))
    orig = dict(nlas(entry.get(CTA_TUPLE_ORIG, b"")))
    proto = dict(nlas(orig.get(CTA_TUPLE_PROTO, b"")))
    if proto.get(CTA_PROTO_NUM, b"\0")[0] != IPPROTO_UDP:
        return b""
    (port,) = struct.unpack("!H", proto.get(CTA_PROTO_DST_PORT, b"\0\0")[:2])
    ip = dict(nlas(orig.get(CTA_TUPLE_IP, b"")))
    addr = ip.get(CTA_IP_V4_DST) or ip.get(CTA_IP_V6_DST) or b""
    if not wanted.get(port, set()) & {None, addr}:
        return b""
    zone = nla(CTA_ZONE, entry[CTA_ZONE]) if CTA_ZONE in entry else b""
    return nla(CTA_TUPLE_ORIG | NLA_F_NESTED, entry[CTA_TUPLE_ORIG]) + zone


# linux/rtnetlink.h: a route query (portmap sends no link message of its own)
RTM_NEWROUTE, RTM_GETROUTE = 24, 26
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5


class Route(Value):
    """The kernel's route to an address: its type (RTN_UNICAST 1, RTN_LOCAL 2, ...), the
    output device's name, the gateway ("" when on-link) and the device's kind (as
    Kernel.link_kind says)."""

    kind: int
    oif: str
    gateway: str = ""
    link_kind: str = ""


def guard_nft(nft: NftKernel, interfaces: list[str]) -> None:
    """The localhost guard on exactly `interfaces` (none: no guard table), in one
    transaction; OSError when nft refuses. After a transaction that deletes, the next
    close of an nfnetlink socket (a look's, the exit's) waits for an RCU grace period:
    a table not there is only made, and a removal (a DEL's) asks nothing first."""
    replace = not interfaces or nft.has(4, GUARD_NAME)
    code, _, err = nft.context().run(guard_nft_text(interfaces, replace=replace))
    if code != 0:
        raise OSError(f"nft refused the localhost guard: {err.strip()}")


def _guard_iptables(xtables: XtablesKernel) -> tuple[str, str | None, list[str]]:
    """The guard's iptables: (variant, its restore tool or None, the lock wait option)."""
    from common.lock import lock_timeout

    forced = os.environ.get(IPTABLES_VARIANT_ENV, "")
    variant = forced if forced in ("nft", "legacy") else xtables.host_variant()
    restore = xtables.tool(variant, 4, "restore")
    return variant, restore, ["-w", str(max(1, int(lock_timeout())))]


def guard_xtables(xtables: XtablesKernel, interfaces: list[str]) -> None:
    """The localhost guard on exactly `interfaces` (none: no chain, no jump), in the
    filter table of the host's `iptables` variant (the iptables backend's choice
    when it is forced); one iptables-restore after two looks at what is there.
    OSError when a tool is missing or refuses."""
    variant, restore, wait = _guard_iptables(xtables)
    if restore is None:
        if not interfaces:
            return  # no tool, nothing of ours made with it
        raise OSError(f"iptables-{variant}-restore is not installed")
    if variant == "legacy" and not interfaces:
        try:  # asking a legacy tool about a missing table creates it
            with open(_LEGACY_NAMES[4]) as f:
                if "filter" not in f.read().split():
                    return
        except OSError:
            return
    base = [restore.removesuffix("-restore"), *wait, "-t", "filter"]
    jump = xtables.run([*base, "-C", "INPUT", *GUARD_JUMP])[0] == 0
    chain = xtables.run([*base, "-S", GUARD_CHAIN])[0] == 0
    lines = guard_iptables_lines(interfaces, jump, chain)
    if not lines:
        return
    text = "*filter\n" + "\n".join(lines) + "\nCOMMIT\n"
    code, out = xtables.run([restore, "--noflush", *wait], text.encode())
    if code != 0:
        raise OSError(f"iptables-{variant}-restore refused the localhost guard: {out.strip()}")


def guard_xtables_holds(xtables: XtablesKernel, ifname: str) -> bool:
    """Whether the INPUT jump and `ifname`'s rule of the guard are there: two looks."""
    _, restore, wait = _guard_iptables(xtables)
    if restore is None:
        return False
    base = [restore.removesuffix("-restore"), *wait, "-t", "filter", "-C"]
    looks = (["INPUT", *GUARD_JUMP], [GUARD_CHAIN, "-i", ifname, *GUARD_DROP])
    return all(xtables.run([*base, *look])[0] == 0 for look in looks)


class Kernel:
    # The host's own sysctls, in the plugin's netns.
    read_sysctl = staticmethod(read_sysctl)
    write_sysctl = staticmethod(write_sysctl)

    def __init__(self) -> None:
        self.nft = NftKernel()
        self.xtables = XtablesKernel(self.nft)

    def route_v4(self, ip: str) -> Route | None:
        """Policy rules and every table: an RTM_GETROUTE, and the output device's name
        from its index (SIOCGIFNAME). None also for unreachable, blackhole, prohibited."""
        from common.rtnl import NETLINK_ROUTE, NLMSG_HDRLEN, NetlinkSocket, nla, nlas

        # struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
        head = struct.pack("=BBBBBBBBI", _socket.AF_INET, 32, 0, 0, 0, 0, 0, 0, 0)
        body = head + nla(RTA_DST, _socket.inet_pton(_socket.AF_INET, ip))
        try:
            with NetlinkSocket(NETLINK_ROUTE) as nl:
                replies = list(nl.request(RTM_GETROUTE, 0, body))  # read to its ACK
            routes = [r for r in replies if struct.unpack_from("=H", r, 4)[0] == RTM_NEWROUTE]
            if not routes:
                return None
            route = routes[0][NLMSG_HDRLEN:]
            attrs = dict(nlas(route[len(head) :]))
            gateway = attrs.get(RTA_GATEWAY, b"")
            via = _socket.inet_ntop(_socket.AF_INET, gateway) if len(gateway) == 4 else ""
            name = ""
            if RTA_OIF in attrs:
                name = _socket.if_indextoname(struct.unpack("=I", attrs[RTA_OIF][:4])[0])
        except OSError:
            return None
        return Route(route[7], name, via)

    def link_kind(self, name: str) -> str:
        """From pyroute2's link message; "" also for no device."""
        from common.rtnl import RtnlSocket

        try:
            rtnl = RtnlSocket()
            try:
                link = rtnl.link(name)
            finally:
                rtnl.close()
        except OSError:
            return ""
        info = link.get_attr("IFLA_LINKINFO") if link is not None else None
        return str((info.get_attr("IFLA_INFO_KIND") if info else None) or "")

    def guard_localnet(self, interfaces: Iterable[str]) -> None:
        """Drop new, non-DNAT IPv4 packets to 127.0.0.0/8 that arrive on exactly
        `interfaces` (none: remove the guard): nftables where libnftables works (whatever
        the backend), else the host's iptables. OSError when it cannot be made so."""
        names = sorted(set(interfaces))
        if self.nft.usable():
            guard_nft(self.nft, names)
        else:
            guard_xtables(self.xtables, names)

    def guard_text(self, interfaces: Iterable[str]) -> str:
        """guard_localnet's nft text, for a transaction of the caller's ("": the guard is
        not made with nftables here)."""
        return guard_nft_text(sorted(set(interfaces))) if self.nft.usable() else ""

    def localnet_guarded(self, ifname: str) -> bool:
        """Whether guard_localnet's mechanism holds `ifname` (False when not sure)."""
        if self.nft.usable():  # one nfnetlink look at the set's element
            key = ifname.encode().ljust(_IFNAMSIZ, b"\0")
            return element_errno(_NFPROTO_IPV4, GUARD_NAME, GUARD_SET, key) == 0
        return guard_xtables_holds(self.xtables, ifname)

    def flush_udp_conntrack(self, family: int, targets: Iterable[tuple[str | None, int]]) -> int:
        """Entries whose original destination port is a target's (and, when the target has
        a host address, whose destination is it), so that old flows stop going to a
        previous container. The dump is read whole before the first delete."""
        from common import rtnl

        wanted: dict[int, set[bytes | None]] = {}
        af = _socket.AF_INET6 if family == 6 else _socket.AF_INET
        for host_ip, port in targets:
            wanted.setdefault(port, set()).add(_socket.inet_pton(af, host_ip) if host_ip else None)
        if not wanted:
            return 0
        get = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
        delete = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE
        deleted = 0
        with rtnl.NetlinkSocket(rtnl.NETLINK_NETFILTER) as nl:
            replies = nl.request(get, rtnl.NLM_F_DUMP, nfgenmsg(family))
            doomed = [_deletion(reply[rtnl.NLMSG_HDRLEN :], wanted) for reply in replies]
            for body in filter(None, doomed):
                try:
                    nl.call(delete, 0, nfgenmsg(family) + body)
                    deleted += 1
                except rtnl.NetlinkError:
                    pass  # gone already (expired or deleted by someone else): fine
        return deleted

"""The part of flatnet that talks rtnetlink: the bridge, the veth pair, addresses, routes
and the sysctls that go with them. The messages are built and read as bytes on
common.rtnl's socket, one socket per namespace; nothing here decides anything (verbs and
plan do)."""

from __future__ import annotations

import _socket  # not `socket`: that imports enum and selectors
import errno
import os
import struct

from common.errors import INVALID_CONFIG, KERNEL_FAILURE, CniError
from common.rtnl import (
    IFF_PROMISC,
    IFF_UP,
    NETLINK_ROUTE,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    RTM_DELLINK,
    RTM_GETLINK,
    RTM_NEWLINK,
    SOL_NETLINK,
    NetlinkError,
    NetlinkSocket,
    nla,
    nla_string,
    nlas,
)
from common.sysctl import read_sysctl, write_sysctl

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.result import Route

RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE = 24
RTM_SETLINK = 19
AF_INET, AF_INET6, AF_BRIDGE = 2, 10, 7
IFA_F_NODAD = 0x02
RT_TABLE_MAIN = 254
RTPROT_BOOT = 3
RTN_UNICAST = 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253
BRIDGE_FLAGS_MASTER = 1
BRIDGE_VLAN_INFO_PVID, BRIDGE_VLAN_INFO_UNTAGGED = 0x2, 0x4
DEFAULT_VLAN = 1
OPER_UP = "UP"
# How long ADD waits for the host veth's carrier to reach the bridge (the kernel's link
# watch batches such events, at most one second apart): the port forwards only then.
OPER_UP_DEADLINE = 3.0

# The rtnetlink messages flatnet sends, as bytes (linux/rtnetlink.h, if_link.h,
# if_addr.h): a handful of fixed structs and attributes, which costs a call nothing to
# load, where pyroute2's message classes cost more than the rest of the call.
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBi")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table,
#                                       protocol, scope, type, flags
_U8, _U16, _U32 = struct.Struct("=B"), struct.Struct("=H"), struct.Struct("=I")
_VLAN_INFO = struct.Struct("=HH")  # bridge_vlan_info: flags, vid
_HDR = 16  # nlmsghdr
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_MASTER = 1, 3, 4, 10
IFLA_OPERSTATE, IFLA_LINKINFO, IFLA_AF_SPEC, IFLA_NET_NS_FD, IFLA_EXT_MASK = 16, 18, 26, 28, 29
IFLA_INFO_KIND, IFLA_INFO_DATA, IFLA_INFO_SLAVE_KIND, IFLA_INFO_SLAVE_DATA = 1, 2, 4, 5
VETH_INFO_PEER = 1
IFLA_BR_VLAN_FILTERING = 7
IFLA_BRPORT_MODE, IFLA_BRPORT_ISOLATED = 4, 33
IFLA_BRIDGE_FLAGS, IFLA_BRIDGE_VLAN_INFO = 0, 2
NETLINK_GET_STRICT_CHK = 12  # a dump request's header filters (linux/netlink.h)
RTEXT_FILTER_SKIP_STATS = 1 << 3  # a link's reply without its counters (a third its size)
OPER_STATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST, IFA_FLAGS = 1, 2, 4, 8
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE = 1, 4, 5, 6, 15


def _family(address: str) -> int:
    return AF_INET6 if ":" in address else AF_INET


def _ip(address: str) -> bytes:
    return _socket.inet_pton(_family(address), address)


def _mac(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def _u32(kind: int, value: int) -> bytes:
    return nla(kind, _U32.pack(value))


def _ifinfo(attrs: bytes, *, index: int = 0, flags: int = 0, change: int = 0,
            family: int = 0) -> bytes:  # fmt: skip
    return _IFINFO.pack(family, 0, index, flags, change) + attrs


def random_mac() -> str:
    """A random, locally administered unicast address (what the kernel would pick), chosen
    here so that ADD knows it without asking the kernel afterwards."""
    raw = bytearray(os.urandom(6))
    raw[0] = (raw[0] & 0xFE) | 0x02
    return ":".join(f"{b:02x}" for b in raw)


def kernel_error(what: str, e: OSError) -> CniError:
    code = INVALID_CONFIG if e.errno in (errno.EINVAL, errno.ERANGE) else KERNEL_FAILURE
    return CniError(code, f"{what}: {e.strerror}", str(e))


class Link:
    """What flatnet reads of a link (an RTM_NEWLINK reply, header included)."""

    __slots__ = ("index", "kind", "mac", "master", "mtu", "name", "oper", "up")

    def __init__(self, reply: bytes) -> None:
        _, _, self.index, flags, _ = _IFINFO.unpack_from(reply, _HDR)
        self.up = bool(flags & IFF_UP)
        self.name = self.kind = self.mac = self.oper = ""
        self.mtu = self.master = 0
        for kind, value in nlas(reply[_HDR + _IFINFO.size :]):
            if kind == IFLA_IFNAME:
                self.name = value.split(b"\0", 1)[0].decode()
            elif kind == IFLA_ADDRESS:
                self.mac = ":".join(f"{b:02x}" for b in value)
            elif kind == IFLA_MTU:
                self.mtu = _U32.unpack_from(value)[0]
            elif kind == IFLA_MASTER:
                self.master = _U32.unpack_from(value)[0]
            elif kind == IFLA_OPERSTATE:
                state = value[0]
                self.oper = OPER_STATES[state] if state < len(OPER_STATES) else str(state)
            elif kind == IFLA_LINKINFO:
                for sub, data in nlas(value):
                    if sub == IFLA_INFO_KIND:
                        self.kind = data.split(b"\0", 1)[0].decode()


class Rtnl:
    """rtnetlink requests in one namespace ("": the current one), on one socket."""

    def __init__(self, netns: str = "") -> None:
        self.strict = False  # NETLINK_GET_STRICT_CHK asked for on the socket
        if netns:
            from common.netns import entered  # looked up at each call: crash points wrap it

            with entered(netns):  # a socket keeps the netns it was opened in
                self.sock = NetlinkSocket(NETLINK_ROUTE)
        else:
            self.sock = NetlinkSocket(NETLINK_ROUTE)

    def close(self) -> None:
        self.sock.close()

    def request(self, msg_type: int, flags: int, body: bytes,
                tolerate: tuple[int, ...] = ()) -> list[bytes]:  # fmt: skip
        """One request, its replies read to the ACK (none when the kernel's error is in
        `tolerate`: what the request names is not there). Raises NetlinkError."""
        try:
            return list(self.sock.request(msg_type, flags, body))
        except NetlinkError as e:
            if e.errno in tolerate:
                return []
            raise

    def link(self, name: str = "", index: int = 0) -> Link | None:
        """The link named `name`, or else with ifindex `index`; None when there is none
        (ENODEV; EINVAL: a name the kernel cannot even look up names no device either)."""
        attrs = _u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)
        if name:
            attrs += nla_string(IFLA_IFNAME, name)
        found = self.request(RTM_GETLINK, 0, _ifinfo(attrs, index=index),
                             tolerate=(errno.ENODEV, errno.EINVAL))  # fmt: skip
        return Link(found[0]) if found else None

    def _newlink(self, attrs: bytes, *, index: int = 0, flags: int = 0, change: int = 0,
                 create: bool = False) -> None:  # fmt: skip
        nl = NLM_F_CREATE | NLM_F_EXCL if create else 0
        self.request(RTM_NEWLINK, nl, _ifinfo(attrs, index=index, flags=flags, change=change))

    # ------------------------------------------------------------------ the bridge

    def create_bridge(self, name: str, mac: str, mtu: int | None, vlan_filtering: bool) -> bool:
        """Create the bridge (down: update_bridge brings it up once its sysctls are set),
        with its MAC set (a bridge whose MAC was set keeps it as ports come and go). False
        when it exists already (made meanwhile by another ADD)."""
        info = nla_string(IFLA_INFO_KIND, "bridge")
        if vlan_filtering:
            info += nla(IFLA_INFO_DATA, nla(IFLA_BR_VLAN_FILTERING, _U8.pack(1)))
        attrs = nla_string(IFLA_IFNAME, name) + nla(IFLA_ADDRESS, _mac(mac))
        attrs += nla(IFLA_LINKINFO, info)
        if mtu:
            attrs += _u32(IFLA_MTU, mtu)
        try:
            self._newlink(attrs, create=True)
        except NetlinkError as e:
            if e.errno == errno.EEXIST:
                return False
            raise kernel_error(f"could not create bridge {name}", e) from None
        return True

    def update_bridge(self, bridge: Link, mtu: int | None, promisc: bool) -> None:
        """An existing bridge: up, its MAC pinned (set to what it is), the configured MTU
        (a larger one reaches a bridge made earlier too), promiscuous when asked."""
        attrs = nla(IFLA_ADDRESS, _mac(bridge.mac))
        if mtu and mtu != bridge.mtu:
            attrs += _u32(IFLA_MTU, mtu)
        flags = IFF_UP | (IFF_PROMISC if promisc else 0)
        try:
            self._newlink(attrs, index=bridge.index, flags=flags, change=flags)
        except NetlinkError as e:
            raise kernel_error(f"could not set up bridge {bridge.name}", e) from None

    # ------------------------------------------------------------------ the veth pair

    def create_veth(self, host: str, host_mac: str, peer: str, peer_mac: str, netns_fd: int,
                    mtu: int | None, master: int) -> None:  # fmt: skip
        """The pair in one request: the host end up on the bridge, the peer named as the
        container wants it, down, in the container's namespace."""
        peer_attrs = nla_string(IFLA_IFNAME, peer) + nla(IFLA_ADDRESS, _mac(peer_mac))
        peer_attrs += _u32(IFLA_NET_NS_FD, netns_fd)
        attrs = nla_string(IFLA_IFNAME, host) + nla(IFLA_ADDRESS, _mac(host_mac))
        attrs += _u32(IFLA_MASTER, master)
        if mtu:
            peer_attrs += _u32(IFLA_MTU, mtu)
            attrs += _u32(IFLA_MTU, mtu)
        peer_msg = nla(VETH_INFO_PEER, _ifinfo(peer_attrs))
        info = nla_string(IFLA_INFO_KIND, "veth") + nla(IFLA_INFO_DATA, peer_msg)
        attrs += nla(IFLA_LINKINFO, info)
        self._newlink(attrs, flags=IFF_UP, change=IFF_UP, create=True)

    def set_port(self, index: int, hairpin: bool, isolated: bool) -> None:
        data = nla(IFLA_BRPORT_MODE, _U8.pack(int(hairpin)))
        data += nla(IFLA_BRPORT_ISOLATED, _U8.pack(int(isolated)))
        info = nla_string(IFLA_INFO_SLAVE_KIND, "bridge") + nla(IFLA_INFO_SLAVE_DATA, data)
        self._newlink(nla(IFLA_LINKINFO, info), index=index)

    def set_port_vlan(self, index: int, vid: int) -> None:
        """The port's only VLAN: `vid`, untagged and the PVID (Go's bridge drops the
        default VLAN 1 first)."""

        def spec(flags: int, vlan: int) -> bytes:
            body = nla(IFLA_BRIDGE_FLAGS, _U16.pack(BRIDGE_FLAGS_MASTER))
            body += nla(IFLA_BRIDGE_VLAN_INFO, _VLAN_INFO.pack(flags, vlan))
            return _ifinfo(nla(IFLA_AF_SPEC, body), index=index, family=AF_BRIDGE)

        self.request(RTM_DELLINK, 0, spec(0, DEFAULT_VLAN), tolerate=(errno.ENOENT, errno.EINVAL))
        self.request(RTM_SETLINK, 0, spec(BRIDGE_VLAN_INFO_PVID | BRIDGE_VLAN_INFO_UNTAGGED, vid))

    def wait_oper_up(self, name: str, deadline: float = OPER_UP_DEADLINE) -> Link:
        """The host veth once its operational state is up (then the bridge forwards on it)."""
        import time

        end = time.monotonic() + deadline
        pause = 0.001
        while True:
            link = self.link(name)
            if link is None:
                raise CniError(KERNEL_FAILURE, f"host veth {name} vanished during ADD")
            if link.oper == OPER_UP or time.monotonic() > end:
                if link.oper != OPER_UP:
                    raise CniError(
                        KERNEL_FAILURE, f"bridge port {name} in error state: {link.oper}"
                    )
                return link
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def delete_link(self, name: str) -> bool:
        """Delete the link `name`; False when there is none."""
        try:
            self.request(RTM_DELLINK, 0, _ifinfo(nla_string(IFLA_IFNAME, name)))
        except NetlinkError as e:
            if e.errno in (errno.ENODEV, errno.EINVAL):
                return False
            raise kernel_error(f"could not delete {name}", e) from None
        return True

    def set_up(self, index: int) -> None:
        self._newlink(b"", index=index, flags=IFF_UP, change=IFF_UP)

    # ------------------------------------------------------------------ addresses, routes

    def addresses(self, index: int, family: int = 0) -> list[str]:
        """The link's addresses as CIDRs (link-local IPv6 ones included).

        The dump names the link and the socket asks for strict checking, so the kernel
        sends this link's addresses only, not those of every host veth (each has an IPv6
        link-local one); a kernel without the option sends them all, filtered here."""
        if not self.strict:
            try:  # noqa: SIM105 (contextlib is not on the call path)
                self.sock.sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            except OSError:
                pass  # older than 4.20: an unfiltered dump
            self.strict = True
        out = []
        request = _IFADDR.pack(family, 0, 0, 0, index)
        for reply in self.request(RTM_GETADDR, NLM_F_DUMP, request):
            fam, length, _, _, where = _IFADDR.unpack_from(reply, _HDR)
            if where != index:
                continue
            found = dict(nlas(reply[_HDR + _IFADDR.size :]))
            raw = found.get(IFA_LOCAL) or found.get(IFA_ADDRESS)
            if raw:
                out.append(f"{_socket.inet_ntop(fam, raw)}/{length}")
        return out

    def _address_msg(self, index: int, cidr: str, nodad: bool) -> bytes:
        address, _, length = cidr.partition("/")
        family = _family(address)
        raw = _ip(address)
        attrs = nla(IFA_LOCAL, raw) + nla(IFA_ADDRESS, raw)
        if family == AF_INET and int(length) < 31:
            from flatnet.plan import broadcast_of

            attrs += nla(IFA_BROADCAST, _ip(broadcast_of(cidr)))
        if family == AF_INET6 and nodad:
            attrs += _u32(IFA_FLAGS, IFA_F_NODAD)
        return _IFADDR.pack(family, int(length), 0, 0, index) + attrs

    def add_address(self, index: int, cidr: str, *, nodad: bool = True) -> None:
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, self._address_msg(index, cidr, nodad))

    def delete_address(self, index: int, cidr: str) -> None:
        self.request(RTM_DELADDR, 0, self._address_msg(index, cidr, False))

    def add_route(self, index: int, route: Route, gateway: str) -> None:
        dst, _, length = route.dst.partition("/")
        family = _family(dst)
        dst_len = int(length or (128 if family == AF_INET6 else 32))
        table = RT_TABLE_MAIN if route.table is None or route.table > 255 else route.table
        scope = route.scope
        if scope is None:
            scope = RT_SCOPE_UNIVERSE if gateway else RT_SCOPE_LINK
        attrs = _u32(RTA_OIF, index)
        if dst_len:
            attrs += nla(RTA_DST, _ip(dst))
        if gateway:
            attrs += nla(RTA_GATEWAY, _ip(gateway))
        if route.priority is not None:
            attrs += _u32(RTA_PRIORITY, route.priority)
        if route.table is not None:
            attrs += _u32(RTA_TABLE, route.table)
        body = _RTMSG.pack(family, dst_len, 0, 0, table, RTPROT_BOOT, scope, RTN_UNICAST, 0)
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body + attrs)


def set_sysctl(path: str, value: str, *, only_if_different: bool = False) -> bool:
    """Write /proc/sys/<path> in the current namespace; False when it does not exist (an
    IPv6 key where IPv6 is off), which the Go bridge ignores too."""
    file = "/proc/sys/" + path
    try:
        if only_if_different and read_sysctl(file) == value:
            return True
        write_sysctl(file, value)
    except FileNotFoundError:
        return False
    return True

"""The part of flatnet that talks rtnetlink: the bridge, the veth pair, addresses, routes
and the sysctls that go with them. pyroute2's message classes on common.rtnl's socket,
one socket per namespace; nothing here decides anything (verbs and plan do)."""

from __future__ import annotations

import errno
import os
import time
from contextlib import suppress

from common.errors import INVALID_CONFIG, KERNEL_FAILURE, CniError
from common.rtnl import (
    IFF_PROMISC,
    IFF_UP,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    RTM_DELLINK,
    RTM_GETLINK,
    RTM_NEWLINK,
    SOL_NETLINK,
    NetlinkError,
    RtnlSocket,
    pyroute2,
)
from common.sysctl import read_sysctl, write_sysctl

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

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
NETLINK_GET_STRICT_CHK = 12  # a dump request's header filters (linux/netlink.h)
RTEXT_FILTER_SKIP_STATS = 1 << 3  # a link's reply without its counters (a third its size)
OPER_UP = "UP"
# How long ADD waits for the host veth's carrier to reach the bridge (the kernel's link
# watch batches such events, at most one second apart): the port forwards only then.
OPER_UP_DEADLINE = 3.0


def _family(address: str) -> int:
    return AF_INET6 if ":" in address else AF_INET


def random_mac() -> str:
    """A random, locally administered unicast address (what the kernel would pick), chosen
    here so that ADD knows it without asking the kernel afterwards."""
    raw = bytearray(os.urandom(6))
    raw[0] = (raw[0] & 0xFE) | 0x02
    return ":".join(f"{b:02x}" for b in raw)


def kernel_error(what: str, e: OSError) -> CniError:
    code = INVALID_CONFIG if e.errno in (errno.EINVAL, errno.ERANGE) else KERNEL_FAILURE
    return CniError(code, f"{what}: {e.strerror}", str(e))


def _kind(link: Any) -> str:
    info = link.get_attr("IFLA_LINKINFO")
    return "" if info is None else str(info.get_attr("IFLA_INFO_KIND") or "")


class Link:
    """What flatnet reads of a link."""

    __slots__ = ("index", "kind", "mac", "master", "mtu", "name", "oper", "up")

    def __init__(self, msg: Any) -> None:
        self.index: int = msg["index"]
        self.name: str = msg.get_attr("IFLA_IFNAME") or ""
        self.kind = _kind(msg)
        self.mac: str = msg.get_attr("IFLA_ADDRESS") or ""
        self.mtu: int = msg.get_attr("IFLA_MTU") or 0
        self.master: int = msg.get_attr("IFLA_MASTER") or 0
        self.oper = str(msg.get_attr("IFLA_OPERSTATE") or "")
        self.up = bool(msg["flags"] & IFF_UP)


class Rtnl:
    """rtnetlink requests in one namespace ("": the current one)."""

    def __init__(self, netns: str = "") -> None:
        self.sock = RtnlSocket(netns)
        self.m = self.sock.modules
        self.strict = False  # NETLINK_GET_STRICT_CHK asked for on the socket

    def close(self) -> None:
        self.sock.close()

    def link(self, name: str = "", index: int = 0) -> Link | None:
        """The link named `name`, or else with ifindex `index`; None when there is none
        (ENODEV; EINVAL: a name the kernel cannot even look up names no device either)."""
        msg = self.m.ifinfmsg()
        msg["index"] = index
        attrs: list[Any] = [["IFLA_EXT_MASK", RTEXT_FILTER_SKIP_STATS]]
        if name:
            attrs.append(["IFLA_IFNAME", name])
        msg["attrs"] = attrs
        found = self.sock.request(msg, RTM_GETLINK, tolerate=(errno.ENODEV, errno.EINVAL))
        return Link(found[0]) if found else None

    def _newlink(self, attrs: list[Any], *, index: int = 0, flags: int = 0, change: int = 0,
                 create: bool = False, family: int = 0) -> None:  # fmt: skip
        msg = self.m.ifinfmsg()
        msg["family"] = family
        msg["index"] = index
        msg["flags"] = flags
        msg["change"] = change
        msg["attrs"] = attrs
        nl = NLM_F_CREATE | NLM_F_EXCL if create else 0
        self.sock.request(msg, RTM_NEWLINK, nl)

    # ------------------------------------------------------------------ the bridge

    def create_bridge(self, name: str, mac: str, mtu: int | None, vlan_filtering: bool) -> bool:
        """Create the bridge (down: update_bridge brings it up once its sysctls are set),
        with its MAC set (a bridge whose MAC was set keeps it as ports come and go). False
        when it exists already (made meanwhile by another ADD)."""
        data: list[Any] = [["IFLA_BR_VLAN_FILTERING", 1]] if vlan_filtering else []
        info: list[Any] = [["IFLA_INFO_KIND", "bridge"]]
        if data:
            info.append(["IFLA_INFO_DATA", {"attrs": data}])
        attrs: list[Any] = [["IFLA_IFNAME", name], ["IFLA_ADDRESS", mac],
                            ["IFLA_LINKINFO", {"attrs": info}]]  # fmt: skip
        if mtu:
            attrs.append(["IFLA_MTU", mtu])
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
        attrs: list[Any] = [["IFLA_ADDRESS", bridge.mac]]
        if mtu and mtu != bridge.mtu:
            attrs.append(["IFLA_MTU", mtu])
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
        peer_attrs: list[Any] = [["IFLA_IFNAME", peer], ["IFLA_ADDRESS", peer_mac],
                                 ["IFLA_NET_NS_FD", netns_fd]]  # fmt: skip
        attrs: list[Any] = [["IFLA_IFNAME", host], ["IFLA_ADDRESS", host_mac],
                            ["IFLA_MASTER", master]]  # fmt: skip
        if mtu:
            peer_attrs.append(["IFLA_MTU", mtu])
            attrs.append(["IFLA_MTU", mtu])
        info = [
            ["IFLA_INFO_KIND", "veth"],
            ["IFLA_INFO_DATA", {"attrs": [["VETH_INFO_PEER", {"attrs": peer_attrs}]]}],
        ]
        attrs.append(["IFLA_LINKINFO", {"attrs": info}])  # fmt: skip
        self._newlink(attrs, flags=IFF_UP, change=IFF_UP, create=True)

    def set_port(self, index: int, hairpin: bool, isolated: bool) -> None:
        data = [["IFLA_BRPORT_MODE", int(hairpin)], ["IFLA_BRPORT_ISOLATED", int(isolated)]]
        info = [["IFLA_INFO_SLAVE_KIND", "bridge"], ["IFLA_INFO_SLAVE_DATA", {"attrs": data}]]
        self._newlink([["IFLA_LINKINFO", {"attrs": info}]], index=index)

    def set_port_vlan(self, index: int, vid: int) -> None:
        """The port's only VLAN: `vid`, untagged and the PVID (Go's bridge drops the
        default VLAN 1 first)."""

        def spec(flags: int, vlan: int) -> list[Any]:
            return [["IFLA_AF_SPEC", {"attrs": [
                ["IFLA_BRIDGE_FLAGS", BRIDGE_FLAGS_MASTER],
                ["IFLA_BRIDGE_VLAN_INFO", {"flags": flags, "vid": vlan}],
            ]}]]  # fmt: skip

        msg = self.m.ifinfmsg()
        msg["family"] = AF_BRIDGE
        msg["index"] = index
        msg["attrs"] = spec(0, DEFAULT_VLAN)
        self.sock.request(msg, RTM_DELLINK, tolerate=(errno.ENOENT, errno.EINVAL))
        msg = self.m.ifinfmsg()
        msg["family"] = AF_BRIDGE
        msg["index"] = index
        msg["attrs"] = spec(BRIDGE_VLAN_INFO_PVID | BRIDGE_VLAN_INFO_UNTAGGED, vid)
        self.sock.request(msg, RTM_SETLINK)

    def wait_oper_up(self, name: str, deadline: float = OPER_UP_DEADLINE) -> Link:
        """The host veth once its operational state is up (then the bridge forwards on it)."""
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
        msg = self.m.ifinfmsg()
        msg["attrs"] = [["IFLA_IFNAME", name]]
        try:
            self.sock.request(msg, RTM_DELLINK)
        except NetlinkError as e:
            if e.errno in (errno.ENODEV, errno.EINVAL):
                return False
            raise kernel_error(f"could not delete {name}", e) from None
        return True

    def set_up(self, index: int) -> None:
        self._newlink([], index=index, flags=IFF_UP, change=IFF_UP)

    # ------------------------------------------------------------------ addresses, routes

    def addresses(self, index: int, family: int = 0) -> list[str]:
        """The link's addresses as CIDRs (link-local IPv6 ones included).

        The dump names the link and the socket asks for strict checking, so the kernel
        sends this link's addresses only, not those of every host veth (each has an IPv6
        link-local one); a kernel without the option sends them all, filtered here."""
        if not self.strict:
            with suppress(OSError):  # older than 4.20: an unfiltered dump
                self.sock.nl.sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
            self.strict = True
        msg = _ip_messages(self.m).ifaddrmsg()
        msg["family"] = family
        msg["index"] = index
        out = []
        for reply in self.sock.request(msg, RTM_GETADDR, NLM_F_DUMP):
            if reply["index"] == index:
                address = reply.get_attr("IFA_LOCAL") or reply.get_attr("IFA_ADDRESS")
                out.append(f"{address}/{reply['prefixlen']}")
        return out

    def _address_msg(self, index: int, cidr: str, nodad: bool) -> Any:
        address, _, length = cidr.partition("/")
        family = _family(address)
        msg = _ip_messages(self.m).ifaddrmsg()
        msg["family"] = family
        msg["prefixlen"] = int(length)
        msg["index"] = index
        attrs: list[Any] = [["IFA_LOCAL", address], ["IFA_ADDRESS", address]]
        if family == AF_INET and int(length) < 31:
            from flatnet.plan import broadcast_of

            attrs.append(["IFA_BROADCAST", broadcast_of(cidr)])
        if family == AF_INET6 and nodad:
            attrs.append(["IFA_FLAGS", IFA_F_NODAD])
        msg["attrs"] = attrs
        return msg

    def add_address(self, index: int, cidr: str, *, nodad: bool = True) -> None:
        self.sock.request(
            self._address_msg(index, cidr, nodad), RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL
        )

    def delete_address(self, index: int, cidr: str) -> None:
        self.sock.request(self._address_msg(index, cidr, False), RTM_DELADDR)

    def add_route(self, index: int, route: Route, gateway: str) -> None:
        dst, _, length = route.dst.partition("/")
        family = _family(dst)
        msg = _ip_messages(self.m).rtmsg()
        msg["family"] = family
        msg["dst_len"] = int(length or (128 if family == AF_INET6 else 32))
        msg["table"] = RT_TABLE_MAIN if route.table is None or route.table > 255 else route.table
        msg["proto"] = RTPROT_BOOT
        msg["type"] = RTN_UNICAST
        scope = route.scope
        if scope is None:
            scope = RT_SCOPE_UNIVERSE if gateway else RT_SCOPE_LINK
        msg["scope"] = scope
        attrs: list[Any] = [["RTA_OIF", index]]
        if msg["dst_len"]:
            attrs.append(["RTA_DST", dst])
        if gateway:
            attrs.append(["RTA_GATEWAY", gateway])
        if route.priority is not None:
            attrs.append(["RTA_PRIORITY", route.priority])
        if route.table is not None:
            attrs.append(["RTA_TABLE", route.table])
        msg["attrs"] = attrs
        self.sock.request(msg, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL)


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


def _ip_messages(modules: Any) -> Any:
    """pyroute2's address and route classes, loaded by the first call that sends one
    (DEL sends none)."""
    if not hasattr(modules, "ifaddrmsg"):
        from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
        from pyroute2.netlink.rtnl.rtmsg import rtmsg

        modules.ifaddrmsg, modules.rtmsg = ifaddrmsg, rtmsg
    return modules


def preload(ip: bool) -> None:
    """The pyroute2 message classes an ADD sends, before the store's lock (their import
    is the slow part, and every other flatnet call of the node waits for the lock): the
    link class, and with `ip` (there is an IPAM) the address and route ones."""
    modules = pyroute2()
    if ip:
        _ip_messages(modules)

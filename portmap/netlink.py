"""The two kernel questions portmap asks besides nftables, without pyroute2 (~110 ms to
import on every container start). Both answer for the caller's network namespace (where
/proc/net and the socket belong). The conntrack messages travel on common.rtnl's
NetlinkSocket, imported only when there is something to flush.
"""

from __future__ import annotations

import _socket  # not socket: that imports selectors and enum (~2 ms)
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h
NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_GET, IPCTNL_MSG_CT_DELETE = 1, 2
CTA_TUPLE_ORIG, CTA_ZONE = 1, 18  # in a conntrack entry
CTA_TUPLE_IP, CTA_TUPLE_PROTO = 1, 2  # in CTA_TUPLE_ORIG
CTA_IP_V4_DST, CTA_IP_V6_DST = 2, 4  # in CTA_TUPLE_IP
CTA_PROTO_NUM, CTA_PROTO_DST_PORT = 1, 3  # in CTA_TUPLE_PROTO
IPPROTO_UDP = 17


def route_oif_v4(ip: str) -> str | None:
    """The interface the host routes a container address through (the bridge), whose
    route_localnet must be on for 127.0.0.1 to be forwarded: the longest-prefix IPv4 route
    of the main table, from /proc/net/route (no socket module to import on the ADD path)."""
    target = sum(int(b) << (8 * i) for i, b in enumerate(ip.split(".")))  # little-endian
    try:
        with open("/proc/net/route") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return None
    # columns: Iface Destination Gateway Flags RefCnt Use Metric Mask ...
    routes = [r for r in rows if len(r) >= 8 and target & int(r[7], 16) == int(r[1], 16)]
    best = max(routes, key=lambda r: (int(r[7], 16).bit_count(), -int(r[6])), default=None)
    return best[0] if best else None


def nfgenmsg(family: int) -> bytes:
    """The nfnetlink header of a request about IPv4 or IPv6 (4/6): AF_INET or AF_INET6
    (NFPROTO_IPV4/IPV6 are the same numbers), version 0, res_id 0."""
    return struct.pack("=BBH", _socket.AF_INET6 if family == 6 else _socket.AF_INET, 0, 0)


def _udp_destination(payload: bytes) -> tuple[bytes, bytes, int, bytes] | None:
    """(raw CTA_TUPLE_ORIG, raw CTA_ZONE, original destination port and address) of one
    conntrack entry, None unless it is UDP."""
    from common.rtnl import nlas

    entry = dict(nlas(payload[4:]))
    tuple_raw = entry.get(CTA_TUPLE_ORIG, b"")
    orig = dict(nlas(tuple_raw))
    proto = dict(nlas(orig.get(CTA_TUPLE_PROTO, b"")))
    if proto.get(CTA_PROTO_NUM, b"\0")[0] != IPPROTO_UDP:
        return None
    (port,) = struct.unpack("!H", proto.get(CTA_PROTO_DST_PORT, b"\0\0")[:2])
    ip = dict(nlas(orig.get(CTA_TUPLE_IP, b"")))
    addr = ip.get(CTA_IP_V4_DST) or ip.get(CTA_IP_V6_DST) or b""
    return tuple_raw, entry.get(CTA_ZONE, b""), port, addr


def flush_udp_conntrack(family: int, targets: Iterable[tuple[str | None, int]]) -> int:
    """Delete UDP conntrack entries of `family` (4/6) whose original destination port is a
    target port (and, when the target has a host address, whose destination is it), so
    that old flows stop going to a previous container. Returns how many were deleted."""
    from common import rtnl

    wanted: dict[int, set[bytes | None]] = {}
    af = _socket.AF_INET6 if family == 6 else _socket.AF_INET
    for host_ip, port in targets:
        wanted.setdefault(port, set()).add(_socket.inet_pton(af, host_ip) if host_ip else None)
    if not wanted:
        return 0
    doomed: list[tuple[bytes, bytes]] = []
    get = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
    delete = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE
    with rtnl.NetlinkSocket(rtnl.NETLINK_NETFILTER) as nl:
        for reply in nl.request(get, rtnl.NLM_F_DUMP, nfgenmsg(family)):
            entry = _udp_destination(reply[rtnl.NLMSG_HDRLEN :])
            if entry is None:
                continue
            tuple_raw, zone, port, addr = entry
            if port in wanted and wanted[port] & {None, addr}:
                doomed.append((tuple_raw, zone))
        deleted = 0
        for tuple_raw, zone in doomed:
            body = rtnl.nla(CTA_TUPLE_ORIG | rtnl.NLA_F_NESTED, tuple_raw)
            if zone:
                body += rtnl.nla(CTA_ZONE, zone)
            try:
                nl.call(delete, 0, nfgenmsg(family) + body)
                deleted += 1
            except rtnl.NetlinkError:
                pass  # gone already (expired or deleted by someone else): fine
    return deleted

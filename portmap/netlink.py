"""The two kernel questions portmap asks, without pyroute2.

pyroute2 would answer both but costs ~110 ms to import on every container start; these
are a few dozen lines of text reading and struct packing:

* `route_oif_v4(ip)`: the interface the host routes a container address through (the
  bridge), whose route_localnet must be on for 127.0.0.1 to be forwarded (IPv4 only:
  IPv6 has no route_localnet), read from /proc/net/route;
* `flush_udp_conntrack(...)`: delete the UDP conntrack entries whose original
  destination is one of the given host ports (and host address, for hostIP mappings), so
  that old flows stop going to a previous container.

Both answer for the caller's network namespace (where /proc/net and the socket belong).
The conntrack messages travel on common.rtnl's NetlinkSocket, imported by the functions
that use it (an ADD without UDP mappings loads nothing more); their encoding is here.
"""

from __future__ import annotations

import _socket  # not socket: that imports selectors and enum (~2 ms)
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_GET = 1
IPCTNL_MSG_CT_DELETE = 2
CTA_TUPLE_ORIG = 1
CTA_ZONE = 18
CTA_TUPLE_IP = 1
CTA_TUPLE_PROTO = 2
CTA_IP_V4_DST = 2
CTA_IP_V6_DST = 4
CTA_PROTO_NUM = 1
CTA_PROTO_DST_PORT = 3
IPPROTO_UDP = 17


def route_oif_v4(ip: str) -> str | None:
    """The interface of the longest-prefix IPv4 route to `ip`, from /proc/net/route (the
    current netns's main table; no socket module to import on the ADD path)."""
    target = sum(int(b) << (8 * i) for i, b in enumerate(ip.split(".")))  # little-endian
    best: tuple[int, int, str] | None = None
    try:
        with open("/proc/net/route") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 8:
            continue
        iface, dest, mask, metric = (
            fields[0],
            int(fields[1], 16),
            int(fields[7], 16),
            int(fields[6]),
        )
        if target & mask != dest:
            continue
        score = (bin(mask).count("1"), -metric, iface)
        if best is None or score[:2] > best[:2]:
            best = score
    return best[2] if best else None


def _ct_header(family: int) -> bytes:
    return struct.pack("=BBH", family, 0, 0)  # nfgenmsg: family, version 0, res_id


def _orig_destination(payload: bytes) -> tuple[bytes, bytes, int, int] | None:
    """(raw CTA_TUPLE_ORIG, raw CTA_ZONE, protocol, destination port) of one ct entry."""
    from common.rtnl import nlas

    tuple_raw = b""
    zone = b""
    for atype, value in nlas(payload[4:]):
        if atype == CTA_TUPLE_ORIG:
            tuple_raw = value
        elif atype == CTA_ZONE:
            zone = value
    if not tuple_raw:
        return None
    proto = dport = 0
    for atype, value in nlas(tuple_raw):
        if atype == CTA_TUPLE_PROTO:
            for ptype, pvalue in nlas(value):
                if ptype == CTA_PROTO_NUM:
                    proto = pvalue[0]
                elif ptype == CTA_PROTO_DST_PORT:
                    (dport,) = struct.unpack("!H", pvalue[:2])
    return tuple_raw, zone, proto, dport


def _orig_daddr(tuple_raw: bytes) -> bytes:
    from common.rtnl import nlas

    for atype, value in nlas(tuple_raw):
        if atype == CTA_TUPLE_IP:
            for itype, ivalue in nlas(value):
                if itype in (CTA_IP_V4_DST, CTA_IP_V6_DST):
                    return ivalue
    return b""


def flush_udp_conntrack(family: int, targets: Iterable[tuple[str | None, int]]) -> int:
    """Delete UDP conntrack entries of `family` (4/6) whose original destination port is a
    target port (and, when the target has a host address, whose destination is it).
    Returns how many entries were deleted."""
    from common import rtnl

    wanted: dict[int, set[bytes | None]] = {}
    af = _socket.AF_INET6 if family == 6 else _socket.AF_INET
    for host_ip, port in targets:
        addr = _socket.inet_pton(af, host_ip) if host_ip else None
        wanted.setdefault(port, set()).add(addr)
    if not wanted:
        return 0
    doomed: list[tuple[bytes, bytes]] = []
    get = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
    delete = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE
    with rtnl.NetlinkSocket(rtnl.NETLINK_NETFILTER) as nl:
        for reply in nl.request(get, rtnl.NLM_F_DUMP, _ct_header(af)):
            parsed = _orig_destination(reply[rtnl.NLMSG_HDRLEN :])
            if parsed is None:
                continue
            tuple_raw, zone, proto, dport = parsed
            if proto != IPPROTO_UDP or dport not in wanted:
                continue
            addrs = wanted[dport]
            if None not in addrs and _orig_daddr(tuple_raw) not in addrs:
                continue
            doomed.append((tuple_raw, zone))
        deleted = 0
        for tuple_raw, zone in doomed:
            body = rtnl.nla(CTA_TUPLE_ORIG | rtnl.NLA_F_NESTED, tuple_raw)
            if zone:
                body += rtnl.nla(CTA_ZONE, zone)
            try:
                for _ in nl.request(delete, 0, _ct_header(af) + body):
                    pass
                deleted += 1
            except rtnl.NetlinkError:
                pass  # gone already (expired or deleted by someone else): fine
    return deleted

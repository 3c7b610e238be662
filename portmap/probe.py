"""Cheap looks into the kernel's nat tables, without running an iptables tool: whether a
chain may be there (the Go portmap's, before a DEL we have no state for, and
CNI-HOSTPORT-DNAT before a GC looks for stale mappings).
"""

from __future__ import annotations

import _socket  # not socket: that imports selectors and enum (~2 ms) for nothing here
import struct

from common.rtnl import NETLINK_NETFILTER, NetlinkSocket, nla_string
from portmap.netlink import nfgenmsg

_NFT_SUBSYS = 10 << 8
_MSG_GETTABLE, _MSG_GETCHAIN = 1, 4


def nft_has(family: int, table: str, chain: str | None = None) -> bool:
    """Whether nftables has this table (or this chain of it) in the current netns: one
    nfnetlink request, answered with the object or with an error."""
    if chain is None:
        msg_type, attrs = _MSG_GETTABLE, nla_string(1, table)  # NFTA_TABLE_NAME
    else:
        msg_type = _MSG_GETCHAIN
        attrs = nla_string(1, table) + nla_string(3, chain)  # NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME
    body = nfgenmsg(family) + attrs
    try:
        with NetlinkSocket(NETLINK_NETFILTER) as nl:
            nl.call(_NFT_SUBSYS | msg_type, 0, body)
    except OSError:  # ENOENT: not there; no nf_tables here: nothing of Go's in it either
        return False
    return True


_LEGACY_NAMES = {4: "/proc/net/ip_tables_names", 6: "/proc/net/ip6_tables_names"}
_SOL = {4: _socket.IPPROTO_IP, 6: _socket.IPPROTO_IPV6}
_SO_GET_INFO, _SO_GET_ENTRIES = 64, 65  # IPT_/IP6T_SO_GET_*: same numbers for both
_GETINFO_SIZE = 84  # name[32], valid_hooks, hook_entry[5], underflow[5], num_entries, size
_GET_ENTRIES_HEADER = 40  # name[32], size, then 8-aligned entries


def legacy_may_have(family: int, chain: str) -> bool:
    """Whether the legacy nat table of `family` may hold `chain`: False for sure when
    there is no legacy nat table or its rules do not contain the name; True otherwise
    (also when the table cannot be read this way: the iptables tools then look)."""
    try:
        with open(_LEGACY_NAMES[family]) as f:
            if "nat" not in f.read().split():
                return False  # asking for it would create it: never do
    except OSError:
        return False
    blob = _legacy_nat_blob(family)
    return blob is None or chain.encode() + b"\0" in blob


def may_have(variant: str, family: int, chain: str) -> bool:
    """Whether that iptables variant's nat table may hold `chain`, without running a tool."""
    if variant == "nft":
        return nft_has(family, "nat", chain)
    return legacy_may_have(family, chain)


def _legacy_nat_blob(family: int) -> bytes | None:
    """The legacy nat table's rules as the kernel hands them to iptables (None: unreadable).
    A user chain starts with an ERROR target that carries its name."""
    import ctypes

    from common.netns import libc

    c = libc()
    try:
        s = _socket.socket(_socket.AF_INET6 if family == 6 else _socket.AF_INET,
                           _socket.SOCK_RAW, _socket.IPPROTO_RAW)  # fmt: skip
    except OSError:
        return None
    try:
        info = ctypes.create_string_buffer(b"nat", _GETINFO_SIZE)
        length = ctypes.c_uint32(_GETINFO_SIZE)
        if c.getsockopt(s.fileno(), _SOL[family], _SO_GET_INFO, info, ctypes.byref(length)):
            return None
        (size,) = struct.unpack_from("=I", info.raw, _GETINFO_SIZE - 4)
        request = b"nat".ljust(32, b"\0") + struct.pack("=I", size)
        entries = ctypes.create_string_buffer(request, _GET_ENTRIES_HEADER + size)
        length = ctypes.c_uint32(_GET_ENTRIES_HEADER + size)
        if c.getsockopt(s.fileno(), _SOL[family], _SO_GET_ENTRIES, entries, ctypes.byref(length)):
            return None  # e.g. the table changed size in between: let the tools look
        return entries.raw
    finally:
        s.close()

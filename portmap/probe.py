"""Cheap looks into the kernel's nat tables, without running an iptables tool: whether a
chain may be there (the Go portmap's, before a DEL we have no state for, and
CNI-HOSTPORT-DNAT before a GC looks for stale mappings).
"""

from __future__ import annotations

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


def legacy_may_have(family: int) -> bool:
    """Whether the legacy nat table of `family` exists, so that it may hold a chain: False
    for sure when it does not. Its rules can only be read through a raw IP socket (what
    iptables-legacy-save does), and the plugins open no socket but netlink: where the
    table exists, the iptables tools look."""
    try:
        with open(_LEGACY_NAMES[family]) as f:
            return "nat" in f.read().split()  # asking for a missing table would create it
    except OSError:
        return False


def may_have(variant: str, family: int, chain: str) -> bool:
    """Whether that iptables variant's nat table may hold `chain`, without running a tool."""
    if variant == "nft":
        return nft_has(family, "nat", chain)
    return legacy_may_have(family)

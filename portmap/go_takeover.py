"""Removing what the Go portmap (containernetworking/plugins 1.1 to 1.9) made, on a DEL
we have no state for: its iptables chain and jumps (either variant; the iptables backend
makes the same ones, so portmap.xtables removes them, and its GC collects them) and its
nftables rules. What, why and what it costs:
docs/differences.md#taking-over-from-the-go-plugins.
"""

from __future__ import annotations

import _socket  # not socket: that imports selectors and enum (~2 ms) for nothing here
import struct

from common.errors import KERNEL_FAILURE, CniError
from common.log import Log
from common.rtnl import NETLINK_NETFILTER, NetlinkSocket, nla_string
from common.state import AttachmentStore
from portmap.netlink import nfgenmsg

TYPE_CHECKING = False  # avoids importing typing at run time
if TYPE_CHECKING:
    from typing import Any

    from portmap.nft import Nft
    from portmap.plan import UdpTargets

    Rule = tuple[int, str, dict[str, Any]]

VARIANTS = ("nft", "legacy")  # portmap.xtables.VARIANTS, without importing it
GO_TABLE = "cni_hostport"
GO_NFT_CHAINS = ("hostports", "hostip_hostports", "masquerading")


# ---------------------------------------------------------------------------- cheap looks


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


# ---------------------------------------------------------------------------- removal


def release(network: str, container_id: str, sd: AttachmentStore, log: Log) -> UdpTargets:
    """Remove Go's objects of this attachment (one we have no state for); (family, host
    ip, port) of its UDP mappings for the conntrack flush."""
    from portmap import xtables

    chain = xtables.go_chain_name(network, container_id)
    iptables = [(v, f) for v in VARIANTS for f in (6, 4) if may_have(v, f, chain)]
    if iptables and xtables.recorded_owner(sd, network, container_id, chain):
        iptables = []  # Go's name, given to another attachment of ours of this container
    go_nft = [f for f in (6, 4) if nft_has(f, GO_TABLE)]
    targets: UdpTargets = []
    if go_nft:
        from portmap import nft

        with sd.lock(nft.LOCK):  # our nftables backend's: the same writers
            targets += _release_go_nft(container_id, go_nft, log)
    if iptables:
        with sd.lock(xtables.LOCK):  # our iptables backend's; the tools wait for xtables'
            for variant, family in iptables:
                targets += xtables.delete_chains(variant, family, (chain,))
        log.info(f"removed the Go portmap's iptables chain {chain}, if there")
    return targets


def _release_go_nft(container_id: str, families: list[int], log: Log) -> UdpTargets:
    from portmap.nft import Nft, first_error

    nft = Nft()
    nft.context.set_json_output(True)
    found = _go_nft_rules(nft, container_id, families)
    if not found:
        return []
    lines = [f"delete rule {chain} handle {int(rule['handle'])}" for _, chain, rule in found]
    targets = [target for family, _, rule in found for target in _udp_target(family, rule)]
    rc, _, err = nft.run("\n".join(lines))
    # Somebody else (not taking our lock) may have removed them meanwhile: fine.
    if rc != 0 and _go_nft_rules(nft, container_id, families):
        raise CniError(
            KERNEL_FAILURE,
            f"cannot remove the Go portmap's rules of container {container_id}",
            first_error(err),
        )
    log.info(f"removed the Go portmap's nftables rules of {container_id} ({len(lines)} changes)")
    return targets


def _go_nft_rules(nft: Nft, container_id: str, families: list[int]) -> list[Rule]:
    """(family, "ip cni_hostport <chain>", rule as JSON) of the rules commented with the
    container id."""
    from common.jsontext import loads
    from portmap.nft import IPX

    found = []
    for family in families:
        for name in GO_NFT_CHAINS:
            chain = f"{IPX[family]} {GO_TABLE} {name}"
            rc, out, _ = nft.run(f"list chain {chain}")
            items = loads(out).get("nftables", []) if rc == 0 else []  # else: no such chain
            found += [
                (family, chain, i["rule"])
                for i in items
                if isinstance(i, dict) and i.get("rule", {}).get("comment") == container_id
            ]
    return found


def _udp_target(family: int, rule: dict[str, Any]) -> UdpTargets:
    """(family, host address or None, port) of a Go DNAT rule for UDP, from its JSON (none
    for any other rule)."""
    port, host_ip, dnat = None, None, False
    for e in rule.get("expr", []):
        match = e.get("match") if isinstance(e, dict) else None
        if isinstance(e, dict) and "dnat" in e:
            dnat = True
        if not isinstance(match, dict):
            continue
        left = match.get("left", {}).get("payload", {})
        if left.get("protocol") == "udp" and left.get("field") == "dport":
            port = match.get("right")
        elif left.get("field") == "daddr" and isinstance(match.get("right"), str):
            host_ip = match["right"]
    return [(family, host_ip, int(port))] if dnat and isinstance(port, int) else []

"""Removing what the Go portmap (containernetworking/plugins 1.1 to 1.9) made for an
attachment, when our DEL finds no state of its own for it, and on GC the Go iptables
mappings of containers no longer valid (see `gc`).

A node that switches to these plugins still has pods whose host ports the Go plugin set
up; their DEL now comes to us, and the Go rules must go with it, or a later pod on the
same host port has its traffic sent to a dead address. What Go made per attachment:

* iptables backend (every version): in the nat table of iptables and ip6tables,
  chain `CNI-DN-` + the first 21 hex digits of sha512(network name + container id), and
  the jumps to it in `CNI-HOSTPORT-DNAT` (commented `dnat name: "N" id: "C"`). Go runs
  the `iptables` command, so the rules are in nftables' `ip nat`/`ip6 nat` tables
  (iptables-nft) or in the legacy xtables, whichever that command is: both are looked at.
  `CNI-HOSTPORT-DNAT`, `-SETMARK` and `-MASQ` and their hooks are shared and stay.
* nftables backend (1.6+): rules commented with the container id in chains `hostports`,
  `hostip_hostports` and `masquerading` of tables `ip cni_hostport` and `ip6 cni_hostport`.
  The rest of those tables is shared and stays.

Costs, as this runs on every DEL without state (a runtime's second DEL too): one
nfnetlink request per family and object (no libnftables), and for the legacy xtables a
look at /proc/net/ip*_tables_names and, only when a legacy nat table exists, one read of
it with getsockopt. libnftables or libiptc are loaded only when something was found.
"""

from __future__ import annotations

import _socket  # not socket: that imports selectors and enum (~2 ms) for nothing here
import struct

from common.digest import sha512_hex
from common.errors import KERNEL_FAILURE, STATUS_UNAVAILABLE, CniError
from common.log import Log
from common.rtnl import NETLINK_NETFILTER, NetlinkSocket, nla
from common.state import AttachmentStore

TYPE_CHECKING = False  # avoids importing typing at run time
if TYPE_CHECKING:
    from typing import Any

    from common.gc import AttachmentId
    from portmap.nft import Nft
    from portmap.plan import UdpTargets
    from portmap.xtables import Jump

TOP = "CNI-HOSTPORT-DNAT"
GO_COMMENT = 'dnat name: "{}" id: "'  # + container id + '"', on each jump in TOP
GO_TABLE = "cni_hostport"
GO_NFT_CHAINS = ("hostports", "hostip_hostports", "masquerading")
NFT_FAMILY = {4: "ip", 6: "ip6"}
NFT_LOCK = "nftables.lock"  # portmap.nft.LOCK, without importing that module


def go_chain_name(network: str, container_id: str) -> str:
    """Go's per-attachment chain: 28 characters, iptables' limit."""
    return ("CNI-DN-" + sha512_hex((network + container_id).encode()))[:28]


# ---------------------------------------------------------------------------- cheap looks


_NFPROTO = {4: 2, 6: 10}
_NFT_SUBSYS = 10 << 8
_MSG_GETTABLE, _MSG_GETCHAIN = 1, 4


def _name(kind: int, text: str) -> bytes:
    return nla(kind, text.encode() + b"\0")


def nft_has(family: int, table: str, chain: str | None = None) -> bool:
    """Whether nftables has this table (or this chain of it) in the current netns: one
    nfnetlink request, answered with the object or with an error."""
    if chain is None:
        msg_type, attrs = _MSG_GETTABLE, _name(1, table)  # NFTA_TABLE_NAME
    else:
        msg_type = _MSG_GETCHAIN
        attrs = _name(1, table) + _name(3, chain)  # NFTA_CHAIN_TABLE, NFTA_CHAIN_NAME
    body = struct.pack("=BBH", _NFPROTO[family], 0, 0) + attrs
    try:
        with NetlinkSocket(NETLINK_NETFILTER) as nl:
            for _ in nl.request(_NFT_SUBSYS | msg_type, 0, body):
                pass
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
    (also when the table cannot be read this way: libiptc then looks properly)."""
    try:
        with open(_LEGACY_NAMES[family]) as f:
            if "nat" not in f.read().split():
                return False  # asking for it would create it: never do
    except OSError:
        return False
    blob = _legacy_nat_blob(family)
    return blob is None or chain.encode() + b"\0" in blob


def _legacy_nat_blob(family: int) -> bytes | None:
    """The legacy nat table's rules as the kernel hands them to libiptc (None: unreadable).
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
            return None  # e.g. the table changed size in between: let libiptc look
        return entries.raw
    finally:
        s.close()


# ---------------------------------------------------------------------------- removal


def release(network: str, container_id: str, sd: AttachmentStore, log: Log) -> UdpTargets:
    """Remove Go's objects of this attachment (one we have no state for); (family, host
    ip, port) of its UDP mappings for the conntrack flush."""
    chain = go_chain_name(network, container_id)
    iptables_nft = [f for f in (6, 4) if nft_has(f, "nat", chain)]
    go_nft = [f for f in (6, 4) if nft_has(f, GO_TABLE)]
    legacy = [f for f in (6, 4) if legacy_may_have(f, chain)]
    if not (iptables_nft or go_nft or legacy):
        return []
    targets: UdpTargets = []
    if iptables_nft or go_nft:
        with sd.lock(NFT_LOCK):  # our nftables backend's: the same writers
            targets += _release_nft(chain, container_id, iptables_nft, go_nft, log)
    if legacy:
        targets += _release_legacy(chain, legacy, sd, log)
    return targets


def _release_nft(
    chain: str, container_id: str, iptables_nft: list[int], go_nft: list[int], log: Log
) -> UdpTargets:
    from portmap.nft import Nft

    nft = Nft()
    nft.set_json_output(True)
    lines: list[str] = []
    targets: UdpTargets = []
    for family in iptables_nft:
        t = f"{NFT_FAMILY[family]} nat"
        for rule in _rules(nft, f"{t} {TOP}"):
            if any(e.get("jump", {}).get("target") == chain for e in rule.get("expr", [])):
                lines.append(f"delete rule {t} {TOP} handle {int(rule['handle'])}")
        for rule in _rules(nft, f"{t} {chain}"):
            targets += _udp_target(family, rule)
        lines += [f"flush chain {t} {chain}", f"delete chain {t} {chain}"]
    for family in go_nft:
        t = f"{NFT_FAMILY[family]} {GO_TABLE}"
        for name in GO_NFT_CHAINS:
            for rule in _rules(nft, f"{t} {name}"):
                if rule.get("comment") == container_id:
                    lines.append(f"delete rule {t} {name} handle {int(rule['handle'])}")
                    targets += _udp_target(family, rule) if name != "masquerading" else []
    if not lines:
        return []
    rc, _, err = nft.run("\n".join(lines))
    # Somebody else (not taking our lock) may have removed them meanwhile: fine.
    if rc != 0 and (
        any(nft_has(f, "nat", chain) for f in iptables_nft)
        or _still_commented(nft, container_id, go_nft)
    ):
        raise CniError(
            KERNEL_FAILURE,
            f"cannot remove the Go portmap's rules of container {container_id}",
            err.strip()[:500],
        )
    log.info(f"removed the Go portmap's nftables rules of {container_id} ({len(lines)} changes)")
    return targets


def _rules(nft: Nft, where: str) -> list[dict[str, Any]]:
    import json

    rc, out, _ = nft.run(f"list chain {where}")
    if rc != 0:
        return []  # no such chain: nothing in it
    items = json.loads(out).get("nftables", [])
    return [i["rule"] for i in items if isinstance(i, dict) and "rule" in i]


def _still_commented(nft: Nft, container_id: str, families: list[int]) -> bool:
    return any(
        rule.get("comment") == container_id
        for family in families
        for name in GO_NFT_CHAINS
        for rule in _rules(nft, f"{NFT_FAMILY[family]} {GO_TABLE} {name}")
    )


def _udp_target(family: int, rule: dict[str, Any]) -> UdpTargets:
    """(family, host address or None, port) of a Go DNAT rule for UDP, from its JSON."""
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


def _release_legacy(chain: str, families: list[int], sd: AttachmentStore, log: Log) -> UdpTargets:
    """The same as Go's teardown, through our iptables backend on the legacy variant: the
    jumps to `chain` in CNI-HOSTPORT-DNAT, then the chain (each family in one commit)."""
    from portmap.xtables import LOCK, XtablesBackend

    backend = XtablesBackend(sd, log)
    targets: UdpTargets = []
    with sd.lock(LOCK):
        for family in families:
            udp = backend._delete_family("legacy", family, chain)
            targets += [(family, ip, port) for ip, port in udp]
    log.info(f"removed the Go portmap's chain {chain} from the legacy xtables, if there")
    return targets


# ---------------------------------------------------------------------------- GC


def gc(network: str, valid: set[AttachmentId], sd: AttachmentStore, log: Log) -> UdpTargets:
    """Remove the Go iptables portmap's mappings on `network` of containers no valid
    attachment has; (family, host ip, port) of their UDP mappings.

    Go's comment names the network and the container, not the ifname: a container listed
    with any ifname keeps its mappings. Go's nftables rules, ifbs and tuning backups name
    no network, so which GC they belong to is unknown: they stay (their DEL removes them).
    Go's objects are never in flight from our side: only the valid list counts.
    """
    alive = {a.container_id for a in valid}
    targets: UdpTargets = []
    for variant in ("nft", "legacy"):
        families = [f for f in (6, 4) if _has_top(variant, f)]
        if not families:
            continue
        from portmap.xtables import LOCK

        # the lock `release` takes for this variant: a DEL and a GC of one Go pod take turns
        with sd.lock(NFT_LOCK if variant == "nft" else LOCK):
            for family in families:
                targets += _gc_family(variant, family, network, alive, log)
    return targets


def _has_top(variant: str, family: int) -> bool:
    """Whether this variant may have Go's CNI-HOSTPORT-DNAT, without running a tool."""
    if variant == "nft":
        return nft_has(family, "nat", TOP)
    return legacy_may_have(family, TOP)


def _go_owner(jump: Jump, network: str) -> str:
    """The container id of a jump Go made on `network`, or "" for any other rule."""
    prefix = GO_COMMENT.format(network)
    comment = jump.comment
    if not (comment.startswith(prefix) and comment.endswith('"')):
        return ""
    container_id = comment[len(prefix) : -1]
    return container_id if jump.target == go_chain_name(network, container_id) else ""


def _stale(jump: Jump, network: str, alive: set[str]) -> bool:
    owner = _go_owner(jump, network)
    return bool(owner) and owner not in alive


def _gc_family(variant: str, family: int, network: str, alive: set[str], log: Log) -> UdpTargets:
    from portmap.xtables import NatTable, listing, removal, restore

    try:
        top = listing(variant, family, (TOP,))
    except CniError as e:
        if e.code != STATUS_UNAVAILABLE:
            raise
        return []  # that variant's tools are not installed: nothing to remove with
    stale = [j for j in NatTable(top).jumps() if _stale(j, network, alive)]
    if not stale:
        return []
    chains = sorted({j.target for j in stale})
    table = NatTable(top + "\n" + listing(variant, family, tuple(chains)))
    lines: list[str] = []
    targets: UdpTargets = []
    for chain in chains:
        if any(j.target == chain and not _stale(j, network, alive) for j in table.jumps()):
            # another rule still jumps there: only the stale jumps go
            lines += [j.delete() for j in stale if j.target == chain]
            continue
        more, udp = removal(table, chain)
        lines += more
        targets += [(family, ip, port) for ip, port in udp]
    complaint = restore(variant, family, lines)
    if complaint:
        raise CniError(
            KERNEL_FAILURE,
            f"iptables-{variant}-restore refused to delete the Go portmap's stale IPv{family} "
            f"mappings of network {network}",
            complaint,
        )
    gone = sorted({_go_owner(j, network) for j in stale})
    log.info(f"GC removed the Go portmap's iptables-{variant} IPv{family} mappings of {gone}")
    return targets

"""Removing what the Go portmap (containernetworking/plugins 1.1 to 1.9) made, on a DEL
we have no state for: its iptables chain and jumps (either variant; the iptables backend
makes the same ones, so portmap.xtables removes them, and its GC collects them) and its
nftables rules. What, why and what it costs:
docs/differences.md#taking-over-from-the-go-plugins.
"""

from __future__ import annotations

from common.errors import KERNEL_FAILURE, CniError

TYPE_CHECKING = False  # avoids importing typing at run time
if TYPE_CHECKING:
    from typing import Any

    from common.log import Log
    from portmap.nft import Nft
    from portmap.plan import UdpTargets
    from portmap.ports import Kernel, NftKernel
    from portmap.state import Store

VARIANTS = ("nft", "legacy")  # portmap.xtables.VARIANTS, without importing the backend
GO_TABLE = "cni_hostport"
GO_NFT_CHAINS = ("hostports", "hostip_hostports", "masquerading")


def release(
    network: str, container_id: str, cidrs: list[str], sd: Store, log: Log, kernel: Kernel
) -> UdpTargets:
    """Remove Go's objects of this attachment (one we have no state for); (family, host
    ip, port) of its UDP mappings for the conntrack flush.

    Go names them by network and container only, so another attachment of the container
    to the network (another ifname) may own them: only what forwards to the attachment's
    own addresses (`cidrs`: its prevResult's) is proven to be its own. Without them (a
    DEL without prevResult, such as the runtime's second) nothing is removed here; GC
    removes Go's objects once no attachment of the container is valid."""
    from portmap.config import go_chain_name

    chain = go_chain_name(network, container_id)
    may_have = kernel.xtables.may_have
    iptables = [(v, f) for v in VARIANTS for f in (6, 4) if may_have(v, f, chain)]
    if iptables:
        from portmap import xtables

        if xtables.recorded_owner(sd, network, container_id, chain):
            iptables = []  # Go's name, given to another attachment of ours of this container
    go_nft = [f for f in (6, 4) if kernel.nft.has(f, GO_TABLE)]
    if not (iptables or go_nft) or not cidrs:
        return []
    addresses = frozenset(_normal(cidr.partition("/")[0]) for cidr in cidrs)
    targets: UdpTargets = []
    if go_nft:
        from portmap import nft

        with sd.lock(nft.LOCK):  # our nftables backend's: the same writers
            targets += _release_go_nft(kernel.nft, container_id, addresses, go_nft, log)
    if iptables:
        tools = xtables.Tools(kernel.xtables)
        with sd.lock(xtables.LOCK):  # our iptables backend's; the tools wait for xtables'
            for variant, family in iptables:
                table = xtables.NatTable(tools.listing(variant, family, (chain, xtables.TOP)))
                dnat = _dnat_addresses(table.lines.get(chain, []))
                if not dnat or not dnat <= addresses:
                    if dnat:
                        log.info(
                            f"left the Go portmap's chain {chain} (iptables-{variant}): it "
                            f"forwards to {', '.join(sorted(dnat - addresses))}, not to "
                            f"{container_id}'s {', '.join(sorted(addresses))}"
                        )
                    continue
                lines, udp = xtables.removal(table, chain, family)
                what = f"delete the Go portmap's IPv{family} chain {chain}"
                tools.commit(variant, family, lines, what)
                targets += udp
                log.info(f"removed the Go portmap's iptables-{variant} chain {chain}")
    return targets


def _normal(address: str) -> str:
    import ipaddress

    try:
        return ipaddress.ip_address(address).compressed
    except ValueError:
        return address


def _dnat_addresses(rules: list[str]) -> set[str]:
    """The container addresses the DNAT rules among `rules` (iptables-save lines) forward
    to: `--to-destination 10.0.0.2:80` or `[fd00::2]:80`."""
    out = set()
    for rule in rules:
        words = rule.split()
        if "--to-destination" not in words[:-1]:
            continue
        target = words[words.index("--to-destination") + 1]
        if target.startswith("["):
            address = target[1:].partition("]")[0]
        else:
            address = target.partition(":")[0]
        out.add(_normal(address.partition("-")[0]))
    return out


def _release_go_nft(
    port: NftKernel, container_id: str, addresses: frozenset[str], families: list[int], log: Log
) -> UdpTargets:
    from portmap.nft import Nft, first_error

    nft = Nft(port)
    nft.context.set_json_output(True)
    found = _go_nft_rules(nft, container_id, addresses, families)
    if not found:
        return []
    lines = [f"delete rule {chain} handle {handle}" for chain, handle, _ in found]
    rc, _, err = nft.run("\n".join(lines))
    # Somebody else (not taking our lock) may have removed them meanwhile: fine.
    if rc != 0 and _go_nft_rules(nft, container_id, addresses, families):
        raise CniError(
            KERNEL_FAILURE,
            f"cannot remove the Go portmap's rules of container {container_id}",
            first_error(err),
        )
    log.info(f"removed the Go portmap's nftables rules of {container_id} ({len(lines)} changes)")
    return [target for _, _, udp in found for target in udp]


def _go_nft_rules(
    nft: Nft, container_id: str, addresses: frozenset[str], families: list[int]
) -> list[tuple[str, int, UdpTargets]]:
    """("ip cni_hostport <chain>", handle, its UDP targets) of the rules commented with the
    container id that forward or masquerade to one of `addresses`."""
    from common.jsontext import loads
    from portmap.nft import IPX

    found = []
    for family in families:
        for name in GO_NFT_CHAINS:
            chain = f"{IPX[family]} {GO_TABLE} {name}"
            rc, out, _ = nft.run(f"list chain {chain}")
            for item in loads(out).get("nftables", []) if rc == 0 else []:  # else: no such chain
                rule = item.get("rule") if isinstance(item, dict) else None
                if isinstance(rule, dict) and rule.get("comment") == container_id:
                    address, udp = _read_go_rule(family, rule)
                    if address in addresses:
                        found.append((chain, int(rule["handle"]), udp))
    return found


def _read_go_rule(family: int, rule: dict[str, Any]) -> tuple[str, UdpTargets]:
    """A Go rule's container address (where its DNAT goes, else the destination it
    masquerades; "" when it names none) and, of a DNAT for UDP, its (family, host address
    or None, port) for the conntrack flush; from the rule's JSON."""
    dnat: Any = None
    daddr, port = None, None
    for e in rule.get("expr", []):
        if not isinstance(e, dict):
            continue
        dnat = e.get("dnat", dnat)
        match = e.get("match")
        if not isinstance(match, dict) or not isinstance(match.get("left"), dict):
            continue
        payload, right = match["left"].get("payload"), match.get("right")
        if not isinstance(payload, dict):
            continue
        if payload.get("field") == "daddr" and isinstance(right, str):
            daddr = _normal(right)
        elif payload.get("protocol") == "udp" and payload.get("field") == "dport":
            port = right
    if dnat is None:
        return daddr or "", []
    udp: UdpTargets = [(family, daddr, port)] if isinstance(port, int) else []
    address = dnat.get("addr") if isinstance(dnat, dict) else None
    return (_normal(address) if isinstance(address, str) else ""), udp

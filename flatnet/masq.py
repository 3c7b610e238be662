"""Masquerade of a network's traffic to the outside: nftables by default, Go's iptables
chains with `"ipMasqBackend": "iptables"`.

nftables: one table of ours (`inet cni_flatnet`); per network a base chain in the nat
postrouting hook and one interval set per family holding the network's prefixes. An
attachment adds its prefix to the set (a no-op when the network's other attachments did),
and the last attachment of the network to go removes the chain and the sets: there is no
object per container, so nothing per container can be left behind. The chain and sets are
named after the network's whole name (a hash only for a name too long for nftables, with
a character no network name has, so no name can collide with another's).

iptables: exactly the Go bridge's rules (a `CNI-<hash>` chain per attachment, one
POSTROUTING jump per address, the same comments), so that either plugin's DEL removes the
other's. DEL finds the jumps in the nat table itself: no address has to be remembered.
"""

from __future__ import annotations

import os

from common.errors import KERNEL_FAILURE, CniError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

TABLE = "cni_flatnet"
MAX_PLAIN_NAME = 200  # chain and set names end at 255 bytes, with room for the suffixes
TOOL_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/local/bin")
MULTICAST = {4: "224.0.0.0/4", 6: "ff00::/8"}
_IP = {4: "ip", 6: "ip6"}
_ADDR_TYPE = {4: "ipv4_addr", 6: "ipv6_addr"}


def chain_name(network: str) -> str:
    """The network's chain: `n_<name>`; for a longer name, its start, '/' (which no
    network name contains) and the sha256 of the whole name."""
    if len(network) <= MAX_PLAIN_NAME:
        return "n_" + network
    from common.digest import sha256_hex

    return f"n_{network[:100]}/{sha256_hex(network.encode())}"


def _objects(network: str) -> list[str]:
    """nft commands that make (or keep) the network's table, chain and sets."""
    chain = chain_name(network)
    lines = [f"add table inet {TABLE}",
             f"add chain inet {TABLE} {chain} "
             "{ type nat hook postrouting priority srcnat; policy accept; }"]  # fmt: skip
    for family in (4, 6):
        lines.append(
            f"add set inet {TABLE} {chain}_{family} "
            f"{{ type {_ADDR_TYPE[family]}; flags interval; auto-merge; }}"
        )
    return lines


def nft_elements_script(network: str, prefixes: Iterable[str]) -> str:
    """The transaction of an ADD whose network's objects exist: its prefixes only (a
    no-op when they are there). It fails when the sets are missing: then nft_add_script."""
    chain = chain_name(network)
    return "".join(
        f"add element inet {TABLE} {chain}_{6 if ':' in p else 4} {{ {p} }}\n" for p in prefixes
    )


def nft_add_script(network: str, prefixes: Iterable[str]) -> str:
    """The transaction of an ADD: the network's objects, its two rules (rewritten, so
    that a second ADD does not add them twice), the attachment's prefixes."""
    chain = chain_name(network)
    lines = _objects(network)
    lines.append(f"flush chain inet {TABLE} {chain}")
    for family in (4, 6):
        ip, own = _IP[family], f"@{chain}_{family}"
        lines.append(
            f"add rule inet {TABLE} {chain} {ip} saddr {own} {ip} daddr != {own} "
            f"{ip} daddr != {MULTICAST[family]} masquerade"
        )
    for prefix in prefixes:
        family = 6 if ":" in prefix else 4
        lines.append(f"add element inet {TABLE} {chain}_{family} {{ {prefix} }}")
    return "\n".join(lines) + "\n"


def nft_delete_script(network: str) -> str:
    """The transaction of the network's last DEL: its chain and sets go (made first in
    the same transaction, so that deleting what is already gone is no error)."""
    chain = chain_name(network)
    lines = _objects(network)
    lines.append(f"delete chain inet {TABLE} {chain}")
    lines += [f"delete set inet {TABLE} {chain}_{family}" for family in (4, 6)]
    return "\n".join(lines) + "\n"


def nft_add(network: str, prefixes: list[str]) -> None:
    """Masquerade `prefixes` of `network`. The network's chain and sets are written only
    when its sets are missing: rewriting the chain deletes its rules, and a transaction
    that deletes makes the process wait for a grace period of the kernel's at exit."""
    context = _context()
    rc, _, _ = context.run(nft_elements_script(network, prefixes))
    if rc != 0:
        _run_in(context, nft_add_script(network, prefixes))


def _context() -> Any:
    from common.libnftables import Context

    try:
        return Context()
    except OSError as e:
        raise CniError(
            KERNEL_FAILURE,
            "libnftables is not available for ipMasq",
            f"{e}; install libnftables1, or set ipMasqBackend to iptables",
        ) from None


def nft_delete(network: str) -> None:
    """The network's chain and sets go; the table too once no network has any left (every
    flatnet call holds the store's lock, so no ADD adds to it meanwhile)."""
    context = _context()
    _run_in(context, nft_delete_script(network))
    rc, out, _ = context.run(f"list table inet {TABLE}")
    if rc == 0 and not any(w in out for w in ("chain ", "set ", "map ")):
        _run_in(context, f"delete table inet {TABLE}\n")


def _run_in(context: Any, script: str) -> None:
    rc, _, err = context.run(script)
    if rc != 0:
        raise CniError(KERNEL_FAILURE, "nftables refused the masquerade rules", err.strip())


def nft_network_rules(network: str) -> str:
    """The network's chain as nft lists it ("" when there is none): for CHECK and tests."""
    from common.libnftables import Context

    rc, out, _ = Context().run(f"list chain inet {TABLE} {chain_name(network)}")
    return out if rc == 0 else ""


# ---------------------------------------------------------------------------- iptables


def go_chain(network: str, container_id: str) -> str:
    """Go's utils.FormatChainName: CNI- and the start of sha512(network + container id)."""
    from common.digest import sha512_hex

    return ("CNI-" + sha512_hex((network + container_id).encode()))[:28]


def go_comment(network: str, container_id: str) -> str:
    """Go's utils.FormatComment (%q of names that need no escaping)."""
    return f'name: "{network}" id: "{container_id}"'


def _tool(name: str) -> str:
    for directory in TOOL_DIRS:
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK):
            return path
    raise CniError(KERNEL_FAILURE, f"{name} is not installed", "ipMasqBackend iptables needs it")


def _xtables(family: int, tool: str, stdin: bytes = b"", *args: str) -> str:
    from flatnet.ipam import spawn

    name = ("iptables" if family == 4 else "ip6tables") + tool
    path = _tool(name)
    code, out = spawn([path, *args], stdin, {"PATH": ":".join(TOOL_DIRS), "LC_ALL": "C"})
    if code != 0:
        raise CniError(KERNEL_FAILURE, f"{name} failed (exit status {code})", out.decode()[:300])
    return out.decode("utf-8", "replace")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def iptables_add(network: str, container_id: str, addresses: Iterable[str]) -> None:
    """Go's SetupIPMasq for each address, one iptables-restore per family."""
    chain = go_chain(network, container_id)
    comment = _quote(go_comment(network, container_id))
    by_family: dict[int, list[str]] = {}
    for cidr in addresses:
        from flatnet.plan import network_of

        family = 6 if ":" in cidr else 4
        rules = by_family.setdefault(family, [])
        address = cidr.partition("/")[0]
        rules += [
            f"-A {chain} -d {network_of(cidr)} -m comment --comment {comment} -j ACCEPT",
            f"-A {chain} ! -d {MULTICAST[family]} -m comment --comment {comment} -j MASQUERADE",
            f"-A POSTROUTING -s {address} -m comment --comment {comment} -j {chain}",
        ]
    for family, rules in by_family.items():
        text = "\n".join(["*nat", f":{chain} - [0:0]", *rules, "COMMIT", ""])
        _xtables(family, "-restore", text.encode(), "--noflush", "-w")


def iptables_delete(network: str, container_id: str) -> None:
    """The attachment's jumps (found in the nat table) and its chain, in both families."""
    chain = go_chain(network, container_id)
    for family in (4, 6):
        try:
            saved = _xtables(family, "-save", b"", "-t", "nat")
        except CniError:
            if family == 6:
                continue  # no ip6tables (or no IPv6): nothing of ours there
            raise
        lines = saved.splitlines()
        jumps = [
            "-D" + line[2:]
            for line in lines
            if line.startswith("-A POSTROUTING ") and line.endswith(f" -j {chain}")
        ]
        has_chain = any(line.startswith(f":{chain} ") for line in lines)
        if not jumps and not has_chain:
            continue
        body = jumps + ([f"-F {chain}", f"-X {chain}"] if has_chain else [])
        text = "\n".join(["*nat", *body, "COMMIT", ""])
        _xtables(family, "-restore", text.encode(), "--noflush", "-w")

"""portmap's configuration: options, port mappings and the attachment, parsed and validated.

Everything the user can get wrong is checked here, before anything touches the kernel:
ports 1-65535, protocol tcp/udp/sctp in any case, a hostIP that parses, a `range` that
fits under 65536, markMasqBit 0-31, conditions that cannot escape their rule.
Keys are read case-insensitively (Go runtimes send "HostPort", "Protocol").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from common.config import NetConf
from common.digest import sha256_hex
from common.errors import invalid_config
from common.jsonobj import JsonObject

# IP protocol numbers (the kernel and nft speak numbers) and the names we accept.
PROTOCOL_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}
PROTOCOLS = tuple(PROTOCOL_NAMES.values())
BACKENDS = ("nftables", "iptables")
# Unspecified host addresses: "any local address" (a match, not a bind).
ANY_ADDRESS = {4: "0.0.0.0", 6: "::"}  # noqa: S104
WILDCARDS = frozenset({"", *ANY_ADDRESS.values()})
DEFAULT_MARK_BIT = 13  # Kubernetes uses 14 and 15, Calico 20-31 (upstream's comment)


@dataclass(frozen=True)
class PortMapping:
    """One runtimeConfig.portMappings entry.

    `host_ip` is the normalised address, "" when absent/empty (both families, any local
    address). "0.0.0.0" and "::" stay as given: like Go, they restrict the mapping to
    their family while still meaning "any local address".
    """

    host_port: int
    container_port: int
    protocol: str
    host_ip: str = ""
    count: int = 1  # podman's `range`: host_port..host_port+count-1 -> container_port..
    index: int = 0  # position in portMappings, for error messages

    @property
    def host_family(self) -> int | None:
        if not self.host_ip:
            return None
        return 6 if ":" in self.host_ip else 4

    @property
    def is_wildcard(self) -> bool:
        return self.host_ip in WILDCARDS

    def describe(self) -> str:
        host = self.host_ip or "*"
        if ":" in host:
            host = f"[{host}]"
        last = self.host_port + self.count - 1
        ports = f"{self.host_port}" if self.count == 1 else f"{self.host_port}-{last}"
        return f"portMappings[{self.index}] {host}:{ports}/{self.protocol}"


@dataclass(frozen=True)
class Options:
    snat: bool = True
    masq_all: bool = False
    mark_masq_bit: int = DEFAULT_MARK_BIT
    external_set_mark_chain: str = ""
    conditions_v4: tuple[str, ...] = ()
    conditions_v6: tuple[str, ...] = ()
    backend: str = ""  # "" = auto

    def conditions(self, family: int) -> tuple[str, ...]:
        return self.conditions_v4 if family == 4 else self.conditions_v6


@dataclass(frozen=True)
class Attachment:
    """(network, container id, ifname): who owns a set of mappings."""

    network: str
    container_id: str
    ifname: str

    @property
    def network_tag(self) -> str:
        return sha256_hex(self.network.encode())[:8]

    @property
    def tag(self) -> str:
        """A short stable id: network hash - attachment hash (names chains, state files)."""
        raw = "\0".join((self.network, self.container_id, self.ifname)).encode()
        return f"{self.network_tag}-{sha256_hex(raw)[:16]}"

    def __str__(self) -> str:
        return f"{self.network}/{self.container_id}/{self.ifname}"

    @property
    def comment(self) -> str:
        """What nft element comments and iptables comments carry: tag first, then a name
        an operator recognises (truncated: comments hold at most 128 bytes)."""
        readable = _COMMENT_UNSAFE.sub("_", str(self))
        return f"{self.tag} {readable}"[:120]


_COMMENT_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/@+=-]")


@dataclass(frozen=True)
class PortmapConfig:
    options: Options
    mappings: tuple[PortMapping, ...]


# ---------------------------------------------------------------------------- mappings


def _parse_host_ip(entry: JsonObject) -> str:
    raw = entry.string("hostIP", "")
    if raw == "":
        return ""
    import ipaddress

    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise invalid_config(
            f"{entry.path('hostIP')}: {raw!r} is not an IP address",
            "use an IPv4 or IPv6 address, or leave hostIP out to mean every local address",
        ) from None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # Go's To4() treats ::ffff:a.b.c.d as IPv4
    return addr.compressed


def _port(entry: JsonObject, key: str) -> int:
    if not entry.has(key):
        raise invalid_config(f"{entry.where} has no {key}", "ports are integers 1-65535")
    value: int = entry.integer(key)
    if not 1 <= value <= 65535:
        raise invalid_config(
            f"{entry.path(key)} is {value}: a port must be between 1 and 65535",
        )
    return value


def parse_mapping(entry: JsonObject, index: int) -> PortMapping:
    host_port = _port(entry, "hostPort")
    container_port = _port(entry, "containerPort")
    protocol = entry.string("protocol", "") or "tcp"
    if protocol.lower() not in PROTOCOLS:
        raise invalid_config(
            f"{entry.path('protocol')} is {protocol!r}",
            "the protocol must be tcp, udp or sctp (any case)",
        )
    count = entry.integer("range", 1)
    if count < 1:
        raise invalid_config(f"{entry.path('range')} is {count}: a range is at least 1 port")
    for key, first in (("hostPort", host_port), ("containerPort", container_port)):
        if first + count - 1 > 65535:
            raise invalid_config(
                f"{entry.where}: {key} {first} with range {count} ends at "
                f"{first + count - 1}, beyond 65535",
            )
    return PortMapping(
        host_port=host_port,
        container_port=container_port,
        protocol=protocol.lower(),
        host_ip=_parse_host_ip(entry),
        count=count,
        index=index,
    )


# Every host port of every mapping (a `range` counts each port) becomes a map element per
# family, a conntrack flush target and, with iptables, rules: a few hundred bytes of config
# must not cost the node gigabytes and minutes (one `range` of 65535 on both families:
# ~0.6 GB with nftables, ~1.2 GB and 90 s with iptables). 16384 still holds an RTP-style
# 10000-20000 range.
MAX_HOST_PORTS = 16384


def parse_mappings(runtime_config: JsonObject) -> tuple[PortMapping, ...]:
    mappings = tuple(
        parse_mapping(entry, i) for i, entry in enumerate(runtime_config.objects("portMappings"))
    )
    total = sum(m.count for m in mappings)
    if total > MAX_HOST_PORTS:
        raise invalid_config(
            f"runtimeConfig.portMappings map {total} host ports; at most {MAX_HOST_PORTS} per "
            "attachment",
            "map fewer or smaller ranges",
        )
    _reject_duplicates(mappings)
    return mappings


def _reject_duplicates(mappings: tuple[PortMapping, ...]) -> None:
    """The same (family, hostIP, protocol, hostPort) twice in one config is a mistake."""
    seen: dict[tuple[int, str, str, int], PortMapping] = {}
    for m in mappings:
        families = (m.host_family,) if m.host_family else (4, 6)
        for family in families:
            ip = ANY_ADDRESS[family] if m.is_wildcard else m.host_ip
            for port in range(m.host_port, m.host_port + m.count):
                key = (family, ip, m.protocol, port)
                other = seen.get(key)
                if other is not None and other.index != m.index:
                    raise invalid_config(
                        f"{m.describe()} maps host port {port}/{m.protocol} that "
                        f"{other.describe()} already maps",
                        "each (hostIP, protocol, hostPort) may appear once",
                    )
                seen[key] = m


# ---------------------------------------------------------------------------- conditions

# Conditions are match expressions. Anything that could end the rule (';', a newline, a
# comment) or act instead of matching (a verdict, NAT, a 'set' statement) is refused, so
# a condition can narrow a DNAT but never replace or escape it.
_NFT_FORBIDDEN_CHARS = re.compile(r"[;#\n\r\x00-\x1f]")
_NFT_STATEMENTS = frozenset(
    {
        "accept",
        "drop",
        "reject",
        "queue",
        "continue",
        "return",
        "jump",
        "goto",
        "dnat",
        "snat",
        "masquerade",
        "redirect",
        "notrack",
        "set",
        "log",
        "counter",
        "limit",
        "quota",
        "dup",
        "fwd",
    }
)


def looks_like_iptables(conditions: tuple[str, ...]) -> bool:
    """iptables conditions are argv tokens ("-s", "10.0.0.0/8", "!"); nft ones are phrases."""
    return any(c.startswith("-") or c == "!" for c in conditions)


def _parse_conditions(body: JsonObject, key: str) -> tuple[str, ...]:
    items = body.array(key)
    if items is None:
        return ()
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise invalid_config(f"{body.path(key)}[{i}] must be a string")
        if _NFT_FORBIDDEN_CHARS.search(item):
            raise invalid_config(
                f"{body.path(key)}[{i}] {item[:60]!r} contains a forbidden character",
                "conditions may not contain ';', '#' or control characters",
            )
        out.append(item)
    conditions = tuple(out)
    if not looks_like_iptables(conditions):
        for i, item in enumerate(conditions):
            words = set(re.split(r"[\s{},]+", item.lower()))
            bad = words & _NFT_STATEMENTS
            if bad:
                raise invalid_config(
                    f"{body.path(key)}[{i}] {item[:60]!r} contains the statement "
                    f"{sorted(bad)[0]!r}",
                    "conditions are match expressions only (e.g. 'ip saddr 10.0.0.0/8')",
                )
    return conditions


_IPT_TO_NFT = {
    "-s": "saddr",
    "--source": "saddr",
    "--src": "saddr",
    "-d": "daddr",
    "--destination": "daddr",
    "--dst": "daddr",
    "-i": "iifname",
    "--in-interface": "iifname",
}


def iptables_to_nft(conditions: tuple[str, ...], family: int, where: str) -> tuple[str, ...]:
    """Translate the iptables conditions Go configs carry (`[!] -s/-d ADDR`, `[!] -i IF`)
    into nft expressions, so a conflist written for Go's iptables portmap keeps working
    with the nftables backend. Anything else is refused with a pointer to the fix."""
    out = []
    tokens = list(conditions)
    i = 0
    while i < len(tokens):
        negate = tokens[i] == "!"
        if negate:
            i += 1
        if i + 1 >= len(tokens) or tokens[i] not in _IPT_TO_NFT:
            rest = " ".join(tokens[i - negate :])
            raise invalid_config(
                f"{where}: cannot translate iptables condition {rest[:60]!r} to nftables",
                "write it in nft syntax (e.g. 'ip saddr 10.0.0.0/8'), or set "
                '"backend": "iptables"',
            )
        what, value = _IPT_TO_NFT[tokens[i]], tokens[i + 1]
        op = "!= " if negate else ""
        if what == "iifname":
            if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,15}", value):
                raise invalid_config(f"{where}: {value!r} is not an interface name")
            out.append(f'iifname {op}"{value.replace("+", "*")}"')
        else:
            addrs = value.split(",")
            for addr in addrs:
                if not re.fullmatch(r"[0-9A-Fa-f.:/]+", addr):
                    raise invalid_config(f"{where}: {addr!r} is not an address or CIDR")
            ipx = "ip" if family == 4 else "ip6"
            match = addrs[0] if len(addrs) == 1 else "{ " + ", ".join(addrs) + " }"
            out.append(f"{ipx} {what} {op}{match}")
        i += 2
    return tuple(out)


# ---------------------------------------------------------------------------- options


def parse_options(body: JsonObject) -> Options:
    has_bit = body.has("markMasqBit")
    has_chain = body.has("externalSetMarkChain")
    if has_bit and has_chain:
        raise invalid_config(
            "cannot specify both externalSetMarkChain and markMasqBit",
            "externalSetMarkChain jumps to your own chain, which sets the mark itself",
        )
    bit = body.integer("markMasqBit", DEFAULT_MARK_BIT)
    if not 0 <= bit <= 31:
        raise invalid_config(f"markMasqBit is {bit}: it must be between 0 and 31")
    chain = body.string("externalSetMarkChain", "")
    if has_chain and not re.fullmatch(r"[A-Za-z0-9_.\-]{1,28}", chain):
        raise invalid_config(
            f"externalSetMarkChain {chain[:60]!r} is not an iptables chain name",
            "a chain name has 1-28 letters, digits, '_', '.' or '-'",
        )
    backend = body.string("backend", "").lower()
    if backend and backend not in BACKENDS:
        raise invalid_config(
            f"backend {backend!r} is unknown",
            "use 'nftables' or 'iptables', or leave it out to pick automatically",
        )
    if backend == "nftables" and has_chain:  # Go: an error too, never silently ignored
        raise invalid_config(
            "externalSetMarkChain is an iptables option, but the backend is nftables",
            'remove "backend" (externalSetMarkChain then selects iptables, as in Go) or '
            "remove externalSetMarkChain",
        )
    return Options(
        snat=body.boolean("snat", True),
        masq_all=body.boolean("masqAll", False),
        mark_masq_bit=bit,
        external_set_mark_chain=chain,
        conditions_v4=_parse_conditions(body, "conditionsV4"),
        conditions_v6=_parse_conditions(body, "conditionsV6"),
        backend=backend,
    )


def parse(conf: NetConf) -> PortmapConfig:
    return PortmapConfig(
        options=parse_options(conf.body),
        mappings=parse_mappings(conf.runtime_config),
    )

"""portmap's configuration: options, port mappings and the attachment, parsed and validated.

Everything the user can get wrong is refused here (error 7), before anything touches the
kernel; what each option accepts: docs/portmap.md.
"""

from __future__ import annotations

from common.config import NetConf
from common.digest import sha512_hex
from common.errors import CniError, invalid_config
from common.jsonobj import JsonObject
from common.values import Value, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.identity import Attachment

# IP protocol numbers (the kernel and nft speak numbers) and the names we accept.
PROTOCOL_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}
BACKENDS = ("nftables", "iptables")
# Unspecified host addresses: "any local address" (a match, not a bind).
ANY_ADDRESS = {4: "0.0.0.0", 6: "::"}  # noqa: S104
WILDCARDS = frozenset({"", *ANY_ADDRESS.values()})
DEFAULT_MARK_BIT = 13  # Kubernetes uses 14 and 15, Calico 20-31 (upstream's comment)


class PortMapping(Value):
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
        where = host_ports(self.host_ip or "*", self.host_port, self.count, self.protocol)
        return f"portMappings[{self.index}] {where}"


def host_ports(host: str, port: int, count: int, protocol: str) -> str:
    """host:port[-last]/protocol, an IPv6 host in brackets (for messages)."""
    last = f"-{port + count - 1}" if count > 1 else ""
    return f"{f'[{host}]' if ':' in host else host}:{port}{last}/{protocol}"


class Options(Value):
    snat: bool = True
    masq_all: bool = False
    mark_masq_bit: int = DEFAULT_MARK_BIT
    external_set_mark_chain: str = ""
    conditions_v4: Conditions = field(default_factory=lambda: Conditions(4))
    conditions_v6: Conditions = field(default_factory=lambda: Conditions(6))
    backend: str = ""  # "" = auto

    def conditions(self, family: int) -> Conditions:
        return self.conditions_v4 if family == 4 else self.conditions_v6

    @property
    def needs(self) -> str:
        """The backend these options need when none is configured: iptables for what only
        it has (externalSetMarkChain, iptables-style conditions: Go picks iptables for
        them, so a config written for Go means the same here), nftables for conditions
        in nft syntax; "" when either will do."""
        families = (self.conditions_v4, self.conditions_v6)
        if self.external_set_mark_chain or any(c.iptables_style for c in families):
            return BACKENDS[1]
        return BACKENDS[0] if any(c.matches for c in families) else ""


# The Go portmap's per-attachment iptables chain, which the iptables backend makes too:
# here rather than in portmap.xtables so that a DEL without a record (the Go takeover's
# look) names it without loading the iptables backend.
CHAIN_PREFIX = "CNI-DN-"


def go_chain_name(network: str, container_id: str) -> str:
    """Go's per-attachment chain: CNI-DN- and the start of sha512(network + container id)
    in hex, 28 characters in all (iptables' limit)."""
    return (CHAIN_PREFIX + sha512_hex((network + container_id).encode()))[:28]


def owner_comment(att: Attachment) -> str:
    """What nft element comments and iptables comments carry: the attachment's tag first,
    then a name an operator recognises (truncated: comments hold at most 128 bytes)."""
    readable = "".join(c if c in _COMMENT_SAFE else "_" for c in str(att))
    return f"{att.tag} {readable}"[:120]


_COMMENT_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:/@+=-")


class PortmapConfig(Value):
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
    if "%" in text:
        # Python's ipaddress accepts any text after the '%' of an IPv6 zone, and the address
        # goes into nft text; Go's net.ParseIP refuses zones, and neither backend can match
        # a destination by zone anyway.
        raise invalid_config(
            f"{entry.path('hostIP')} {raw[:60]!r} has an IPv6 zone id ('%...')",
            "give the address without a zone (e.g. fe80::1), or leave hostIP out to mean "
            "every local address",
        )
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
    if protocol.lower() not in PROTOCOL_NAMES.values():
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
# must not cost the node gigabytes and minutes (a `range` of 65535 on both families did:
# docs/testing.md). 16384 still holds an RTP-style 10000-20000 range.
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
                if other is not None:
                    raise invalid_config(
                        f"{m.describe()} maps host port {port}/{m.protocol} that "
                        f"{other.describe()} already maps",
                        "each (hostIP, protocol, hostPort) may appear once",
                    )
                seen[key] = m


# ---------------------------------------------------------------------------- conditions

# Conditions narrow a DNAT; they must never act. So they are parsed against an allowlist
# of plain match expressions (selector, optional operator, value) and the nft text is
# rendered from the parsed values: anything else (a statement, a set change, a verdict,
# ';', a comment, a reference to one of our sets) is refused, naming the token.
NFT_CONDITIONS_ALLOWED = (
    "plain matches: ip saddr|daddr (conditionsV4) or ip6 saddr|daddr (conditionsV6) with "
    "an address, prefix, range a-b or { set }; iifname|oifname NAME (quoted or not, '*' "
    "at the end for a prefix); meta l4proto PROTO; tcp|udp|sctp|th sport|dport PORT, "
    "range or { set }; meta mark N; each with an optional == or != (<, >, <=, >= for "
    "ports and marks)"
)
# The two-word selectors: first word -> second word -> the kind of value it matches.
_NFT_SELECTORS = {
    "ip": {"saddr": "address", "daddr": "address"},
    "ip6": {"saddr": "address", "daddr": "address"},
    "meta": {"l4proto": "l4proto", "mark": "mark", "iifname": "ifname", "oifname": "ifname"},
    **{proto: {"sport": "port", "dport": "port"} for proto in ("tcp", "udp", "sctp", "th")},
}
_NFT_OPERATORS = ("==", "!=")
_NFT_ORDER_OPERATORS = ("<", ">", "<=", ">=")
_L4PROTOS = frozenset({"tcp", "udp", "sctp", "udplite", "icmp", "icmpv6", "esp", "ah", "gre"})
_IFNAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-+")
_IPT_VALUE_CHARS = _IFNAME_CHARS | frozenset(":/,")


class Match(Value):
    """One condition as each backend writes it: `nft` is its nft expression ("" when nft
    has none), `iptables` its iptables words (empty when it was written in nft)."""

    nft: str
    iptables: tuple[str, ...] = ()


class Conditions(Value):
    """A family's conditionsV4/V6, parsed once (what a backend cannot apply is refused
    here); each backend renders them (portmap.nft.render_conditions,
    portmap.xtables.condition_words)."""

    family: int
    matches: tuple[Match, ...] = ()

    @property
    def iptables_style(self) -> bool:
        """Written as iptables arguments: Go picks its iptables backend for them."""
        return any(m.iptables for m in self.matches)


def _parse_conditions(body: JsonObject, key: str, backend: str) -> Conditions:
    """conditionsV4/V6 in either syntax; refused when the configured backend cannot."""
    family = 6 if key.endswith("V6") else 4
    items = body.array(key)
    if not items:
        return Conditions(family)
    where = body.path(key)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise invalid_config(f"{where}[{i}] must be a string")
        for c in item:
            if c in ";#" or not c.isprintable():
                raise invalid_config(
                    f"{where}[{i}] {item[:60]!r} contains the forbidden character {c!r}",
                    "conditions may not contain ';', '#' or control characters; "
                    + NFT_CONDITIONS_ALLOWED,
                )
    conditions = tuple(items)
    # iptables conditions are argv words ("-s", "10.0.0.0/8", "!"); nft ones are phrases
    if not any(c.startswith("-") or c == "!" for c in conditions):
        if backend == "iptables":
            raise invalid_config(
                f"{where} is in nft syntax, but the backend is iptables",
                "write it as iptables arguments (e.g. ['!', '-s', '10.0.0.0/8']), or remove "
                '"backend" to use nftables',
            )
        return Conditions(family, parse_nft_conditions(conditions, family, where))
    matches = parse_iptables_conditions(conditions, family, where)
    first = next((i for i, m in enumerate(matches) if not m.nft), -1)
    if backend == "nftables" and first >= 0:  # iptables words nft has no words for
        rest = " ".join(w for later in matches[first:] for w in later.iptables)
        raise invalid_config(
            f"{key}: cannot translate iptables condition {rest[:60]!r} to nftables",
            'write it in nft syntax (e.g. \'ip saddr 10.0.0.0/8\'), or set "backend": "iptables"',
        )
    return Conditions(family, matches)


# The kinds of value a condition matches, in either syntax -> what a value of the kind is
# (for refusals); _value_text validates each.
_VALUE_KINDS = {
    "address": "an IPv{family} address, prefix or range a-b",
    "prefix": "an IPv{family} address or CIDR",  # iptables -s/-d: no ranges there
    "port": "a port 0-65535 or a range of them",
    "mark": "a number 0-0xffffffff",
    "l4proto": "a protocol name or number 0-255",
    "ifname": "an interface name ('*' at the end for a prefix)",
    "iptables ifname": "an interface name ('+' at the end for a prefix)",
    "plain": "a plain value",  # of an iptables match module
}


def _value_text(kind: str, token: str, family: int) -> str | None:
    """The canonical text of one value of `kind` (nft's, rendered from what it parsed to;
    a match module's value as given); None when the token is not one."""
    if kind in ("address", "prefix"):
        return _address_text(token, family, ranges=kind == "address")
    if kind == "port":
        return _number_text(token, 65535, ranges=True)
    if kind == "mark":
        return _number_text(token, 0xFFFFFFFF, ranges=False)
    if kind == "l4proto":
        return token if token in _L4PROTOS else _number_text(token, 255, ranges=False)
    if kind == "ifname":
        quoted = len(token) > 2 and token[0] == token[-1] == '"'
        return _ifname_text(token[1:-1] if quoted else token, "*")
    if kind == "iptables ifname":
        return _ifname_text(token, "+")
    # a value that starts like an option could be read as one of iptables' own
    return token if set(token) <= _IPT_VALUE_CHARS and not token.startswith("-") else None


def _not_a_value(kind: str, token: str, after: str, family: int) -> str:
    return f"{token!r} after {after} is not {_VALUE_KINDS[kind].format(family=family)}"


def _ifname_text(name: str, wildcard: str) -> str | None:
    """An interface name, or a prefix of one followed by `wildcard` (nft '*', iptables
    '+'), as nft text."""
    stem = name.removesuffix(wildcard)
    if not (0 < len(name) <= 15 and stem and set(stem) <= _IFNAME_CHARS):
        return None
    return f'"{stem}*"' if stem != name else f'"{name}"'


def _address_text(token: str, family: int, ranges: bool) -> str | None:
    """An address, prefix or (with `ranges`) range a-b of `family` as nft text."""
    import ipaddress

    if "%" in token or (not ranges and "-" in token):  # ipaddress takes any IPv6 zone id
        return None
    try:
        if "/" in token:
            network = ipaddress.ip_network(token, strict=False)
            return str(network) if network.version == family else None
        first, dash, last = token.partition("-")
        low = ipaddress.ip_address(first)
        high = ipaddress.ip_address(last) if dash else low
    except ValueError:
        return None
    if low.version != family or high.version != family or int(high) < int(low):
        return None
    return f"{low}-{high}" if dash else str(low)


def _number_text(token: str, top: int, ranges: bool) -> str | None:
    first, dash, last = token.partition("-") if ranges else (token, "", "")
    numbers = []
    for part in (first, last) if dash else (first,):
        base = 16 if part.lower().startswith("0x") and top > 0xFFFF else 10
        digits = part[2:] if base == 16 else part
        if not digits or not digits.isascii() or not digits.isalnum():
            return None
        try:
            value = int(digits, base)
        except ValueError:
            return None
        if value > top:
            return None
        numbers.append(value)
    if dash:
        return f"{numbers[0]}-{numbers[1]}" if numbers[0] <= numbers[1] else None
    return first.lower() if first.lower().startswith("0x") else str(numbers[0])


def parse_nft_conditions(conditions: tuple[str, ...], family: int, where: str) -> tuple[Match, ...]:
    """nft match expressions, one Match per expression.

    The strings are read as one stream of words (Go's nftables portmap joins them with
    spaces), so ["ip saddr 10.0.0.0/8"] and ["ip", "saddr", "10.0.0.0/8"] mean the same;
    '{', '}' and ',' are words of their own: `{a,b}` reads as `{ a , b }`.
    """
    text = " ".join(conditions)
    for mark in "{},":
        text = text.replace(mark, f" {mark} ")
    tokens = text.split()
    out = []
    i = 0
    while i < len(tokens):
        expression, i = _nft_match(tokens, i, family, where)
        out.append(Match(expression))
    return tuple(out)


def _refuse(where: str, problem: str) -> CniError:
    return invalid_config(f"{where}: {problem}", NFT_CONDITIONS_ALLOWED)


def _nft_match(tokens: list[str], i: int, family: int, where: str) -> tuple[str, int]:
    """One `selector [op] value` starting at tokens[i]: (its text, index after it)."""
    first = tokens[i]
    second = tokens[i + 1] if i + 1 < len(tokens) else ""
    if first in ("iifname", "oifname"):
        kind, selector, i = "ifname", first, i + 1
    elif first not in _NFT_SELECTORS:
        raise _refuse(where, f"{first!r} is not an allowed match (statements are refused)")
    elif second not in _NFT_SELECTORS[first]:
        raise _refuse(where, f"{first} {second!r} is not an allowed match")
    else:
        kind, selector, i = _NFT_SELECTORS[first][second], f"{first} {second}", i + 2
    if kind == "address" and first != ("ip" if family == 4 else "ip6"):
        raise _refuse(
            where,
            f"{first!r} matches IPv{4 if first == 'ip' else 6} packets, not the "
            f"IPv{family} ones these conditions are for",
        )
    op = tokens[i] if i < len(tokens) else ""
    if op in _NFT_OPERATORS or op in _NFT_ORDER_OPERATORS:
        if op in _NFT_ORDER_OPERATORS and kind not in ("port", "mark"):
            raise _refuse(where, f"{op!r} compares numbers; {selector} takes == or !=")
        i += 1
    else:
        op = ""
    if i >= len(tokens):
        raise _refuse(where, f"{selector!r} needs a value")
    prefix = f"{selector} {op} " if op else f"{selector} "
    if tokens[i] != "{":
        return prefix + _nft_value(kind, tokens[i], family, selector, where), i + 1
    values = []
    i += 1
    while True:
        if i >= len(tokens):
            raise _refuse(where, f"the '{{' after {selector!r} is never closed")
        values.append(_nft_value(kind, tokens[i], family, selector, where))
        i += 1
        if i < len(tokens) and tokens[i] == "}":
            return prefix + "{ " + ", ".join(values) + " }", i + 1
        if i < len(tokens) and tokens[i] != ",":
            raise _refuse(
                where, f"{tokens[i]!r} in the set after {selector!r}: expected ',' or '}}'"
            )
        i += 1


def _nft_value(kind: str, token: str, family: int, selector: str, where: str) -> str:
    text = _value_text(kind, token, family)
    if text is None:
        raise _refuse(where, _not_a_value(kind, token, repr(selector), family))
    return text


# iptables conditions, words of the rules fed to iptables-restore, are kept to matches
# too: address and interface options, and a few match modules without side effects
# (`-m recent --set`, `-m quota`... change state as packets go by), with plain values.
# option -> the nft selector word it translates to (see iptables_to_nft)
IPT_ADDRESS_OPTIONS = {
    **dict.fromkeys(("-s", "--source", "--src"), "saddr"),
    **dict.fromkeys(("-d", "--destination", "--dst"), "daddr"),
}
# option -> the kind of its value, and its nft selector ("" where nft has none: then only
# the iptables backend applies the condition)
_IPT_OPTIONS = {
    **{option: ("prefix", word) for option, word in IPT_ADDRESS_OPTIONS.items()},
    **dict.fromkeys(("-i", "--in-interface"), ("iptables ifname", "iifname")),
    **dict.fromkeys(("-o", "--out-interface"), ("iptables ifname", "")),
}
_IPT_MATCHES = {
    "addrtype": ("--src-type", "--dst-type"),
    "iprange": ("--src-range", "--dst-range"),
    "mark": ("--mark",),
    "conntrack": ("--ctstate", "--ctstatus"),
    "mac": ("--mac-source",),
    "physdev": ("--physdev-in", "--physdev-out"),
}
IPT_CONDITIONS_ALLOWED = (
    "iptables conditions: [!] -s/-d ADDR[/LEN][,...], [!] -i/-o IFACE, and -m MODULE [!] "
    "--OPTION VALUE for " + ", ".join(f"{m} ({' '.join(o)})" for m, o in _IPT_MATCHES.items())
)


def parse_iptables_conditions(
    tokens: tuple[str, ...], family: int, where: str
) -> tuple[Match, ...]:
    """Refuse anything but the allowlisted matches, naming the token (error 7); each
    `[!] OPTION VALUE` is one match, with its nft expression where nft has one (addresses
    and the input interface: what Go configs carry), so that a conflist written for Go's
    iptables portmap keeps working with the nftables backend."""

    def refuse(problem: str) -> CniError:
        return invalid_config(f"{where}: {problem}", IPT_CONDITIONS_ALLOWED)

    matches = []
    module = ""
    i = 0
    while i < len(tokens):
        start = i
        negate = tokens[i] == "!"
        if negate:
            i += 1
        opt = tokens[i] if i < len(tokens) else "!"
        if i + 1 >= len(tokens):
            raise refuse(f"{opt!r} needs a value")
        value = tokens[i + 1]
        if opt == "-m":
            if value not in _IPT_MATCHES:
                raise refuse(f"match module {value!r} is not allowed")
            module = value
        elif opt not in _IPT_OPTIONS and opt not in _IPT_MATCHES.get(module, ()):
            raise refuse(f"{opt!r} is not an allowed condition")
        kind, selector = _IPT_OPTIONS.get(opt, ("plain", ""))
        texts = []
        for one in value.split(",") if kind == "prefix" else (value,):  # -s/-d take a list
            text = _value_text(kind, one, family)
            if text is None:
                raise refuse(_not_a_value(kind, value, opt, family))
            texts.append(text)
        nft = ""
        if selector:
            ipx = ("ip " if family == 4 else "ip6 ") if kind == "prefix" else ""
            match = texts[0] if len(texts) == 1 else "{ " + ", ".join(texts) + " }"
            nft = f"{ipx}{selector} {'!= ' if negate else ''}{match}"
        i += 2
        matches.append(Match(nft, tokens[start:i]))
    return tuple(matches)


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
    if has_chain and not (0 < len(chain) <= 28 and set(chain) <= _IFNAME_CHARS - {"+"}):
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
        conditions_v4=_parse_conditions(body, "conditionsV4", backend),
        conditions_v6=_parse_conditions(body, "conditionsV6", backend),
        backend=backend,
    )


def parse(conf: NetConf) -> PortmapConfig:
    return PortmapConfig(
        options=parse_options(conf.body),
        mappings=parse_mappings(conf.runtime_config),
    )

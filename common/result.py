"""CNI results: one model (the richest shape, 1.1.0) read from and written to every spec
version; the conversion rules are in docs/cni-contract.md ("Results").

Keys a version does not define are kept verbatim in ``extra`` and written back, so a
pass-through never loses what a newer or foreign plugin put there. Down-conversion drops
what the older version cannot carry: the spec's "lossy" cells, not a bug here.
"""

from __future__ import annotations

from common import versions
from common.errors import invalid_config
from common.jsonobj import JsonObject, split_known
from common.values import Value, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LEGACY = ("0.1.0", "0.2.0")  # ip4/ip6 objects instead of interfaces and ips


def address_family(address: str) -> int:
    """4 or 6, from an address or CIDR string (cheap: no ipaddress import)."""
    return 6 if ":" in address else 4


class Interface(Value):
    name: str
    mac: str = ""
    sandbox: str = ""
    mtu: int | None = None  # 1.1.0, as the two below
    socket_path: str = ""
    pci_id: str = ""
    extra: dict[str, Any] | None = None  # keys the version does not define


class IPConfig(Value):
    address: str  # CIDR, e.g. "10.88.0.5/16"
    gateway: str = ""
    interface: int | None = None  # index into Result.interfaces
    extra: dict[str, Any] | None = None

    @property
    def family(self) -> int:
        return address_family(self.address)


class Route(Value):
    dst: str
    gw: str = ""
    mtu: int | None = None  # 1.1.0, as the rest
    advmss: int | None = None
    priority: int | None = None
    table: int | None = None
    scope: int | None = None
    extra: dict[str, Any] | None = None


class DNS(Value):
    nameservers: tuple[str, ...] = ()
    domain: str = ""
    search: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    extra: dict[str, Any] | None = None


class Result(Value):
    # Lists of its own: a plugin appends to the result it reports (bandwidth's ifb).
    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)
    extra: dict[str, Any] | None = None

    def interface_index(self, name: str, *, in_sandbox: bool) -> int | None:
        for i, iface in enumerate(self.interfaces):
            if iface.name == name and bool(iface.sandbox) == in_sandbox:
                return i
        return None

    def container_ips(self, ifname: str) -> list[IPConfig]:
        """Addresses of the container interface `ifname`, and those with no interface
        index (older plugins leave it out); not those of another or a host-side one."""
        out = []
        for ip in self.ips:
            if ip.interface is None:
                out.append(ip)
            elif 0 <= ip.interface < len(self.interfaces):
                iface = self.interfaces[ip.interface]
                if iface.name == ifname and iface.sandbox:
                    out.append(ip)
        return out

    @classmethod
    def from_json(cls, raw: object, version: str) -> Result:
        obj = JsonObject.of(raw, "prevResult")
        own = obj.get("cniVersion")
        if isinstance(own, str) and own in versions.SUPPORTED_VERSIONS:
            version = own
        current_shape = obj.has("ips") or obj.has("interfaces")
        # A result in the legacy shape is read as such whatever version it claims:
        # libcni would silently read nothing from it, which helps nobody.
        if (obj.has("ip4") or obj.has("ip6")) and not current_shape:
            version = "0.2.0"
        # ... and one in the current shape as such when it claims a legacy version or none
        # (a config without cniVersion): read as 0.2.0 its ips would be kept as unknown
        # keys and written back beside ip4/ip6.
        elif version in LEGACY and current_shape:
            version = "0.4.0"
        if version in LEGACY:
            return _read_legacy(obj)
        return _read_current(obj, version)

    def to_json(self, version: str) -> dict[str, Any]:
        if version in LEGACY:
            return _write_legacy(self, version)
        return _write_current(self, version)


# The plain objects, field by field: (JSON key, attribute, kind, only from 1.1.0 on), in
# the order Go writes them. "name" and "dst" are written even when empty (no omitempty).
_INTERFACE = (
    ("name", "name", "str", False),
    ("mac", "mac", "str", False),
    ("mtu", "mtu", "int", True),
    ("sandbox", "sandbox", "str", False),
    ("socketPath", "socket_path", "str", True),
    ("pciID", "pci_id", "str", True),
)
_ROUTE = (
    ("dst", "dst", "str", False),
    ("gw", "gw", "str", False),
    ("mtu", "mtu", "int", True),
    ("advmss", "advmss", "int", True),
    ("priority", "priority", "int", True),
    ("table", "table", "int", True),
    ("scope", "scope", "int", True),
)
_DNS = (
    ("nameservers", "nameservers", "strs", False),
    ("domain", "domain", "str", False),
    ("search", "search", "strs", False),
    ("options", "options", "strs", False),
)
_ALWAYS = ("name", "dst")
# "version" (0.3.0-0.4.0) is always known: written from the address where a version has
# it, dropped where it does not, never passed on as a foreign key.
_IP_KEYS = ("address", "gateway", "interface", "version")
_RESULT_KEYS = ("cniVersion", "interfaces", "ips", "routes", "dns")
_LEGACY_KEYS = ("cniVersion", "ip4", "ip6", "dns")
_LEGACY_IP_KEYS = ("ip", "gateway", "routes")


def _read_fields(obj: JsonObject, cls: type[Value], spec: tuple[Any, ...], v11: bool) -> Any:
    fields = [f for f in spec if v11 or not f[3]]
    values: dict[str, Any] = {}
    for key, attr, kind, _ in sorted(fields, key=lambda f: f[3]):  # 1.1.0's own last
        if kind == "int":
            values[attr] = obj.integer(key)
        elif kind == "strs":
            values[attr] = _str_list(obj, key)
        else:
            values[attr] = obj.string(key, "")
    return cls(**values, extra=split_known(obj.raw, [f[0] for f in fields]))


def _write_fields(value: Any, spec: tuple[Any, ...], v11: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, attr, _, new in spec:
        if v11 or not new:
            field = getattr(value, attr)
            if key in _ALWAYS:
                out[key] = field
            else:
                _put(out, key, list(field) if isinstance(field, tuple) else field)
    return {**(value.extra or {}), **out}


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """Set key unless the value is empty (Go's omitempty)."""
    if value not in (None, "", [], {}):
        out[key] = value


def _checked_address(obj: JsonObject, key: str, *, cidr: bool, required: bool) -> str:
    """obj[key] as an IP address (with a /prefix when `cidr`), or error 7 naming it: Go's
    result types parse these with net.ParseCIDR / net.ParseIP, so anything else would
    hand the next plugin (or the runtime) a result that is not one."""
    value: str = obj.string(key, "")
    if not value:
        if required:
            raise invalid_config(f"{obj.path(key)} is missing", "an address like 10.1.0.2/24")
        return value
    import _socket

    text, slash, prefix = value.partition("/")
    v6 = ":" in text
    if cidr:
        ok = prefix.isdigit() and prefix.isascii() and int(prefix) <= (128 if v6 else 32)
    else:
        ok = not slash
    if ok:
        try:
            _socket.inet_pton(_socket.AF_INET6 if v6 else _socket.AF_INET, text)
        except (OSError, ValueError):  # ValueError: a NUL, a lone surrogate
            ok = False
    if not ok:
        want = "an address with a prefix length, like 10.1.0.2/24" if cidr else "an IP address"
        raise invalid_config(f"{obj.path(key)} {value[:60]!r} is not {want}")
    return value


def _read_ip(
    obj: JsonObject, address_key: str, known: tuple[str, ...], interfaces: int = 0
) -> IPConfig:
    return IPConfig(
        address=_checked_address(obj, address_key, cidr=True, required=True),
        gateway=_checked_address(obj, "gateway", cidr=False, required=False),
        interface=_interface_index(obj, interfaces) if address_key == "address" else None,
        extra=split_known(obj.raw, known),
    )


def _interface_index(obj: JsonObject, interfaces: int) -> int | None:
    """ips[].interface: absent, or an index into the result's `interfaces`. -1, which some
    0.3.0-era plugins wrote for "no interface" and the spec asks consumers to take
    gracefully, reads as absent; any other value that points at no interface is error 7
    here rather than passed on for the next plugin or the runtime to trip over."""
    index: int | None = obj.integer("interface")
    if index == -1:
        return None
    if index is not None and not 0 <= index < interfaces:
        where = f"0 to {interfaces - 1}" if interfaces else "the result has none"
        raise invalid_config(
            f"{obj.path('interface')} is {str(index)[:24]}, not an index into interfaces ({where})",
            "leave it out for an address that is not tied to one of the interfaces",
        )
    return index


def _str_list(obj: JsonObject, key: str) -> tuple[str, ...]:
    items = obj.array(key) or []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            JsonObject({key: item}, f"{obj.path(key)}[{i}]").string(key)
    return tuple(items)


def _read_dns(obj: JsonObject) -> DNS:
    dns = obj.child("dns")
    return DNS() if dns is None else _read_fields(dns, DNS, _DNS, False)


# ---------------------------------------------------------------------------- 0.3.0+


def _read_current(obj: JsonObject, version: str) -> Result:
    v11 = versions.at_least(version, "1.1.0")
    interfaces = [_read_fields(o, Interface, _INTERFACE, v11) for o in obj.objects("interfaces")]
    return Result(
        interfaces=interfaces,
        ips=[_read_ip(o, "address", _IP_KEYS, len(interfaces)) for o in obj.objects("ips")],
        routes=[_read_fields(o, Route, _ROUTE, v11) for o in obj.objects("routes")],
        dns=_read_dns(obj),
        extra=split_known(obj.raw, _RESULT_KEYS),
    )


def _write_current(result: Result, version: str) -> dict[str, Any]:
    v11 = versions.at_least(version, "1.1.0")
    out: dict[str, Any] = {"cniVersion": version, **(result.extra or {})}
    _put(out, "interfaces", [_write_fields(i, _INTERFACE, v11) for i in result.interfaces])
    ips = []
    for ip in result.ips:
        o: dict[str, Any] = {}
        if version in ("0.3.0", "0.3.1", "0.4.0"):
            o["version"] = str(ip.family)
        if ip.interface is not None:
            o["interface"] = ip.interface
        o["address"] = ip.address
        _put(o, "gateway", ip.gateway)
        ips.append({**(ip.extra or {}), **o})
    _put(out, "ips", ips)
    _put(out, "routes", [_write_fields(r, _ROUTE, v11) for r in result.routes])
    out["dns"] = _write_fields(result.dns, _DNS, False)
    return out


# ---------------------------------------------------------------------------- 0.1.0 / 0.2.0


def _read_legacy(obj: JsonObject) -> Result:
    result = Result(extra=split_known(obj.raw, _LEGACY_KEYS))
    for key in ("ip4", "ip6"):
        block = obj.child(key)
        if block is not None:
            result.ips.append(_read_ip(block, "ip", _LEGACY_IP_KEYS))
            result.routes += [
                _read_fields(o, Route, _ROUTE, False) for o in block.objects("routes")
            ]
    result.dns = _read_dns(obj)
    return result


def _write_legacy(result: Result, version: str) -> dict[str, Any]:
    out: dict[str, Any] = {"cniVersion": version, **(result.extra or {})}
    blocks: dict[int, dict[str, Any]] = {}
    for ip in result.ips:
        if ip.family in blocks:
            continue  # 0.2.0 carries one address per family: the first one wins
        block: dict[str, Any] = {"ip": ip.address}
        _put(block, "gateway", ip.gateway)
        blocks[ip.family] = {**(ip.extra or {}), **block}
    for route in result.routes:
        block_for_route = blocks.get(address_family(route.dst))
        if block_for_route is not None:
            block_for_route.setdefault("routes", []).append(_write_fields(route, _ROUTE, False))
    for family, key in ((4, "ip4"), (6, "ip6")):
        if family in blocks:
            out[key] = blocks[family]
    out["dns"] = _write_fields(result.dns, _DNS, False)
    return out

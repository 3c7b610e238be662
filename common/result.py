"""CNI results: one model for every spec version, converted in both directions.

Internally a result has the richest shape (1.1.0). It is read from any version and written
to any version:

* 0.1.0 / 0.2.0: ``ip4`` / ``ip6`` objects ({ip, gateway, routes}) and ``dns``;
* 0.3.0 / 0.3.1 / 0.4.0: ``interfaces``, ``ips`` (with ``version`` "4"/"6"), ``routes``, ``dns``;
* 1.0.0: as 0.4.0 without the redundant ``ips[].version``;
* 1.1.0: adds interface ``mtu``, ``socketPath``, ``pciID`` and route ``mtu``, ``advmss``,
  ``priority``, ``table``, ``scope``.

Keys a version does not define are kept verbatim in ``extra`` and written back, so a
pass-through never loses what a newer or foreign plugin put there. Down-conversion drops
what the older version cannot carry (interfaces, further addresses, 1.1.0 fields); that is
the spec's "lossy" cell of the conversion matrix, not a bug here.
"""

from __future__ import annotations

from common import versions
from common.errors import invalid_config
from common.jsonkeys import split_known
from common.jsonobj import JsonObject
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LEGACY = ("0.1.0", "0.2.0")


def is_legacy(version: str) -> bool:
    return version in LEGACY


def has_ip_version_field(version: str) -> bool:
    return version in ("0.3.0", "0.3.1", "0.4.0")


def has_1_1_fields(version: str) -> bool:
    return versions.at_least(version, "1.1.0")


def address_family(address: str) -> int:
    """4 or 6, from an address or CIDR string (cheap: no ipaddress import)."""
    return 6 if ":" in address else 4


# ---------------------------------------------------------------------------- the model


class Interface(Value):
    __slots__ = ("extra", "mac", "mtu", "name", "pci_id", "sandbox", "socket_path")

    name: str
    mac: str
    sandbox: str
    mtu: int | None  # 1.1.0
    socket_path: str  # 1.1.0
    pci_id: str  # 1.1.0
    extra: dict[str, Any]

    def __init__(
        self,
        name: str,
        mac: str = "",
        sandbox: str = "",
        mtu: int | None = None,
        socket_path: str = "",
        pci_id: str = "",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.mac = mac
        self.sandbox = sandbox
        self.mtu = mtu
        self.socket_path = socket_path
        self.pci_id = pci_id
        self.extra = {} if extra is None else extra


class IPConfig(Value):
    __slots__ = ("address", "extra", "gateway", "interface")

    address: str  # CIDR, e.g. "10.88.0.5/16"
    gateway: str
    interface: int | None  # index into Result.interfaces
    extra: dict[str, Any]

    def __init__(
        self,
        address: str,
        gateway: str = "",
        interface: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.address = address
        self.gateway = gateway
        self.interface = interface
        self.extra = {} if extra is None else extra

    @property
    def family(self) -> int:
        return address_family(self.address)

    @property
    def ip(self) -> str:
        """The address without its prefix length."""
        return self.address.split("/", 1)[0]


class Route(Value):
    __slots__ = ("advmss", "dst", "extra", "gw", "mtu", "priority", "scope", "table")

    dst: str
    gw: str
    mtu: int | None  # 1.1.0 (this and the rest)
    advmss: int | None
    priority: int | None
    table: int | None
    scope: int | None
    extra: dict[str, Any]

    def __init__(
        self,
        dst: str,
        gw: str = "",
        mtu: int | None = None,
        advmss: int | None = None,
        priority: int | None = None,
        table: int | None = None,
        scope: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.dst = dst
        self.gw = gw
        self.mtu = mtu
        self.advmss = advmss
        self.priority = priority
        self.table = table
        self.scope = scope
        self.extra = {} if extra is None else extra


class DNS(Value):
    __slots__ = ("domain", "extra", "nameservers", "options", "search")

    nameservers: list[str]
    domain: str
    search: list[str]
    options: list[str]
    extra: dict[str, Any]

    def __init__(
        self,
        nameservers: list[str] | None = None,
        domain: str = "",
        search: list[str] | None = None,
        options: list[str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.nameservers = [] if nameservers is None else nameservers
        self.domain = domain
        self.search = [] if search is None else search
        self.options = [] if options is None else options
        self.extra = {} if extra is None else extra


class Result(Value):
    __slots__ = ("dns", "extra", "interfaces", "ips", "routes")

    interfaces: list[Interface]
    ips: list[IPConfig]
    routes: list[Route]
    dns: DNS
    extra: dict[str, Any]

    def __init__(
        self,
        interfaces: list[Interface] | None = None,
        ips: list[IPConfig] | None = None,
        routes: list[Route] | None = None,
        dns: DNS | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.interfaces = [] if interfaces is None else interfaces
        self.ips = [] if ips is None else ips
        self.routes = [] if routes is None else routes
        self.dns = DNS() if dns is None else dns
        self.extra = {} if extra is None else extra

    # -- queries the plugins share ------------------------------------------------------

    def interface_index(self, name: str, *, in_sandbox: bool | None = None) -> int | None:
        for i, iface in enumerate(self.interfaces):
            if iface.name != name:
                continue
            if in_sandbox is None or bool(iface.sandbox) == in_sandbox:
                return i
        return None

    def container_ips(self, ifname: str) -> list[IPConfig]:
        """Addresses of the container interface `ifname`.

        An address whose interface index is absent is accepted (older plugins leave it
        out); one that points at another interface, or at a host-side one, is not.
        """
        out = []
        for ip in self.ips:
            if ip.interface is None:
                out.append(ip)
                continue
            if 0 <= ip.interface < len(self.interfaces):
                iface = self.interfaces[ip.interface]
                if iface.name == ifname and iface.sandbox:
                    out.append(ip)
        return out

    # -- reading and writing -------------------------------------------------------------

    @classmethod
    def from_json(cls, raw: object, version: str, where: str = "prevResult") -> Result:
        obj = JsonObject.of(raw, where)
        own = obj.get("cniVersion")
        if isinstance(own, str) and own in versions.SUPPORTED_VERSIONS:
            version = own
        # A result in the legacy shape is read as such whatever version it claims:
        # libcni would silently read nothing from it, which helps nobody.
        if (obj.has("ip4") or obj.has("ip6")) and not (obj.has("ips") or obj.has("interfaces")):
            version = "0.2.0"
        # ... and one in the current shape as such when it claims a legacy version or none
        # (a config without cniVersion): read as 0.2.0 its ips would be kept as unknown
        # keys and written back beside ip4/ip6.
        elif is_legacy(version) and (obj.has("ips") or obj.has("interfaces")):
            version = "0.4.0"
        if is_legacy(version):
            return _read_legacy(obj)
        return _read_current(obj, version)

    def to_json(self, version: str) -> dict[str, Any]:
        if is_legacy(version):
            return _write_legacy(self, version)
        return _write_current(self, version)


# ---------------------------------------------------------------------------- 0.3.0+


_IFACE_KEYS = ("name", "mac", "sandbox")
_IFACE_KEYS_1_1 = ("mtu", "socketPath", "pciID")
# "version" (0.3.0-0.4.0) is always known: written from the address where a version has
# it, dropped where it does not, never passed on as a foreign key.
_IP_KEYS = ("address", "gateway", "interface", "version")
_ROUTE_KEYS = ("dst", "gw")
_ROUTE_KEYS_1_1 = ("mtu", "advmss", "priority", "table", "scope")
_DNS_KEYS = ("nameservers", "domain", "search", "options")
_RESULT_KEYS = ("cniVersion", "interfaces", "ips", "routes", "dns")
_LEGACY_KEYS = ("cniVersion", "ip4", "ip6", "dns")
_LEGACY_IP_KEYS = ("ip", "gateway", "routes")


def _checked_address(obj: JsonObject, key: str, *, cidr: bool, required: bool) -> str:
    """obj[key] as an IP address (with a /prefix when `cidr`), or error 7 naming it.

    Go's result types parse these with net.ParseCIDR / net.ParseIP, so a result carrying
    anything else is refused there; passing it on would hand the next plugin (or the
    runtime) a result that is not one.
    """
    value: str = obj.string(key, "")
    if not value:
        if required:
            raise invalid_config(f"{obj.path(key)} is missing", "an address like 10.1.0.2/24")
        return value
    import _socket

    text, slash, prefix = value.partition("/")
    family = _socket.AF_INET6 if ":" in text else _socket.AF_INET
    bits = 128 if family == _socket.AF_INET6 else 32
    try:
        _socket.inet_pton(family, text)
        ok = True
    except OSError:
        ok = False
    if cidr:
        ok = ok and bool(slash) and prefix.isdigit() and prefix.isascii() and int(prefix) <= bits
    elif slash:
        ok = False
    if not ok:
        want = "an address with a prefix length, like 10.1.0.2/24" if cidr else "an IP address"
        raise invalid_config(f"{obj.path(key)} {value[:60]!r} is not {want}")
    return value


def _str_list(obj: JsonObject, key: str) -> list[str]:
    items = obj.array(key) or []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            JsonObject({key: item}, f"{obj.path(key)}[{i}]").string(key)
    return list(items)


def _read_dns(obj: JsonObject | None) -> DNS:
    if obj is None:
        return DNS()
    return DNS(
        nameservers=_str_list(obj, "nameservers"),
        domain=obj.string("domain", ""),
        search=_str_list(obj, "search"),
        options=_str_list(obj, "options"),
        extra=split_known(obj.raw, _DNS_KEYS),
    )


def _read_route(obj: JsonObject, v11: bool) -> Route:
    keys = _ROUTE_KEYS + (_ROUTE_KEYS_1_1 if v11 else ())
    route = Route(
        dst=obj.string("dst", ""), gw=obj.string("gw", ""), extra=split_known(obj.raw, keys)
    )
    if v11:
        route.mtu = obj.integer("mtu")
        route.advmss = obj.integer("advmss")
        route.priority = obj.integer("priority")
        route.table = obj.integer("table")
        route.scope = obj.integer("scope")
    return route


def _read_current(obj: JsonObject, version: str) -> Result:
    v11 = has_1_1_fields(version)
    result = Result(extra=split_known(obj.raw, _RESULT_KEYS))
    for o in obj.objects("interfaces"):
        iface = Interface(
            name=o.string("name", ""),
            mac=o.string("mac", ""),
            sandbox=o.string("sandbox", ""),
            extra=split_known(o.raw, _IFACE_KEYS + (_IFACE_KEYS_1_1 if v11 else ())),
        )
        if v11:
            iface.mtu = o.integer("mtu")
            iface.socket_path = o.string("socketPath", "")
            iface.pci_id = o.string("pciID", "")
        result.interfaces.append(iface)
    for o in obj.objects("ips"):
        result.ips.append(
            IPConfig(
                address=_checked_address(o, "address", cidr=True, required=True),
                gateway=_checked_address(o, "gateway", cidr=False, required=False),
                interface=o.integer("interface"),
                extra=split_known(o.raw, _IP_KEYS),
            )
        )
    result.routes = [_read_route(o, v11) for o in obj.objects("routes")]
    result.dns = _read_dns(obj.child("dns"))
    return result


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """Set key unless the value is empty (Go's omitempty)."""
    if value not in (None, "", [], {}):
        out[key] = value


def _write_dns(dns: DNS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _put(out, "nameservers", list(dns.nameservers))
    _put(out, "domain", dns.domain)
    _put(out, "search", list(dns.search))
    _put(out, "options", list(dns.options))
    return {**dns.extra, **out}


def _write_route(route: Route, v11: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"dst": route.dst}
    _put(out, "gw", route.gw)
    if v11:
        _put(out, "mtu", route.mtu)
        _put(out, "advmss", route.advmss)
        _put(out, "priority", route.priority)
        _put(out, "table", route.table)
        _put(out, "scope", route.scope)
    return {**route.extra, **out}


def _write_current(result: Result, version: str) -> dict[str, Any]:
    v11 = has_1_1_fields(version)
    out: dict[str, Any] = {"cniVersion": version, **result.extra}
    interfaces = []
    for iface in result.interfaces:
        o: dict[str, Any] = {"name": iface.name}
        _put(o, "mac", iface.mac)
        if v11:
            _put(o, "mtu", iface.mtu)
        _put(o, "sandbox", iface.sandbox)
        if v11:
            _put(o, "socketPath", iface.socket_path)
            _put(o, "pciID", iface.pci_id)
        interfaces.append({**iface.extra, **o})
    _put(out, "interfaces", interfaces)
    ips = []
    for ip in result.ips:
        o = {}
        if has_ip_version_field(version):
            o["version"] = str(ip.family)
        if ip.interface is not None:
            o["interface"] = ip.interface
        o["address"] = ip.address
        _put(o, "gateway", ip.gateway)
        ips.append({**ip.extra, **o})
    _put(out, "ips", ips)
    _put(out, "routes", [_write_route(r, v11) for r in result.routes])
    out["dns"] = _write_dns(result.dns)
    return out


# ---------------------------------------------------------------------------- 0.1.0 / 0.2.0


def _read_legacy(obj: JsonObject) -> Result:
    result = Result(extra=split_known(obj.raw, _LEGACY_KEYS))
    for key in ("ip4", "ip6"):
        ipobj = obj.child(key)
        if ipobj is None:
            continue
        result.ips.append(
            IPConfig(
                address=_checked_address(ipobj, "ip", cidr=True, required=True),
                gateway=_checked_address(ipobj, "gateway", cidr=False, required=False),
                extra=split_known(ipobj.raw, _LEGACY_IP_KEYS),
            )
        )
        result.routes.extend(_read_route(o, False) for o in ipobj.objects("routes"))
    result.dns = _read_dns(obj.child("dns"))
    return result


def _write_legacy(result: Result, version: str) -> dict[str, Any]:
    out: dict[str, Any] = {"cniVersion": version, **result.extra}
    blocks: dict[int, dict[str, Any]] = {}
    for ip in result.ips:
        if ip.family in blocks:
            continue  # 0.2.0 carries one address per family: the first one wins
        block: dict[str, Any] = {"ip": ip.address}
        _put(block, "gateway", ip.gateway)
        blocks[ip.family] = {**ip.extra, **block}
    for route in result.routes:
        block_for_route = blocks.get(address_family(route.dst))
        if block_for_route is not None:
            block_for_route.setdefault("routes", []).append(_write_route(route, False))
    for family, key in ((4, "ip4"), (6, "ip6")):
        if family in blocks:
            out[key] = blocks[family]
    out["dns"] = _write_dns(result.dns)
    return out

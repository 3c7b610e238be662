"""The `ipam` section of a network configuration, read as host-local reads it.

Every form host-local accepts is accepted here with its meaning and defaults: `ranges`
(range sets, one address per set), the single range written in the `ipam` object itself
(`subnet`, `rangeStart`, `rangeEnd`, `gateway`), `routes`, `dataDir`, `resolvConf`,
runtimeConfig `ips` and `ipRanges`, `args.cni.ips`, CNI_ARGS `IP=`. Defaults: gateway =
subnet + 1; the first address = subnet + 1 (the gateway is skipped when handing out);
the last = the subnet's last address, IPv4's broadcast excluded. Refused, with the field
named (error 7): a subnet too small to hand out from (/31, /32, /127, /128), host bits in
a subnet, a range bound outside its subnet, a set that mixes families, overlapping
ranges or sets. Our one option of our own is `releaseOnReboot` (docs/flatnet-ipam.md).
"""

from __future__ import annotations

from common.errors import invalid_config
from common.jsonobj import JsonObject
from common.result import Route
from common.values import Value
from flatnet_ipam.addr import BITS, format_cidr, format_ip, mask, parse_cidr, parse_ip

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from common.config import NetConf

DEFAULT_DATA_DIR = "/var/lib/cni/networks"


class Range(Value):
    """One range of a range set: addresses as integers of `family`, bounds inclusive."""

    family: int
    subnet: int  # the network address
    prefix: int
    start: int
    end: int
    gateway: int  # the result's gateway; skipped when handing out

    def contains(self, value: int) -> bool:
        return self.start <= value <= self.end

    def in_subnet(self, value: int) -> bool:
        return value & mask(self.family, self.prefix) == self.subnet

    def overlaps(self, other: Range) -> bool:
        """host-local's Range.Overlaps: same family and a bound of one inside the other."""
        return self.family == other.family and (
            self.contains(other.start)
            or self.contains(other.end)
            or other.contains(self.start)
            or other.contains(self.end)
        )

    @property
    def size(self) -> int:
        return self.end - self.start + 1

    def __str__(self) -> str:
        return f"{format_ip(self.family, self.start)}-{format_ip(self.family, self.end)}"


class RangeSet(Value):
    """The ranges one address is handed out from (host-local's RangeSet)."""

    ranges: tuple[Range, ...]

    @property
    def family(self) -> int:
        return self.ranges[0].family

    def range_for(self, family: int, value: int) -> Range | None:
        return next(
            (r for r in self.ranges if r.family == family and r.contains(value)),
            None,
        )

    def overlaps(self, other: RangeSet) -> bool:
        return any(a.overlaps(b) for a in self.ranges for b in other.ranges)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.ranges)


class IpamConfig(Value):
    """Everything an allocation needs, validated."""

    network: str  # the configuration's name: the lease directory's name
    cni_version: str
    range_sets: tuple[RangeSet, ...]
    routes: tuple[Route, ...] = ()  # gw "" is filled with the gateway of its family
    data_dir: str = DEFAULT_DATA_DIR
    resolv_conf: str = ""
    requested: tuple[tuple[int, int], ...] = ()  # (family, address) asked for by the runtime
    release_on_reboot: bool = True

    @property
    def lease_dir(self) -> str:
        import posixpath

        return posixpath.join(self.data_dir, self.network)


def parse(conf: NetConf, cni_args: Mapping[str, str] | None = None) -> IpamConfig:
    """The config's `ipam` section, with the runtime's requests (runtimeConfig `ips` and
    `ipRanges`, `args.cni.ips`, CNI_ARGS `IP=`); error 7 naming the field."""
    ipam = conf.body.child("ipam")
    if ipam is None:
        raise invalid_config("the network configuration has no 'ipam' object")
    requested: list[tuple[int, int]] = []
    text = (cni_args or {}).get("IP", "")
    for item in text.split(",") if text else ():
        parsed = parse_ip(item.strip())
        if parsed is None:
            raise invalid_config(f"CNI_ARGS IP {item.strip()[:60]!r} is not an IP address")
        requested.append(parsed)
    requested += _requested_ips(conf.cni_args_object, "ips")
    requested += _requested_ips(conf.runtime_config, "ips")
    sets: list[RangeSet] = []
    for i, items in enumerate(conf.runtime_config.array("ipRanges") or ()):
        sets.append(_range_set(items, f"runtimeConfig.ipRanges[{i}]"))
    if ipam.get("subnet") is not None:
        sets.append(RangeSet((_range(ipam),)))
    else:
        for key in ("rangeStart", "rangeEnd", "gateway"):
            if ipam.string(key, ""):
                raise invalid_config(
                    f"{ipam.path(key)} needs {ipam.path('subnet')}",
                    "write the range with its subnet, or put it in 'ranges'",
                )
    for i, items in enumerate(ipam.array("ranges") or ()):
        sets.append(_range_set(items, f"{ipam.path('ranges')}[{i}]"))
    if not sets:
        raise invalid_config(
            "no IP ranges specified",
            "give ipam.subnet, ipam.ranges or runtimeConfig.ipRanges",
        )
    for i, a in enumerate(sets):
        for j in range(i + 1, len(sets)):
            if a.overlaps(sets[j]):
                raise invalid_config(f"range set {i} ({a}) overlaps with range set {j}")
    if conf.cni_version in ("0.1.0", "0.2.0"):
        for family in (4, 6):
            if sum(1 for s in sets if s.family == family) > 1:
                raise invalid_config(
                    f"CNI version {conf.cni_version} does not support more than 1 address "
                    f"per family (IPv{family})",
                    "use cniVersion 0.3.0 or later",
                )
    data_dir = ipam.string("dataDir", "") or DEFAULT_DATA_DIR
    if not data_dir.startswith("/") or "\0" in data_dir:
        raise invalid_config(f"{ipam.path('dataDir')} {data_dir[:80]!r} is not an absolute path")
    return IpamConfig(
        network=conf.name,
        cni_version=conf.cni_version,
        range_sets=tuple(sets),
        routes=tuple(_route(r) for r in ipam.objects("routes")),
        data_dir=data_dir,
        resolv_conf=ipam.string("resolvConf", ""),
        requested=tuple(dict.fromkeys(requested)),
        release_on_reboot=ipam.boolean("releaseOnReboot", True),
    )


def _requested_ips(obj: JsonObject, key: str) -> list[tuple[int, int]]:
    """An array of addresses, each with or without a prefix length (Go's ip.IP)."""
    out = []
    for i, item in enumerate(obj.array(key) or ()):
        where = f"{obj.path(key)}[{i}]"
        if not isinstance(item, str):
            raise invalid_config(f"{where} must be a string, an IP address")
        parsed = parse_ip(item) if "/" not in item else None
        if parsed is None:
            cidr = parse_cidr(item)
            if cidr is None:
                raise invalid_config(f"{where} {item[:60]!r} is not an IP address")
            parsed = cidr[0], cidr[1]
        out.append(parsed)
    return out


def _range_set(items: object, where: str) -> RangeSet:
    if not isinstance(items, list):
        raise invalid_config(f"{where} must be a JSON array of ranges")
    if not items:
        raise invalid_config(f"{where} is an empty range set")
    ranges = tuple(_range(JsonObject.of(item, f"{where}[{i}]")) for i, item in enumerate(items))
    for i, r in enumerate(ranges):
        if r.family != ranges[0].family:
            raise invalid_config(
                f"{where} mixes address families", f"{where}[{i}] is IPv{r.family}"
            )
        for j in range(i + 1, len(ranges)):
            if r.overlaps(ranges[j]):
                raise invalid_config(f"{where}: ranges {r} and {ranges[j]} overlap")
    return RangeSet(ranges)


def _address(obj: JsonObject, key: str, family: int) -> int | None:
    text = obj.string(key, "")
    if not text:  # Go's net.IP reads "" as no address
        return None
    parsed = parse_ip(text)
    if parsed is None:
        raise invalid_config(f"{obj.path(key)} {text[:60]!r} is not an IP address")
    if parsed[0] != family:
        raise invalid_config(f"{obj.path(key)} {text[:60]!r} is not an IPv{family} address")
    return parsed[1]


def _range(obj: JsonObject) -> Range:
    text = obj.string("subnet", "")
    if not text:
        raise invalid_config(f"{obj.path('subnet')} is missing", "a subnet like 10.42.0.0/16")
    cidr = parse_cidr(text)
    if cidr is None:
        raise invalid_config(
            f"{obj.path('subnet')} {text[:60]!r} is not a subnet like 10.42.0.0/16"
        )
    family, value, prefix = cidr
    bits = BITS[family]
    if prefix > bits - 2:
        raise invalid_config(
            f"{obj.path('subnet')} {text} is too small to allocate from",
            f"an IPv{family} subnet needs a prefix length of at most {bits - 2}",
        )
    network = value & mask(family, prefix)
    if network != value:
        raise invalid_config(
            f"{obj.path('subnet')} {text} has host bits set",
            f"for a prefix length of {prefix} the network address is "
            f"{format_cidr(family, network, prefix)}",
        )
    last = network | ((1 << (bits - prefix)) - 1)
    if family == 4:
        last -= 1  # the broadcast address
    start = _address(obj, "rangeStart", family)
    end = _address(obj, "rangeEnd", family)
    gateway = _address(obj, "gateway", family)
    probe = Range(family, network, prefix, network + 1, last, network + 1)
    for key, bound in (("rangeStart", start), ("rangeEnd", end)):
        if bound is not None and not (probe.in_subnet(bound) and probe.contains(bound)):
            raise invalid_config(
                f"{obj.path(key)} {format_ip(family, bound)} is not in subnet {text}",
                f"usable addresses are {probe}",
            )
    first = network + 1 if start is None else start
    end = last if end is None else end
    if first > end:
        raise invalid_config(
            f"{obj.path('rangeStart')} {format_ip(family, first)} is after "
            f"{obj.path('rangeEnd')} {format_ip(family, end)}"
        )
    return Range(family, network, prefix, first, end, network + 1 if gateway is None else gateway)


def _route(obj: JsonObject) -> Route:
    dst = obj.string("dst", "")
    cidr = parse_cidr(dst)
    if cidr is None:
        raise invalid_config(
            f"{obj.path('dst')} {dst[:60]!r} is not a destination like 0.0.0.0/0"
            if dst
            else f"{obj.path('dst')} is missing"
        )
    gw = obj.string("gw", "")
    if gw:
        parsed = parse_ip(gw)
        if parsed is None or parsed[0] != cidr[0]:
            raise invalid_config(
                f"{obj.path('gw')} {gw[:60]!r} is not an IPv{cidr[0]} address (the family of dst)"
            )
        gw = format_ip(*parsed)
    ints = {
        attr: obj.integer(key, minimum=0, maximum=2**32 - 1)
        for key, attr in (
            ("mtu", "mtu"),
            ("advmss", "advmss"),
            ("priority", "priority"),
            ("table", "table"),
            ("scope", "scope"),
        )
    }
    return Route(dst=format_cidr(*cidr), gw=gw, **ints)

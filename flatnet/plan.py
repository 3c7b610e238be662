"""What an ADD makes of IPAM's answer, as plain data: the gateways to put on the bridge,
the routes for the container, the result to report. Pure (Go's calcGateways)."""

from __future__ import annotations

import _socket

from common.result import Interface, IPConfig, Result, Route

TYPE_CHECKING = False
if TYPE_CHECKING:
    from flatnet.config import Config

DEFAULTS = {4: "0.0.0.0/0", 6: "::/0"}
MULTICAST = {4: "224.0.0.0/4", 6: "ff00::/8"}
CONTAINER_INDEX = 2  # interfaces: [bridge, host veth, container interface]


def _family(address: str) -> int:
    return 6 if ":" in address else 4


def _pack(address: str) -> tuple[int, int, int]:
    """(family, the address as an integer, its bit width)."""
    family = _family(address)
    raw = _socket.inet_pton(_socket.AF_INET6 if family == 6 else _socket.AF_INET, address)
    return family, int.from_bytes(raw, "big"), len(raw) * 8


def _unpack(family: int, value: int) -> str:
    width = 16 if family == 6 else 4
    kind = _socket.AF_INET6 if family == 6 else _socket.AF_INET
    return _socket.inet_ntop(kind, value.to_bytes(width, "big"))


def network_of(cidr: str) -> str:
    """10.42.3.7/16 -> 10.42.0.0/16: the prefix an address lives in."""
    address, _, length = cidr.partition("/")
    family, value, bits = _pack(address)
    prefix = int(length)
    mask = ((1 << bits) - 1) ^ ((1 << (bits - prefix)) - 1)
    return f"{_unpack(family, value & mask)}/{prefix}"


def first_host(cidr: str) -> str:
    """The address after the network address (Go's calcGatewayIP)."""
    network, _, _ = network_of(cidr).partition("/")
    family, value, _ = _pack(network)
    return _unpack(family, value + 1)


def gateway_cidr(ip: IPConfig) -> str:
    """The gateway with the container address's prefix length: what goes on the bridge."""
    return f"{ip.gateway}/{ip.address.partition('/')[2]}"


class Plan:
    """The container's addresses (with their gateways filled in where the bridge is the
    gateway), its routes, and the gateway addresses for the bridge."""

    __slots__ = ("bridge_addresses", "ips", "routes")

    def __init__(self, ips: list[IPConfig], routes: list[Route], bridge_addresses: list[str]):
        self.ips = ips
        self.routes = routes
        self.bridge_addresses = bridge_addresses


def make_plan(cfg: Config, ipam: Result) -> Plan:
    """Go's calcGateways: each address points at the container interface; with isGateway
    an address without a gateway gets its subnet's first host as one, and that gateway
    goes on the bridge; with isDefaultGateway a default route per family unless IPAM
    already gave one with a gateway."""
    ips: list[IPConfig] = []
    routes = list(ipam.routes)
    bridge: list[str] = []
    default_found: set[int] = set()
    for ip in ipam.ips:
        ip = ip.replace(interface=CONTAINER_INDEX)
        if not ip.gateway and cfg.is_gateway:
            ip = ip.replace(gateway=first_host(ip.address))
        family = ip.family
        if cfg.is_default_gateway and family not in default_found:
            if not any(r.gw and r.dst == DEFAULTS[family] for r in routes):
                routes.append(Route(dst=DEFAULTS[family], gw=ip.gateway))
            default_found.add(family)
        if cfg.is_gateway and gateway_cidr(ip) not in bridge:
            bridge.append(gateway_cidr(ip))
        ips.append(ip)
    return Plan(ips, routes, bridge)


def route_gateway(route: Route, ips: list[IPConfig]) -> str:
    """A route's next hop: its own, else the gateway of the first address of its family
    (as Go's ConfigureIface does)."""
    if route.gw:
        return route.gw
    family = _family(route.dst)
    return next((ip.gateway for ip in ips if ip.family == family and ip.gateway), "")


def report(
    plan: Plan | None,
    ipam: Result | None,
    bridge: Interface,
    host: Interface,
    container: Interface,
) -> Result:
    """The result: [bridge, host veth, container interface], the addresses, routes and
    DNS (IPAM's, as Go's bridge reports them)."""
    result = Result(interfaces=[bridge, host, container])
    if plan is not None and ipam is not None:
        result.ips = plan.ips
        result.routes = plan.routes
        result.dns = ipam.dns
    return result


def broadcast_of(cidr: str) -> str:
    """The IPv4 broadcast address of `cidr`'s subnet (what `ip addr add ... brd +` sets)."""
    address, _, length = cidr.partition("/")
    family, value, bits = _pack(address)
    host_bits = bits - int(length)
    return _unpack(family, value | ((1 << host_bits) - 1))


def canonical(cidr: str) -> str:
    """An address with prefix in its one canonical spelling (IPv6 compressed)."""
    address, _, length = cidr.partition("/")
    family, value, _ = _pack(address)
    return f"{_unpack(family, value)}/{length}" if length else _unpack(family, value)

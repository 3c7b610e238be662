"""What one attachment's port mappings should look like in the kernel, as plain data.

Pure: config + prevResult -> a Plan with one FamilyPlan per address family the container
has: its Forwards and how to masquerade (`snat`, `masqAll`: docs/portmap.md). The backends
turn it into nft elements or iptables rules; DEL, CHECK and GC compare against it.
"""

from __future__ import annotations

from common.errors import invalid_config
from common.result import Result
from common.values import Value
from portmap.config import (
    ANY_ADDRESS,
    DEFAULT_MARK_BIT,
    Conditions,
    PortmapConfig,
    host_ports,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.identity import Attachment

MASQ_NONE = "none"
MASQ_SUBNET = "subnet"  # container subnet (hairpin, neighbours) and, for IPv4, localhost
MASQ_ALL = "all"
# The UDP ports whose conntrack entries go when forwards go (stale entries would keep
# sending a client's datagrams to a container that is gone): (family, host address or
# None, port). Backends return them from delete and gc; the verbs flush them.
UdpTargets = list[tuple[int, str | None, int]]


class Forward(Value):
    """host_ip:host_port..+count-1 -> container:container_port..; host_ip None = any."""

    host_ip: str | None
    protocol: str
    host_port: int
    container_port: int
    count: int = 1
    mapping: int = 0  # index in portMappings

    def ports(self) -> list[tuple[int, int]]:
        return [(self.host_port + i, self.container_port + i) for i in range(self.count)]

    def overlaps(self, protocol: str, first: int, last: int) -> bool:
        """Whether it maps one of the host ports `first`..`last` of `protocol`."""
        mine = self.host_port, self.host_port + self.count - 1
        return protocol == self.protocol and first <= mine[1] and mine[0] <= last

    def describe(self, family: int) -> str:
        return host_ports(
            self.host_ip or ANY_ADDRESS[family], self.host_port, self.count, self.protocol
        )


class FamilyPlan(Value):
    family: int  # 4 or 6
    container_ip: str
    subnet: str  # the container's network address, e.g. "10.88.0.0"
    prefix_len: int
    forwards: tuple[Forward, ...]
    masquerade: str  # MASQ_NONE / MASQ_SUBNET / MASQ_ALL
    conditions: Conditions  # each backend renders them (none without forwards)

    @property
    def localhost(self) -> bool:
        """Whether 127.0.0.0/8 sources are forwarded (and need route_localnet)."""
        return self.family == 4 and self.masquerade != MASQ_NONE

    @property
    def subnet_cidr(self) -> str:
        return f"{self.subnet}/{self.prefix_len}"


class Plan(Value):
    attachment: Attachment
    families: tuple[FamilyPlan, ...]
    skipped: tuple[str, ...] = ()  # human notes: mappings that apply to no family here
    mark_bit: int = DEFAULT_MARK_BIT  # iptables backend: the "masquerade me" fwmark bit
    external_mark_chain: str = ""  # iptables backend: jump here instead of SETMARK
    # iptables backend: (protocol, host port, count) of every mapping in config order,
    # each family's included: Go's jumps list them all
    host_ports: tuple[tuple[str, int, int], ...] = ()

    @property
    def empty(self) -> bool:
        return not any(f.forwards for f in self.families)

    def udp_ports(self) -> UdpTargets:
        """Every UDP host port: conntrack to flush."""
        out: UdpTargets = []
        for fam in self.families:
            for fw in fam.forwards:
                if fw.protocol == "udp":
                    out.extend((fam.family, fw.host_ip, hp) for hp, _ in fw.ports())
        return out


def container_addresses(prev: Result, ifname: str) -> dict[int, tuple[str, int, str]]:
    """Per family, the first address of the sandbox interface `ifname`:
    (address, prefix length, network address)."""
    import ipaddress

    out: dict[int, tuple[str, int, str]] = {}
    for ipc in prev.container_ips(ifname):
        if ipc.family in out:
            continue
        try:
            iface = ipaddress.ip_interface(ipc.address)
        except ValueError:
            raise invalid_config(
                f"prevResult address {ipc.address!r} is not an address with a prefix length"
            ) from None
        if iface.ip.is_loopback:
            # a DNAT there would hand the host port to the host's own loopback services
            raise invalid_config(
                f"prevResult address {ipc.address} of {ifname} is a loopback address",
                "portmap forwards host ports to the container's address: give the "
                "container one that is not in 127.0.0.0/8 or ::1",
            )
        out[ipc.family] = (
            iface.ip.compressed,
            iface.network.prefixlen,
            iface.network.network_address.compressed,
        )
    return out


def _masquerade(config: PortmapConfig) -> str:
    if not config.options.snat:
        return MASQ_NONE
    return MASQ_ALL if config.options.masq_all else MASQ_SUBNET


def make_plan(config: PortmapConfig, attachment: Attachment, prev: Result | None) -> Plan:
    addresses = container_addresses(prev, attachment.ifname) if prev else {}
    families = []
    used: set[int] = set()
    for family, (ip, prefix, subnet) in sorted(addresses.items()):
        forwards = [
            Forward(
                None if m.is_wildcard else m.host_ip,
                m.protocol,
                m.host_port,
                m.container_port,
                m.count,
                m.index,
            )
            for m in config.mappings
            if m.host_family in (None, family)  # Go skips a hostIP of the other family
        ]
        used.update(f.mapping for f in forwards)
        # Specific host addresses first: the iptables backend relies on this order.
        forwards.sort(key=lambda f: (f.host_ip is None, f.mapping))
        families.append(
            FamilyPlan(
                family=family,
                container_ip=ip,
                subnet=subnet,
                prefix_len=prefix,
                forwards=tuple(forwards),
                masquerade=_masquerade(config),
                conditions=config.options.conditions(family) if forwards else Conditions(family),
            )
        )
    skipped = tuple(
        f"{m.describe()}: the container has no IPv{m.host_family or '4/6'} address"
        for m in config.mappings
        if m.index not in used
    )
    return Plan(
        attachment,
        tuple(families),
        skipped,
        config.options.mark_masq_bit,
        config.options.external_set_mark_chain,
        tuple((m.protocol, m.host_port, m.count) for m in config.mappings),
    )

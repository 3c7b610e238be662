"""flatnet's configuration: the Go bridge's option names and defaults, validated before
anything is touched (error 7 naming the option). Pure."""

from __future__ import annotations

from common.errors import invalid_config
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.config import NetConf
    from common.env import Invocation
    from common.jsonobj import JsonObject

DEFAULT_BRIDGE = "cni0"  # Go's defaultBrName
IN_PROCESS_IPAM = "flatnet-ipam"
MASQ_BACKENDS = ("nftables", "iptables")
MTU_MIN = 68  # the IPv4 minimum; the kernel refuses less on Ethernet devices
MTU_MAX = 65535  # a veth's and a bridge's maximum
VLAN_MAX = 4094
IFNAMSIZ = 15  # an interface name's characters (IFNAMSIZ less its NUL)
_HEX = frozenset("0123456789abcdef")
# Go options flatnet does not implement: refused by name rather than silently ignored
# (a value that asks for nothing, false or empty, is accepted).
UNSUPPORTED = ("vlanTrunk", "preserveDefaultVlan", "macspoofchk", "disableContainerInterface")


class Config(Value):
    bridge: str = DEFAULT_BRIDGE
    is_gateway: bool = False
    is_default_gateway: bool = False
    force_address: bool = False
    ip_masq: bool = False
    masq_backend: str = "nftables"
    mtu: int | None = None  # None: the kernel's default (1500), an existing bridge's own
    hairpin: bool = False
    promisc: bool = False
    port_isolation: bool = False
    enable_dad: bool = False
    vlan: int = 0
    mac: str = ""  # the container interface's, normalised
    ipam_type: str = ""  # "": no IPAM (a layer-2 attachment, as Go's bridge allows)

    @property
    def ipam_in_process(self) -> bool:
        return self.ipam_type == IN_PROCESS_IPAM


def valid_ifname(name: str) -> bool:
    return (
        0 < len(name) <= IFNAMSIZ
        and name not in (".", "..")
        and not any(c in "/:" or c.isspace() or not c.isprintable() for c in name)
    )


def parse_mac(text: str, where: str) -> str:
    """A unicast Ethernet address as aa:bb:cc:dd:ee:ff (Go's net.ParseMAC spellings of
    48-bit addresses: colons, dashes or dotted groups of four)."""
    low = text.lower()
    if len(low) == 17 and low[2] in ":-":
        groups = low.split(low[2])
    elif len(low) == 14 and low[4] == "." and low[9] == ".":
        groups = [g[i : i + 2] for g in low.split(".") for i in (0, 2)]
    else:
        groups = []
    if len(groups) != 6 or any(len(g) != 2 or not set(g) <= _HEX for g in groups):
        raise invalid_config(
            f"{where} {text[:40]!r} is not a MAC address", "like 02:42:ac:11:00:02"
        )
    if int(groups[0], 16) & 1:
        raise invalid_config(f"{where} {text[:40]!r} is a multicast address", "use a unicast one")
    if groups == ["00"] * 6:
        raise invalid_config(f"{where} is the all-zero address")
    return ":".join(groups)


def _mac(conf: NetConf, env: Invocation) -> str:
    """Go's precedence: runtimeConfig.mac over args.cni.mac over CNI_ARGS MAC."""
    for value, where in (
        (conf.runtime_config.string("mac", ""), "runtimeConfig.mac"),
        (conf.cni_args_object.string("mac", ""), "args.cni.mac"),
        (env.cni_args.get("MAC", ""), "CNI_ARGS MAC"),
    ):
        if value:
            return parse_mac(value, where)
    return ""


def _refuse_unsupported(body: JsonObject) -> None:
    for key in UNSUPPORTED:
        if body.get(key) not in (None, False, "", [], {}):
            raise invalid_config(
                f"{key} is an option of the Go bridge that flatnet does not implement",
                "remove it, or keep the Go bridge for this network",
            )


def parse(conf: NetConf, env: Invocation) -> Config:
    body = conf.body
    _refuse_unsupported(body)
    bridge = body.string("bridge", "") or DEFAULT_BRIDGE
    if not valid_ifname(bridge):
        raise invalid_config(
            f"bridge {bridge[:40]!r} is not an interface name",
            f"at most {IFNAMSIZ} characters, no '/', ':' or white space",
        )
    mtu = body.integer("mtu", 0)
    if mtu and not MTU_MIN <= mtu <= MTU_MAX:
        raise invalid_config(
            f"mtu {mtu} is out of range", f"from {MTU_MIN} to {MTU_MAX}; 0 or absent: 1500"
        )
    vlan = body.integer("vlan", 0)
    if not 0 <= vlan <= VLAN_MAX:
        raise invalid_config(f"invalid VLAN ID {vlan} (must be between 0 and {VLAN_MAX})")
    backend = body.string("ipMasqBackend", "") or "nftables"
    if backend not in MASQ_BACKENDS:
        raise invalid_config(
            f"ipMasqBackend {backend[:40]!r} is unknown", "use 'nftables' (default) or 'iptables'"
        )
    is_default_gateway = body.boolean("isDefaultGateway", False)
    cfg = Config(
        bridge=bridge,
        is_gateway=body.boolean("isGateway", False) or is_default_gateway,
        is_default_gateway=is_default_gateway,
        force_address=body.boolean("forceAddress", False),
        ip_masq=body.boolean("ipMasq", False),
        masq_backend=backend,
        mtu=mtu or None,
        hairpin=body.boolean("hairpinMode", False),
        promisc=body.boolean("promiscMode", False),
        port_isolation=body.boolean("portIsolation", False),
        enable_dad=body.boolean("enabledad", False),
        vlan=vlan,
        mac=_mac(conf, env),
        ipam_type=_ipam_type(body),
    )
    if cfg.hairpin and cfg.promisc:
        raise invalid_config("cannot set hairpin mode and promiscuous mode at the same time")
    if cfg.vlan and cfg.is_gateway:
        raise invalid_config(
            "vlan with isGateway is not implemented by flatnet",
            "the Go bridge puts the gateway on a vlan interface of the bridge; leave one out",
        )
    return cfg


def _ipam_type(body: JsonObject) -> str:
    ipam = body.child("ipam")
    kind: str = "" if ipam is None else ipam.string("type", "")
    if kind and (kind.startswith(".") or "/" in kind or "\0" in kind):
        raise invalid_config(
            f"ipam.type {kind[:40]!r} is not a plugin name", "the name of a plugin in CNI_PATH"
        )
    return kind


def parse_teardown(conf: NetConf) -> Config:
    """What DEL and GC read of the config: the IPAM type and the masquerade, nothing they
    would refuse. A config ADD refused (an unimplemented option, a bad MTU) made nothing,
    so its DEL must succeed: runtimes retry a failing DEL for as long as it fails."""
    from common.errors import CniError

    body = conf.body
    try:
        ip_masq = bool(body.boolean("ipMasq", False))
    except CniError:
        ip_masq = False
    backend = body.get("ipMasqBackend")
    try:
        ipam_type = _ipam_type(body)
    except CniError:
        ipam_type = ""  # no plugin could have that name: ADD never leased anything
    return Config(
        ip_masq=ip_masq,
        masq_backend=backend if backend in MASQ_BACKENDS else "nftables",
        ipam_type=ipam_type,
    )

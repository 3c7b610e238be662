"""What cnichain needs of the CNI spec, as a runtime sees it: the versions, libcni's rules
for network names, container IDs and interface names, and libcni's re-marshalling of a
plugin's result.

cnichain is a runtime: it execs plugins and imports none of them, nor the `common`
package they share (a test author's own `common` module must stay importable in a
pytest session that loads the cnichain plugin). So the little of the spec it needs lives
here, written from libcni's behaviour (pkg/utils, pkg/types/*), not shared with the
plugins' reading of it.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
# libcni reads a list without cniVersion as 0.1.0.
DEFAULT_VERSION = "0.1.0"
LEGACY = ("0.1.0", "0.2.0")  # results with ip4/ip6 objects instead of interfaces and ips


class SpecError(ValueError):
    """Something a runtime must refuse: a bad name, or a result that is not one."""


def at_least(version: str, minimum: str) -> bool:
    """Semantic version comparison; a version that is not x.y.z is never `at_least`."""

    def parts(v: str) -> tuple[int, ...]:
        fields = v.split(".")
        if len(fields) != 3 or not all(f.isascii() and f.isdigit() for f in fields):
            return (-1,)
        return tuple(int(f) for f in fields)

    return parts(version) >= parts(minimum)


# ---------------------------------------------------------------------------- libcni's names

# libcni pkg/utils: cniValidNameChars, for container IDs and network names.
_PLAIN_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
_MAX_IFNAME = 15  # IFNAMSIZ - 1, counted in bytes as the kernel does


def validate_network_name(name: str) -> None:
    if not name:
        raise SpecError("the network has no name")
    if not _PLAIN_NAME.fullmatch(name):
        raise SpecError(
            f"invalid network name {name[:80]!r}: it must start with a letter or digit and "
            "contain only letters, digits, '_', '.' and '-'"
        )


def validate_container_id(cid: str) -> None:
    if not cid:
        raise SpecError("missing container ID")
    if not _PLAIN_NAME.fullmatch(cid):
        raise SpecError(
            f"invalid container ID {cid[:80]!r}: it must start with a letter or digit and "
            "contain only letters, digits, '_', '.' and '-'"
        )


def validate_ifname(name: str) -> None:
    problem = ""
    if not name:
        problem = "it is empty"
    elif len(name.encode("utf-8", "surrogateescape")) > _MAX_IFNAME:
        problem = f"it is longer than {_MAX_IFNAME} bytes"
    elif name in (".", ".."):
        problem = "it is . or .."
    elif any(c in "/:" or c.isspace() for c in name):
        problem = "it must not contain '/', ':' or white space"
    if problem:
        raise SpecError(f"invalid interface name {name[:40]!r}: {problem}")


# ---------------------------------------------------------------------------- results

# Go's result types, field by field: (JSON key, kind, only from 1.1.0 on), in the order Go
# writes them. "name" and "dst" have no omitempty; every other field has.
_INTERFACE = (
    ("name", "str", False),
    ("mac", "str", False),
    ("mtu", "int", True),
    ("sandbox", "str", False),
    ("socketPath", "str", True),
    ("pciID", "str", True),
)
_ROUTE = (
    ("dst", "cidr", False),
    ("gw", "ip", False),
    ("mtu", "int", True),
    ("advmss", "int", True),
    ("priority", "int", True),
    ("table", "int", True),
    ("scope", "int", True),
)
_DNS = (
    ("nameservers", "strs", False),
    ("domain", "str", False),
    ("search", "strs", False),
    ("options", "strs", False),
)
_ALWAYS = ("name", "dst")


def remarshal(result: dict[str, Any], version: str) -> dict[str, Any]:
    """`result` decoded into `version`'s result type and encoded again, as libcni passes a
    plugin's result on: keys the type does not have are dropped, empty ones left out,
    `dns` always written, and a result in the other shape (ip4/ip6 against ips) converted.
    SpecError when a field is not what the type holds (Go's decoder refuses it)."""
    current = "ips" in result or "interfaces" in result
    if ("ip4" in result or "ip6" in result) and not current:
        ips, routes = _read_legacy(result)
        interfaces: list[dict[str, Any]] = []
    else:
        v11 = at_least(version, "1.1.0")
        interfaces = [
            _fields(o, _INTERFACE, v11, f"interfaces[{i}]")
            for i, o in enumerate(_objects(result, "interfaces"))
        ]
        ips = [
            _ip(o, "address", len(interfaces), f"ips[{i}]")
            for i, o in enumerate(_objects(result, "ips"))
        ]
        routes = [
            _fields(o, _ROUTE, v11, f"routes[{i}]")
            for i, o in enumerate(_objects(result, "routes"))
        ]
    dns = result.get("dns")
    if dns is not None and not isinstance(dns, dict):
        raise SpecError("dns is not an object")
    dns_out = _fields(dns or {}, _DNS, False, "dns")
    if version in LEGACY:
        return _write_legacy(ips, routes, dns_out, version)
    out: dict[str, Any] = {"cniVersion": version}
    if interfaces:
        out["interfaces"] = interfaces
    written = []
    for ip in ips:
        o: dict[str, Any] = {}
        if version in ("0.3.0", "0.3.1", "0.4.0"):
            o["version"] = "6" if ":" in ip["address"] else "4"
        if ip.get("interface") is not None:
            o["interface"] = ip["interface"]
        o["address"] = ip["address"]
        if ip.get("gateway"):
            o["gateway"] = ip["gateway"]
        written.append(o)
    if written:
        out["ips"] = written
    if routes:
        out["routes"] = [_fields(r, _ROUTE, at_least(version, "1.1.0"), "routes") for r in routes]
    out["dns"] = dns_out
    return out


def _objects(obj: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = obj.get(key)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(o, dict) for o in items):
        raise SpecError(f"{key} is not a list of objects")
    return items


def _address(value: Any, where: str, *, cidr: bool) -> str:
    if not isinstance(value, str):
        raise SpecError(f"{where} is not a string")
    try:
        if cidr:
            if "/" not in value:
                raise ValueError(value)
            ipaddress.ip_interface(value)
        else:
            ipaddress.ip_address(value)
    except ValueError:
        want = "an address with a prefix length" if cidr else "an IP address"
        raise SpecError(f"{where} {value[:60]!r} is not {want}") from None
    return value


def _fields(
    obj: dict[str, Any], spec: tuple[tuple[str, str, bool], ...], v11: bool, where: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, kind, new in spec:
        if new and not v11:
            continue
        value = obj.get(key)
        if value is None or value in ("", []):
            if key in _ALWAYS:
                if kind == "cidr":
                    raise SpecError(f"{where}.{key} is missing")
                out[key] = ""
            continue
        if kind == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                raise SpecError(f"{where}.{key} is not an integer")
        elif kind == "strs":
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise SpecError(f"{where}.{key} is not a list of strings")
        elif kind in ("cidr", "ip"):
            _address(value, f"{where}.{key}", cidr=kind == "cidr")
        elif not isinstance(value, str):
            raise SpecError(f"{where}.{key} is not a string")
        out[key] = value
    return out


def _ip(obj: dict[str, Any], key: str, interfaces: int, where: str) -> dict[str, Any]:
    ip: dict[str, Any] = {"address": _address(obj.get(key), f"{where}.{key}", cidr=True)}
    gateway = obj.get("gateway")
    if gateway:
        ip["gateway"] = _address(gateway, f"{where}.gateway", cidr=False)
    index = obj.get("interface") if key == "address" else None
    # -1 is what some 0.3.0-era plugins wrote for "no interface": read as absent.
    if index is not None and index != -1:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < interfaces:
            raise SpecError(f"{where}.interface {str(index)[:24]} is not an index into interfaces")
        ip["interface"] = index
    return ip


def _read_legacy(
    result: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ips: list[dict[str, Any]] = []
    routes: list[dict[str, Any]] = []
    for key in ("ip4", "ip6"):
        block = result.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise SpecError(f"{key} is not an object")
        ips.append(_ip(block, "ip", 0, key))
        routes += [
            _fields(o, _ROUTE, False, f"{key}.routes[{i}]")
            for i, o in enumerate(_objects(block, "routes"))
        ]
    return ips, routes


def _write_legacy(
    ips: list[dict[str, Any]], routes: list[dict[str, Any]], dns: dict[str, Any], version: str
) -> dict[str, Any]:
    out: dict[str, Any] = {"cniVersion": version}
    blocks: dict[int, dict[str, Any]] = {}
    for ip in ips:
        family = 6 if ":" in ip["address"] else 4
        if family not in blocks:  # the legacy shape carries one address per family
            blocks[family] = {"ip": ip["address"]}
            if ip.get("gateway"):
                blocks[family]["gateway"] = ip["gateway"]
    for route in routes:
        block = blocks.get(6 if ":" in route["dst"] else 4)
        if block is not None:
            block.setdefault("routes", []).append(_fields(route, _ROUTE, False, "routes"))
    for family, key in ((4, "ip4"), (6, "ip6")):
        if family in blocks:
            out[key] = blocks[family]
    out["dns"] = dns
    return out

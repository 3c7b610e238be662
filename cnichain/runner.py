"""cni-chain: run a .conflist the way libcni does (containerd, CRI-O and podman use libcni).

A thin command line over cnichain.api. What it does per verb, its options and the
friendly flags: docs/cni-contract.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence

from cnichain import spec as cnispec
from cnichain.api import (
    DEFAULT_CACHE_DIR,
    DEFAULT_CONF_DIR,
    ChainError,
    ConfList,
    Runtime,
    add,
    cached_attachments,
    check,
    default_plugin_path,
    delete,
    derived_container_id,
    find_plugin,
    gc,
    plugin_config,
    retyped,
    status,
    version_info,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The chain's machinery lives in cnichain.api; these stay importable from here.
__all__ = [
    "ChainError",
    "ConfList",
    "Runtime",
    "add",
    "find_plugin",
    "main",
    "plugin_config",
    "retyped",
]


# ---------------------------------------------------------------------------- friendly flags

_PORT = re.compile(
    r"^(?:(?P<ip>\[[0-9a-fA-F:.]+\]|[0-9.]+):)?(?P<host>\d+)(?:-(?P<end>\d+))?"
    r":(?P<ctr>\d+)(?:/(?P<proto>[a-zA-Z]+))?$"
)
_RATE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[kmgt]?)(?:bit|bps|b)?$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_port(spec: str) -> dict[str, Any]:
    """'[HOSTIP:]HOSTPORT[-END]:CONTAINERPORT[/PROTO]' -> a portMappings entry."""
    m = _PORT.match(spec)
    if not m:
        raise ChainError(f"--port {spec!r}: expected [HOSTIP:]HOSTPORT[-END]:CONTAINERPORT[/PROTO]")
    mapping: dict[str, Any] = {
        "hostPort": int(m["host"]),
        "containerPort": int(m["ctr"]),
        "protocol": (m["proto"] or "tcp").lower(),
    }
    if m["ip"]:
        mapping["hostIP"] = m["ip"].strip("[]")
    if m["end"]:
        mapping["range"] = int(m["end"]) - int(m["host"]) + 1
    return mapping


def parse_rate(text: str) -> int:
    """'10mbit' / '10M' / '1500000' -> bits per second (decimal units, as tc reads them)."""
    m = _RATE.match(text.strip())
    if not m:
        raise ChainError(f"cannot read rate {text!r}: use e.g. 1500000, 800k, 10mbit, 1g")
    return int(float(m["n"]) * _UNITS[m["unit"].lower()])


def parse_bandwidth(spec: str) -> dict[str, int]:
    """'10mbit' (both directions) or 'ingressRate=10mbit,egressRate=5m,ingressBurst=...'."""
    parts = spec.split(",") if "=" in spec else [f"ingressRate={spec}", f"egressRate={spec}"]
    out: dict[str, int] = {}
    keys = {k.lower(): k for k in ("ingressRate", "ingressBurst", "egressRate", "egressBurst")}
    for part in parts:
        key, _, value = part.partition("=")
        if key.strip().lower() not in keys:
            raise ChainError(f"--bandwidth: unknown key {key!r}; use {', '.join(keys.values())}")
        out[keys[key.strip().lower()]] = parse_rate(value)
    for d in ("ingress", "egress"):
        if f"{d}Rate" in out and f"{d}Burst" not in out:
            # 20 ms worth, and never below 32 KiB
            out[f"{d}Burst"] = max(out[f"{d}Rate"] // 50, 32 * 1024 * 8)
    return out


def parse_valid(spec: str) -> dict[str, str]:
    """'CONTAINERID/IFNAME' (--valid) -> a cni.dev/valid-attachments entry."""
    cid, slash, ifname = spec.partition("/")
    if not slash:
        raise ChainError(
            f"--valid {spec[:80]!r}: expected CONTAINERID/IFNAME, e.g. {cid[:80]}/eth0"
        )
    try:
        cnispec.validate_container_id(cid)
        cnispec.validate_ifname(ifname)
    except cnispec.SpecError as e:
        raise ChainError(f"--valid {spec[:80]!r}: {e}") from None
    return {"containerID": cid, "ifname": ifname}


def package_version() -> str:
    """The installed cni-meta-plugins distribution's version."""
    from importlib import metadata

    try:
        return metadata.version("cni-meta-plugins")
    except metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cni-chain", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"cni-chain {package_version()}")
    p.add_argument("command", choices=["add", "check", "del", "gc", "status", "version"])
    p.add_argument("conflist", help=".conflist path or network name")
    p.add_argument("netns", nargs="?", default="", help="netns path or name under /run/netns")
    p.add_argument("--container-id", default="", help="default: derived from the netns path")
    p.add_argument("--ifname", default="eth0")
    p.add_argument(
        "--cni-path",
        default=os.pathsep.join(default_plugin_path()),
        help="plugin dirs, ':'-separated (default: $CNI_PATH, else this Python's scripts "
        "dir, where this package's plugins are, then /opt/cni/bin and /usr/lib/cni)",
    )
    p.add_argument("--conf-dir", default=os.environ.get("NETCONFPATH") or DEFAULT_CONF_DIR)
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    p.add_argument("--cni-args", default="", help="CNI_ARGS, e.g. 'IgnoreUnknown=1;MAC=...'")
    p.add_argument("--runtime-config", default="", help="capability args as a JSON object")
    p.add_argument("--port", action="append", default=[], help="[HOSTIP:]HOST[-END]:CTR[/PROTO]")
    p.add_argument("--bandwidth", default="", help="RATE, or ingressRate=..,egressRate=..")
    p.add_argument("--mac", default="", help="runtimeConfig.mac for the container interface")
    p.add_argument("--valid", action="append", default=None, help="gc: CONTAINERID/IFNAME alive")
    return p


def capability_args(
    ports: Sequence[str] = (),
    bandwidth: str = "",
    mac: str = "",
    base: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The runtime config that --port, --bandwidth and --mac describe, over `base`
    (--runtime-config's): mappings are added to its portMappings."""
    caps = dict(base or {})
    if ports:
        caps["portMappings"] = [*caps.get("portMappings", []), *(parse_port(p) for p in ports)]
    if bandwidth:
        caps["bandwidth"] = parse_bandwidth(bandwidth)
    if mac:
        caps["mac"] = mac
    return caps


def runtime_from_args(a: argparse.Namespace) -> Runtime:
    base: dict[str, Any] = {}
    if a.runtime_config:
        try:
            base = json.loads(a.runtime_config)
        except ValueError as e:
            raise ChainError(f"--runtime-config is not JSON: {e}") from None
        if not isinstance(base, dict):
            raise ChainError("--runtime-config must be a JSON object")
    caps = capability_args(a.port or (), a.bandwidth or "", a.mac or "", base)
    netns = a.netns
    if netns and "/" not in netns:
        netns = os.path.join("/run/netns", netns)
    cid = a.container_id or derived_container_id(netns)
    try:
        cnispec.validate_container_id(cid)
        cnispec.validate_ifname(a.ifname)
    except cnispec.SpecError as e:
        raise ChainError(str(e)) from None
    return Runtime(cid, netns, caps, a.ifname, a.cni_args, a.cni_path, a.cache_dir)


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        conflist = ConfList.load(a.conflist, a.conf_dir)
        rt = runtime_from_args(a)
        if a.command in ("add", "check") and not rt.netns:
            raise ChainError(f"{a.command} needs a NETNS")
        if a.command == "add":
            print(json.dumps(add(conflist, rt), indent=2))
        elif a.command == "check":
            check(conflist, rt)
        elif a.command == "del":
            delete(conflist, rt)
        elif a.command == "gc":
            valid = (
                [parse_valid(v) for v in a.valid]
                if a.valid is not None
                else cached_attachments(conflist, rt.cache_dir)
            )
            gc(conflist, rt, valid)
        elif a.command == "status":
            status(conflist, rt)
        else:
            print(json.dumps(version_info(conflist, rt), indent=2))
    except ChainError as e:
        print(f"cni-chain: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

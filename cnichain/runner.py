"""cni-chain: run a .conflist the way libcni does (containerd, CRI-O and podman use libcni).

What it does per verb, its options and the friendly flags: docs/cni-contract.md.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import re
import subprocess
import sys

from common import versions
from common.env import validate_container_id, validate_ifname
from common.errors import CniError
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_CNI_PATH = "/opt/cni/bin:/usr/lib/cni"
DEFAULT_CACHE_DIR = "/var/lib/cni/cni-chain"
DEFAULT_CONF_DIR = "/etc/cni/net.d"


class ChainError(Exception):
    """A readable failure of the chain (bad list, missing plugin, a plugin's error)."""


class ConfList(Value):
    name: str
    cni_version: str
    plugins: list[dict[str, Any]]
    disable_check: bool = False

    @classmethod
    def load(cls, spec: str, conf_dir: str = DEFAULT_CONF_DIR) -> ConfList:
        path = (
            spec if os.path.sep in spec or os.path.exists(spec) else _find_by_name(spec, conf_dir)
        )
        try:
            with open(path, "rb") as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise ChainError(f"cannot read conflist {path}: {e}") from None
        return cls.from_json(raw, path)

    @classmethod
    def from_json(cls, raw: Any, where: str = "conflist") -> ConfList:
        if not isinstance(raw, dict):
            raise ChainError(f"{where}: a conflist must be a JSON object")
        name = raw.get("name")
        plugins = raw.get("plugins")
        if not isinstance(name, str) or not name:
            raise ChainError(f"{where}: the conflist has no 'name'")
        if not isinstance(plugins, list) or not plugins:
            raise ChainError(f"{where}: the conflist has no 'plugins'")
        for i, p in enumerate(plugins):
            if not isinstance(p, dict) or not isinstance(p.get("type"), str) or not p["type"]:
                raise ChainError(f"{where}: plugins[{i}] needs a 'type'")
        version = raw.get("cniVersion") or versions.DEFAULT_VERSION
        return cls(name, str(version), plugins, bool(raw.get("disableCheck")))


def _find_by_name(name: str, conf_dir: str) -> str:
    for path in sorted(glob.glob(os.path.join(conf_dir, "*.conflist"))):
        try:
            with open(path, "rb") as f:
                if json.load(f).get("name") == name:
                    return path
        except (OSError, ValueError, AttributeError):
            continue
    raise ChainError(f"no conflist named {name!r} in {conf_dir}")


class Runtime(Value):
    """What a runtime passes besides the list: the attachment and its arguments."""

    container_id: str
    netns: str
    capability_args: dict[str, Any]
    ifname: str = "eth0"
    cni_args: str = ""
    cni_path: str = DEFAULT_CNI_PATH
    cache_dir: str = DEFAULT_CACHE_DIR


def find_plugin(plugin_type: str, cni_path: str) -> str:
    if "/" in plugin_type:
        raise ChainError(f"plugin type {plugin_type!r} must be a plain name")
    for d in cni_path.split(os.pathsep):
        candidate = os.path.join(d, plugin_type)
        if d and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ChainError(f"failed to find plugin {plugin_type!r} in CNI_PATH {cni_path}")


def plugin_config(
    conflist: ConfList, plugin: dict[str, Any], rt: Runtime, prev_result: Any
) -> dict[str, Any]:
    """libcni's buildOneConfig: name, cniVersion, runtimeConfig by capability, prevResult."""
    conf = {**plugin, "name": conflist.name, "cniVersion": conflist.cni_version}
    caps = plugin.get("capabilities")
    if isinstance(caps, dict):
        rc = {k: rt.capability_args[k] for k, on in caps.items() if on and k in rt.capability_args}
        if rc:
            conf["runtimeConfig"] = rc
    if prev_result is not None:
        conf["prevResult"] = prev_result
    return conf


def exec_plugin(
    command: str, conf: dict[str, Any], rt: Runtime, index: int
) -> dict[str, Any] | None:
    path = find_plugin(str(conf["type"]), rt.cni_path)
    env = dict(os.environ)
    env.update(
        CNI_COMMAND=command,
        CNI_CONTAINERID=rt.container_id,
        CNI_NETNS=rt.netns,
        CNI_IFNAME=rt.ifname,
        CNI_ARGS=rt.cni_args,
        CNI_PATH=rt.cni_path,
    )
    proc = subprocess.run(
        [path], input=json.dumps(conf).encode(), env=env, capture_output=True, check=False
    )
    where = f"plugin #{index + 1} {conf['type']!r}"
    if proc.returncode != 0:
        try:
            err = json.loads(proc.stdout)
        except ValueError:
            err = None
        if isinstance(err, dict) and "code" in err:
            detail = f": {err['details']}" if err.get("details") else ""
            raise ChainError(
                f"{command} failed at {where}: [{err['code']}] {err.get('msg', '')}{detail}"
            )
        text = (proc.stderr or proc.stdout).decode(errors="replace").strip()
        raise ChainError(f"{command} failed at {where} (exit {proc.returncode}): {text}")
    if not proc.stdout.strip():
        return None
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        raise ChainError(f"{command}: {where} printed something that is not JSON") from None
    return out if isinstance(out, dict) else None


def retyped(result: dict[str, Any] | None, list_version: str) -> dict[str, Any] | None:
    """A plugin's result as libcni passes it on: parsed in its own version, re-marshalled.

    libcni decodes each result into its version's types and encodes it again for the next
    plugin; doing the same keeps what the plugins see identical (e.g. "dns": {} appears).
    """
    if result is None:
        return None
    from common.result import Result

    version = result.get("cniVersion")
    if not isinstance(version, str) or version not in versions.SUPPORTED_VERSIONS:
        version = list_version
    try:
        return Result.from_json(result, version).to_json(version)
    except CniError as e:
        raise ChainError(f"a plugin returned a result that is not valid {version}: {e}") from None


def _cache_file(conflist: ConfList, rt: Runtime) -> str:
    return os.path.join(rt.cache_dir, f"{conflist.name}-{rt.container_id}-{rt.ifname}")


def _require(conflist: ConfList, command: str, version: str) -> None:
    if not versions.at_least(conflist.cni_version, version):
        raise ChainError(
            f"{command} needs cniVersion {version} or later, the list has {conflist.cni_version}"
        )


def add(conflist: ConfList, rt: Runtime) -> dict[str, Any] | None:
    result: dict[str, Any] | None = None
    for i, plugin in enumerate(conflist.plugins):
        out = exec_plugin("ADD", plugin_config(conflist, plugin, rt, result), rt, i)
        result = retyped(out, conflist.cni_version)
    os.makedirs(rt.cache_dir, mode=0o700, exist_ok=True)
    cache = {
        "kind": "cniChainCacheV1",
        "containerId": rt.container_id,
        "ifName": rt.ifname,
        "networkName": conflist.name,
        "netns": rt.netns,
        "cniArgs": rt.cni_args,
        "capabilityArgs": rt.capability_args,
        "result": result,
    }
    tmp = _cache_file(conflist, rt) + ".tmp"
    # A leftover (or planted) .tmp is replaced, never followed: no symlink makes us
    # truncate another file.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(tmp, flags, 0o600), "w") as f:
        json.dump(cache, f)
    os.rename(tmp, _cache_file(conflist, rt))
    return result


def _cached_result(conflist: ConfList, rt: Runtime) -> Any:
    """The result ADD cached; the arguments ADD had fill those this call leaves empty."""
    try:
        with open(_cache_file(conflist, rt), "rb") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict):
        return None
    if not rt.capability_args and isinstance(cached.get("capabilityArgs"), dict):
        rt.capability_args = cached["capabilityArgs"]
    if not rt.cni_args and isinstance(cached.get("cniArgs"), str):
        rt.cni_args = cached["cniArgs"]
    return cached.get("result")


def check(conflist: ConfList, rt: Runtime) -> None:
    _require(conflist, "CHECK", "0.4.0")
    if conflist.disable_check:
        return
    cached = _cached_result(conflist, rt)
    if cached is None:
        raise ChainError(f"no cached result for {conflist.name}/{rt.container_id}/{rt.ifname}")
    for i, plugin in enumerate(conflist.plugins):
        exec_plugin("CHECK", plugin_config(conflist, plugin, rt, cached), rt, i)


def delete(conflist: ConfList, rt: Runtime) -> None:
    cached = _cached_result(conflist, rt)
    if not versions.at_least(conflist.cni_version, "0.4.0"):
        cached = None
    for i in reversed(range(len(conflist.plugins))):
        conf = plugin_config(conflist, conflist.plugins[i], rt, cached)
        exec_plugin("DEL", conf, rt, i)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_cache_file(conflist, rt))


def cached_attachments(conflist: ConfList, cache_dir: str) -> list[dict[str, str]]:
    out = []
    for path in sorted(glob.glob(os.path.join(cache_dir, f"{conflist.name}-*"))):
        try:
            with open(path, "rb") as f:
                c = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(c, dict) and c.get("networkName") == conflist.name:
            out.append({"containerID": c.get("containerId", ""), "ifname": c.get("ifName", "")})
    return out


def gc(conflist: ConfList, rt: Runtime, valid: list[dict[str, str]]) -> None:
    _each_plugin(conflist, rt, "GC", {"cni.dev/valid-attachments": valid})


def status(conflist: ConfList, rt: Runtime) -> None:
    _each_plugin(conflist, rt, "STATUS", {})


def _each_plugin(conflist: ConfList, rt: Runtime, command: str, extra: dict[str, Any]) -> None:
    """GC and STATUS (from cniVersion 1.1.0): every plugin in order, no prevResult."""
    _require(conflist, command, "1.1.0")
    for i, plugin in enumerate(conflist.plugins):
        conf = {**plugin_config(conflist, plugin, rt, None), **extra}
        exec_plugin(command, conf, rt, i)


def version_info(conflist: ConfList, rt: Runtime) -> dict[str, Any]:
    out = {}
    for i, plugin in enumerate(conflist.plugins):
        conf = {"cniVersion": conflist.cni_version, "type": plugin["type"]}
        out[str(plugin["type"])] = exec_plugin("VERSION", conf, rt, i)
    return out


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
        validate_container_id(cid, "container ID in --valid")
        validate_ifname(ifname, "interface name in --valid")
    except CniError as e:
        raise ChainError(f"--valid {spec[:80]!r}: {e}") from None
    return {"containerID": cid, "ifname": ifname}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cni-chain", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["add", "check", "del", "gc", "status", "version"])
    p.add_argument("conflist", help=".conflist path or network name")
    p.add_argument("netns", nargs="?", default="", help="netns path or name under /run/netns")
    p.add_argument("--container-id", default="", help="default: derived from the netns path")
    p.add_argument("--ifname", default="eth0")
    p.add_argument("--cni-path", default=os.environ.get("CNI_PATH") or DEFAULT_CNI_PATH)
    p.add_argument("--conf-dir", default=os.environ.get("NETCONFPATH") or DEFAULT_CONF_DIR)
    p.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    p.add_argument("--cni-args", default="", help="CNI_ARGS, e.g. 'IgnoreUnknown=1;MAC=...'")
    p.add_argument("--runtime-config", default="", help="capability args as a JSON object")
    p.add_argument("--port", action="append", default=[], help="[HOSTIP:]HOST[-END]:CTR[/PROTO]")
    p.add_argument("--bandwidth", default="", help="RATE, or ingressRate=..,egressRate=..")
    p.add_argument("--mac", default="", help="runtimeConfig.mac for the container interface")
    p.add_argument("--valid", action="append", default=None, help="gc: CONTAINERID/IFNAME alive")
    return p


def runtime_from_args(a: argparse.Namespace) -> Runtime:
    caps: dict[str, Any] = {}
    if a.runtime_config:
        try:
            caps = json.loads(a.runtime_config)
        except ValueError as e:
            raise ChainError(f"--runtime-config is not JSON: {e}") from None
        if not isinstance(caps, dict):
            raise ChainError("--runtime-config must be a JSON object")
    if a.port:
        caps.setdefault("portMappings", []).extend(parse_port(s) for s in a.port)
    if a.bandwidth:
        caps["bandwidth"] = parse_bandwidth(a.bandwidth)
    if a.mac:
        caps["mac"] = a.mac
    netns = a.netns
    if netns and "/" not in netns:
        netns = os.path.join("/run/netns", netns)
    cid = a.container_id or "cnichain-" + hashlib.sha512(netns.encode()).hexdigest()[:20]
    try:
        validate_container_id(cid, "--container-id")
        validate_ifname(a.ifname, "--ifname")
    except CniError as e:
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

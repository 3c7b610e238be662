"""Running our plugins, the Go ones and whole conflists the way a runtime would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.netns import Netns

REPO = Path(__file__).resolve().parents[2]
CONFLISTS = REPO / "conflists"
OUR_BIN = Path(sys.executable).parent  # the venv's bin: portmap, bandwidth, tuning, cni-chain
GO_BIN = Path("/usr/lib/cni")


def our(plugin: str) -> str:
    return str(OUR_BIN / plugin)


def go(plugin: str) -> str:
    return str(GO_BIN / plugin)


@dataclass
class PluginRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout) if self.stdout.strip() else None

    def ok(self) -> PluginRun:
        assert self.returncode == 0, f"plugin failed: {self.stdout} {self.stderr}"
        return self


@dataclass(frozen=True)
class Invocation:
    """Everything to exec one plugin call as a runtime does: argv (inside a host netns
    through `ip netns exec`, which execs the plugin in place: the pid is the plugin's),
    the environment and stdin."""

    argv: list[str]
    env: dict[str, str]
    stdin: bytes


def invocation(
    exe: str,
    command: str,
    conf: dict[str, Any] | str | bytes | None,
    *,
    host: Netns | None = None,
    container_id: str = "ctr1",
    ifname: str = "eth0",
    netns: str = "",
    cni_args: str = "",
    env: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
) -> Invocation:
    """One plugin call (inside `host` when given), not yet run."""
    full = dict(os.environ)
    full.update(
        CNI_COMMAND=command,
        CNI_CONTAINERID=container_id,
        CNI_IFNAME=ifname,
        CNI_NETNS=netns,
        CNI_PATH=f"{OUR_BIN}:{GO_BIN}",
        CNI_ARGS=cni_args,
    )
    full.update(env or {})
    for var in drop:
        full.pop(var, None)
    if conf is None:
        data = b""
    elif isinstance(conf, bytes):
        data = conf
    elif isinstance(conf, str):
        data = conf.encode()
    else:
        data = json.dumps(conf).encode()
    argv = ["ip", "netns", "exec", host.name, exe] if host else [exe]
    return Invocation(argv, full, data)


def run(inv: Invocation, timeout: float | None = None) -> PluginRun:
    proc = subprocess.run(
        inv.argv, input=inv.stdin, env=inv.env, capture_output=True, check=False, timeout=timeout
    )
    return PluginRun(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def run_plugin(
    exe: str,
    command: str,
    conf: dict[str, Any] | str | bytes | None,
    *,
    host: Netns | None = None,
    container_id: str = "ctr1",
    ifname: str = "eth0",
    netns: str = "",
    cni_args: str = "",
    env: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
) -> PluginRun:
    """Exec one plugin as a runtime does (inside `host` when given)."""
    call = invocation(exe, command, conf, host=host, container_id=container_id, ifname=ifname,
                      netns=netns, cni_args=cni_args, env=env, drop=drop)  # fmt: skip
    return run(call)


def load_conflist(name: str, workdir: Path, **overrides: Any) -> Path:
    """Copy conflists/<name> into workdir with host-local's dataDir inside workdir.

    host-local and flatnet-ipam keep their leases under /var/lib/cni/networks by default:
    tests must not.
    """
    raw = json.loads((CONFLISTS / name).read_text())
    raw.update(overrides)
    for plugin in raw["plugins"]:
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and ipam.get("type") in ("host-local", "flatnet-ipam"):
            ipam["dataDir"] = str(workdir / "host-local")
    out = workdir / name
    out.write_text(json.dumps(raw, indent=2))
    return out


@dataclass
class Chain:
    """cni-chain bound to one host netns, one cache dir and one state root."""

    host: Netns
    workdir: Path
    cni_path: str = f"{OUR_BIN}:{GO_BIN}"
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, check: bool = True) -> PluginRun:
        argv = [
            "ip", "netns", "exec", self.host.name, str(OUR_BIN / "cni-chain"), *args,
            "--cni-path", self.cni_path, "--cache-dir", str(self.workdir / "cache"),
        ]  # fmt: skip
        full = {**os.environ, **self.env}
        proc = subprocess.run(argv, env=full, capture_output=True, check=False)
        run = PluginRun(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
        if check:
            assert run.returncode == 0, f"cni-chain {' '.join(args)} failed: {run.stderr}"
        return run

    def add(self, conflist: Path, ctr: Netns, *flags: str) -> dict[str, Any]:
        result: dict[str, Any] = self.run("add", str(conflist), ctr.path, *flags).json
        return result

    def delete(self, conflist: Path, ctr: Netns | None, *flags: str) -> PluginRun:
        return self.run("del", str(conflist), ctr.path if ctr else "", *flags)

    def check(self, conflist: Path, ctr: Netns, *flags: str, ok: bool = True) -> PluginRun:
        return self.run("check", str(conflist), ctr.path, *flags, check=ok)


def container_address(result: dict[str, Any], family: int = 4) -> str:
    for ip in result.get("ips", []):
        addr = ip["address"].split("/")[0]
        if (":" in addr) == (family == 6):
            return str(addr)
    raise AssertionError(f"no IPv{family} address in {result}")

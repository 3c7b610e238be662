"""Running our plugins, the Go ones and whole conflists the way a runtime would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec

from cnichain.api import PluginCall, plugin_call
from tests.harness.netns import Netns

REPO = Path(__file__).resolve().parents[2]
CONFLISTS = REPO / "conflists"
OUR_BIN = Path(sys.executable).parent  # the venv's bin: portmap, bandwidth, tuning, cni-chain
GO_BIN = Path("/usr/lib/cni")
P = ParamSpec("P")


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


# One plugin call as a runtime makes it, not yet run: cnichain's, the API users call.
Invocation = PluginCall


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
    """One plugin call (inside `host` when given), not yet run: cnichain.api.plugin_call's,
    with our plugins then the Go ones on CNI_PATH.

    The tests' one escape hatch from what a runtime would do: `env` wins over the CNI_*
    variables too (a test hands a plugin a broken one) and `drop` leaves variables out
    (a runtime that forgot one); `conf` may be any bytes. Killing a call, or stopping it
    at a crash point, starts the returned Invocation's argv itself (tests/harness/crash.py).
    """
    data = b"" if conf is None else conf.encode() if isinstance(conf, str) else conf
    call = plugin_call(
        exe,
        command,
        data,
        host=host.name if host else "",
        container_id=container_id,
        ifname=ifname,
        netns=netns,
        cni_args=cni_args,
        cni_path=f"{OUR_BIN}:{GO_BIN}",
        env=env,
    )
    call.env.update(env or {})
    for var in drop:
        call.env.pop(var, None)
    return call


def run(inv: Invocation, timeout: float = 120) -> PluginRun:
    """Exec the call and wait (a plugin still running after `timeout` seconds hangs:
    TimeoutExpired)."""
    proc = inv.run(timeout)
    return PluginRun(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def _and_run(build: Callable[P, Invocation]) -> Callable[P, PluginRun]:
    def run_it(*args: P.args, **kwargs: P.kwargs) -> PluginRun:
        return run(build(*args, **kwargs))

    run_it.__doc__ = "Exec one plugin as a runtime does: `invocation`'s arguments, then `run`."
    return run_it


run_plugin = _and_run(invocation)


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

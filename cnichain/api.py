"""Run a CNI network configuration list from Python, the way libcni does.

libcni is the Go library containerd, CRI-O and podman use to call CNI plugins. This module
does what it does, for any CNI plugin (the Go reference plugins, ours, a third party's):

    from cnichain import Network

    net = Network.load("mynet", plugin_path=["/opt/cni/bin"], conf_dir="/etc/cni/net.d")
    with net.attach("ctr-1", "/run/netns/ctr1", capability_args={"portMappings": [...]}) as a:
        print(a.result["ips"])          # the chain's result; DEL runs when the block ends

What each verb sends each plugin (environment, stdin) is libcni's:

* ADD runs the plugins in order; each gets the list's `name` and `cniVersion`, a
  `runtimeConfig` holding the capability arguments it declares in `capabilities`, and the
  previous plugin's result (re-marshalled in its version, as libcni does) as `prevResult`.
  The final result is cached per attachment (network name, container ID, interface).
* CHECK (cniVersion 0.4.0 or later, unless the list says `disableCheck`) runs them in order
  with the cached result as `prevResult`.
* DEL runs them in reverse order, with the cached result as `prevResult` from 0.4.0 on, and
  the capability and CNI arguments ADD had when this call gives none; then drops the cache.
* GC and STATUS (cniVersion 1.1.0) run every plugin in order without `prevResult`; GC adds
  `cni.dev/valid-attachments`.
* VERSION asks each plugin which versions it speaks.

Every plugin is exec'd with the caller's environment plus CNI_COMMAND, CNI_CONTAINERID,
CNI_NETNS, CNI_IFNAME, CNI_ARGS and CNI_PATH. When a `host` namespace is given, the plugin
runs inside it (through `ip netns exec`), as if the runtime itself lived there: that is how
tests keep the machine's own namespace untouched.

A plugin that fails raises `PluginError`, which carries the plugin's CNI error (`code`,
`msg`, `details`) and which plugin it was; anything else wrong with the list or the call
raises `ChainError` (its base class).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import os
import subprocess
import sysconfig
from collections.abc import Mapping, Sequence
from typing import Any

from cnichain import spec

DEFAULT_CNI_PATH = "/opt/cni/bin:/usr/lib/cni"
DEFAULT_CACHE_DIR = "/var/lib/cni/cni-chain"
DEFAULT_CONF_DIR = "/etc/cni/net.d"

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_CONF_DIR",
    "Attachment",
    "ChainError",
    "ConfList",
    "Network",
    "PluginCall",
    "PluginError",
    "default_plugin_path",
    "derived_container_id",
    "load_conflist",
    "plugin_call",
]


class ChainError(Exception):
    """A readable failure of the chain: a bad list, a missing plugin, a plugin's error."""


class PluginError(ChainError):
    """A plugin of the list failed.

    `command` is the verb (ADD, CHECK, DEL, GC, STATUS, VERSION); `plugin` the plugin's
    type and `index` its position in the list (0-based). When the plugin printed a CNI
    error, `code`, `msg` and `details` are that error's fields; otherwise `code` is None
    and `msg` holds what it printed. `exit_code` and `stderr` are the process's.
    """

    def __init__(
        self,
        command: str,
        plugin: str,
        index: int,
        code: int | None,
        msg: str,
        details: str = "",
        exit_code: int = 1,
        stderr: str = "",
    ) -> None:
        self.command = command
        self.plugin = plugin
        self.index = index
        self.code = code
        self.msg = msg
        self.details = details
        self.exit_code = exit_code
        self.stderr = stderr
        where = f"plugin #{index + 1} {plugin!r}"
        if code is None:
            text = f"{command} failed at {where} (exit {exit_code}): {msg}"
        else:
            detail = f": {details}" if details else ""
            text = f"{command} failed at {where}: [{code}] {msg}{detail}"
        super().__init__(text)


# ---------------------------------------------------------------------------- the list


@dataclasses.dataclass
class ConfList:
    """A parsed network configuration list (what libcni calls NetworkConfigList)."""

    name: str
    cni_version: str
    plugins: list[dict[str, Any]]
    disable_check: bool = False

    def replace(self, **changes: Any) -> ConfList:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def load(cls, spec: str, conf_dir: str = DEFAULT_CONF_DIR) -> ConfList:
        """A file path, or the name of a network in `conf_dir` (see `load_conflist`)."""
        if os.path.sep in spec or os.path.exists(spec):
            path = spec
        else:
            path = _find_by_name(spec, conf_dir)
        try:
            with open(path, "rb") as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise ChainError(f"cannot read conflist {path}: {e}") from None
        return cls.from_json(raw, path)

    @classmethod
    def from_json(cls, raw: Any, where: str = "conflist") -> ConfList:
        """A conflist object; a single plugin config (no `plugins`) becomes a list of one,
        as libcni's ConfListFromConf does."""
        if not isinstance(raw, dict):
            raise ChainError(f"{where}: a conflist must be a JSON object")
        if "plugins" not in raw and isinstance(raw.get("type"), str):
            raw = {
                "cniVersion": raw.get("cniVersion"),
                "name": raw.get("name"),
                "plugins": [raw],
            }
        name = raw.get("name")
        plugins = raw.get("plugins")
        if not isinstance(name, str) or not name:
            raise ChainError(f"{where}: the conflist has no 'name'")
        if not isinstance(plugins, list) or not plugins:
            raise ChainError(f"{where}: the conflist has no 'plugins'")
        for i, p in enumerate(plugins):
            if not isinstance(p, dict) or not isinstance(p.get("type"), str) or not p["type"]:
                raise ChainError(f"{where}: plugins[{i}] needs a 'type'")
        version = raw.get("cniVersion") or spec.DEFAULT_VERSION
        return cls(name, str(version), plugins, bool(raw.get("disableCheck")))


def _find_by_name(name: str, conf_dir: str) -> str:
    """libcni's LoadConfList: the first *.conflist (by file name) whose network is `name`,
    then the first single plugin config (*.conf, *.json) of that name."""
    for patterns in (("*.conflist",), ("*.conf", "*.json")):
        paths = sorted(p for pat in patterns for p in glob.glob(os.path.join(conf_dir, pat)))
        for path in paths:
            try:
                with open(path, "rb") as f:
                    if json.load(f).get("name") == name:
                        return path
            except (OSError, ValueError, AttributeError):
                continue
    raise ChainError(f"no conflist named {name!r} in {conf_dir}")


def load_conflist(
    source: str | os.PathLike[str] | Mapping[str, Any], conf_dir: str = DEFAULT_CONF_DIR
) -> ConfList:
    """Parse a network list from a dict, a file, or a network name in `conf_dir`.

    A name is looked up as libcni's LoadConfList does: the `*.conflist` files of `conf_dir`
    in file-name order, then its single-plugin `*.conf` and `*.json` files (turned into a
    list of one plugin). Raises ChainError when nothing fits or the list is malformed.
    """
    if isinstance(source, Mapping):
        return ConfList.from_json(dict(source), "conflist")
    return ConfList.load(os.fspath(source), conf_dir)


def default_plugin_path() -> list[str]:
    """Where plugins are looked for when the caller names no path.

    $CNI_PATH when set; else this Python's scripts directory (where pip installs this
    package's portmap, bandwidth and tuning), then /opt/cni/bin and /usr/lib/cni (the Go
    reference plugins of upstream releases and of Debian/Ubuntu's package). The API and
    `cni-chain` both default to it, so both run this package's plugins first.
    """
    env = os.environ.get("CNI_PATH")
    if env:
        return [d for d in env.split(os.pathsep) if d]
    return [sysconfig.get_path("scripts"), *DEFAULT_CNI_PATH.split(os.pathsep)]


# ---------------------------------------------------------------------------- one call


@dataclasses.dataclass
class Runtime:
    """What a runtime passes besides the list: the attachment and its arguments.

    `env` is added to the caller's environment for every plugin; `host` names a network
    namespace (under /run/netns) in which the plugins run, empty for the caller's own.
    """

    container_id: str
    netns: str
    capability_args: dict[str, Any]
    ifname: str = "eth0"
    cni_args: str = ""
    cni_path: str = dataclasses.field(
        default_factory=lambda: os.pathsep.join(default_plugin_path())
    )
    cache_dir: str = DEFAULT_CACHE_DIR
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    host: str = ""


def derived_container_id(netns: str) -> str:
    """The container ID `cni-chain` uses when it is given none: one per netns path (as
    CNI_NETNS gets it), so the ADD, CHECK and DEL of one container name the same attachment."""
    return "cnichain-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


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


@dataclasses.dataclass(frozen=True)
class PluginCall:
    """One plugin exec as a runtime makes it, not yet run: `argv` (through `ip netns exec`
    when a host namespace is named), the whole environment `env` and the bytes of `stdin`.

    `run()` execs it and hands back what the plugin did, unjudged; the fields are there
    for what a plugin's own tests do beyond that (start it with Popen and signal it, edit
    a variable the way a buggy runtime would)."""

    argv: list[str]
    env: dict[str, str]
    stdin: bytes

    def run(self, timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
        """Exec the plugin and wait: its exit status, stdout and stderr as they are (a
        failing plugin raises nothing here; `TimeoutExpired` after `timeout` seconds)."""
        return subprocess.run(
            self.argv,
            input=self.stdin,
            env=self.env,
            capture_output=True,
            check=False,
            timeout=timeout,
        )


def plugin_call(
    plugin: str | os.PathLike[str],
    command: str,
    stdin: Mapping[str, Any] | bytes,
    *,
    container_id: str = "",
    netns: str = "",
    ifname: str = "eth0",
    cni_args: str = "",
    cni_path: str | None = None,
    host: str = "",
    env: Mapping[str, str] | None = None,
) -> PluginCall:
    """One call of one plugin, exactly as the chain's verbs make each of theirs.

    `plugin` is an executable's path, or a plugin type looked up in `cni_path` (a
    ':'-separated list of dirs, passed on as CNI_PATH; default `default_plugin_path()`).
    `stdin` is the config (a mapping, sent as JSON) or the bytes to send as they are.
    The environment is the caller's plus `env`, then CNI_COMMAND, CNI_CONTAINERID,
    CNI_NETNS, CNI_IFNAME, CNI_ARGS and CNI_PATH from the arguments. `host` names a
    namespace under /run/netns the plugin runs in, empty for the caller's own.
    """
    path = cni_path if cni_path is not None else os.pathsep.join(default_plugin_path())
    exe = os.fspath(plugin)
    if "/" not in exe:
        exe = find_plugin(exe, path)
    full = {**os.environ, **(env or {})}
    full.update(
        CNI_COMMAND=command,
        CNI_CONTAINERID=container_id,
        CNI_NETNS=netns,
        CNI_IFNAME=ifname,
        CNI_ARGS=cni_args,
        CNI_PATH=path,
    )
    data = stdin if isinstance(stdin, bytes) else json.dumps(stdin).encode()
    # `ip netns exec` execs the plugin in place, in the host namespace (and with /sys of
    # that namespace mounted, which plugins reading /sys/class/net rely on).
    argv = ["ip", "netns", "exec", host, exe] if host else [exe]
    return PluginCall(argv, full, data)


def exec_plugin(
    command: str, conf: dict[str, Any], rt: Runtime, index: int
) -> dict[str, Any] | None:
    """Exec one plugin as libcni does; its parsed stdout, or PluginError."""
    proc = plugin_call(
        find_plugin(str(conf["type"]), rt.cni_path),
        command,
        conf,
        container_id=rt.container_id,
        netns=rt.netns,
        ifname=rt.ifname,
        cni_args=rt.cni_args,
        cni_path=rt.cni_path,
        host=rt.host,
        env=rt.env,
    ).run()
    plugin = str(conf["type"])
    stderr = proc.stderr.decode(errors="replace").strip()
    if proc.returncode != 0:
        try:
            err = json.loads(proc.stdout)
        except ValueError:
            err = None
        if isinstance(err, dict) and "code" in err:
            code = err["code"]
            raise PluginError(
                command,
                plugin,
                index,
                code if isinstance(code, int) else None,
                str(err.get("msg", "")),
                str(err.get("details") or ""),
                proc.returncode,
                stderr,
            )
        text = stderr or proc.stdout.decode(errors="replace").strip()
        raise PluginError(command, plugin, index, None, text, "", proc.returncode, stderr)
    if not proc.stdout.strip():
        return None
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        raise ChainError(
            f"{command}: plugin #{index + 1} {plugin!r} printed something that is not JSON"
        ) from None
    return out if isinstance(out, dict) else None


def retyped(result: dict[str, Any] | None, list_version: str) -> dict[str, Any] | None:
    """A plugin's result as libcni passes it on: parsed in its own version, re-marshalled.

    libcni decodes each result into its version's types and encodes it again for the next
    plugin; doing the same keeps what the plugins see identical (e.g. "dns": {} appears).
    """
    if result is None:
        return None
    version = result.get("cniVersion")
    if not isinstance(version, str) or version not in spec.SUPPORTED_VERSIONS:
        version = list_version
    try:
        return spec.remarshal(result, version)
    except spec.SpecError as e:
        raise ChainError(f"a plugin returned a result that is not valid {version}: {e}") from None


def _cache_file(conflist: ConfList, rt: Runtime) -> str:
    """The attachment's cache file, after libcni's checks of the three names it is made of
    (which also keep it inside the cache dir: none may hold a '/' or be '..')."""
    validate_attachment(conflist.name, rt.container_id, rt.ifname)
    return os.path.join(rt.cache_dir, f"{conflist.name}-{rt.container_id}-{rt.ifname}")


def validate_attachment(network: str, container_id: str, ifname: str) -> None:
    """libcni's ValidateNetworkName, ValidateContainerID and ValidateInterfaceName:
    ChainError naming the first that fails. ADD, CHECK and DEL run them before any plugin."""
    try:
        spec.validate_network_name(network)
        spec.validate_container_id(container_id)
        spec.validate_ifname(ifname)
    except spec.SpecError as e:
        raise ChainError(str(e)) from None


def _require(conflist: ConfList, command: str, version: str) -> None:
    if not spec.at_least(conflist.cni_version, version):
        raise ChainError(
            f"{command} needs cniVersion {version} or later, the list has {conflist.cni_version}"
        )


def add(conflist: ConfList, rt: Runtime) -> dict[str, Any] | None:
    cache_file = _cache_file(conflist, rt)
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
    tmp = cache_file + ".tmp"
    # A leftover (or planted) .tmp is replaced, never followed: no symlink makes us
    # truncate another file.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(tmp, flags, 0o600), "w") as f:
        json.dump(cache, f)
    os.rename(tmp, cache_file)
    return result


def _cached_result(conflist: ConfList, rt: Runtime) -> Any:
    """The result ADD cached; the arguments ADD had fill those this call leaves empty."""
    path = _cache_file(conflist, rt)
    try:
        with open(path, "rb") as f:
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
    if not spec.at_least(conflist.cni_version, "0.4.0"):
        cached = None
    for i in reversed(range(len(conflist.plugins))):
        conf = plugin_config(conflist, conflist.plugins[i], rt, cached)
        exec_plugin("DEL", conf, rt, i)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_cache_file(conflist, rt))


def cached_attachments(conflist: ConfList, cache_dir: str) -> list[dict[str, str]]:
    try:
        spec.validate_network_name(conflist.name)
    except spec.SpecError as e:
        raise ChainError(str(e)) from None
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


# ---------------------------------------------------------------------------- the API


@dataclasses.dataclass
class Attachment:
    """One container attached to a network: the chain's result and how to find it again.

    What `Network.attach` and `ChainLab.attach` return, after ADD. `delete()` DELs it; used
    as a context manager (`with net.attach(...) as att:`) it DELs when the block ends.
    """

    network: Network
    container_id: str
    netns: str
    ifname: str
    result: dict[str, Any]
    capability_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    cni_args: str = ""

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, _type: object, exc: BaseException | None, _tb: object) -> None:
        """DEL at the end of a `with` block. A DEL that fails after the block raised is
        added to that exception as a note; after a clean block it raises."""
        if exc is None:
            self.delete()
            return
        try:
            self.delete()
        except ChainError as d:
            exc.add_note(f"and the DEL after it failed too: {d}")

    def addresses(self, family: int | None = None) -> list[str]:
        """The result's IP addresses without prefix length; `family` 4 or 6 filters."""
        out = []
        for ip in self.result.get("ips", []):
            addr = str(ip.get("address", "")).split("/")[0]
            if addr and (family is None or (":" in addr) == (family == 6)):
                out.append(addr)
        return out

    def check(self) -> None:
        """CHECK this attachment (PluginError when a plugin finds it broken)."""
        self.network.check(self.container_id, self.netns, self.ifname)

    def delete(self) -> None:
        """DEL this attachment (again harmless), with the arguments ADD had."""
        self.network.delete(
            self.container_id,
            self.netns,
            self.ifname,
            capability_args=self.capability_args,
            cni_args=self.cni_args,
        )


class Network:
    """A network list bound to a plugin path, a cache dir and (optionally) a host netns.

    `plugin_path` is the list of directories searched for each plugin type (libcni's
    CNI_PATH; default `default_plugin_path()`). `cache_dir` keeps each attachment's result
    for CHECK and DEL. `host` is the name of a network namespace (under /run/netns) in which
    the plugins run, instead of the caller's. `env` is added to every plugin's environment.
    """

    def __init__(
        self,
        conflist: ConfList | Mapping[str, Any] | str | os.PathLike[str],
        plugin_path: Sequence[str | os.PathLike[str]] | None = None,
        *,
        cache_dir: str | os.PathLike[str] = DEFAULT_CACHE_DIR,
        conf_dir: str = DEFAULT_CONF_DIR,
        host: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.conflist = (
            conflist if isinstance(conflist, ConfList) else load_conflist(conflist, conf_dir)
        )
        dirs = default_plugin_path() if plugin_path is None else plugin_path
        self.plugin_path = [os.fspath(d) for d in dirs]
        self.cache_dir = os.fspath(cache_dir)
        self.host = host or ""
        self.env = dict(env or {})

    @classmethod
    def load(
        cls,
        source: ConfList | Mapping[str, Any] | str | os.PathLike[str],
        plugin_path: Sequence[str | os.PathLike[str]] | None = None,
        **kwargs: Any,
    ) -> Network:
        """The same as the constructor; reads better with a network name."""
        return cls(source, plugin_path, **kwargs)

    @property
    def name(self) -> str:
        return self.conflist.name

    def __repr__(self) -> str:
        return f"Network({self.name!r}, plugin_path={self.plugin_path!r}, host={self.host!r})"

    def _runtime(
        self,
        container_id: str,
        netns: str,
        ifname: str = "eth0",
        capability_args: Mapping[str, Any] | None = None,
        cni_args: str = "",
    ) -> Runtime:
        return Runtime(
            container_id,
            netns,
            dict(capability_args or {}),
            ifname,
            cni_args,
            os.pathsep.join(self.plugin_path),
            self.cache_dir,
            self.env,
            self.host,
        )

    def add(
        self,
        container_id: str,
        netns: str,
        ifname: str = "eth0",
        *,
        capability_args: Mapping[str, Any] | None = None,
        cni_args: str = "",
    ) -> dict[str, Any]:
        """ADD: run the chain and return its result (cached for CHECK and DEL).

        On a failure the plugins already run are left as they are, as with libcni: call
        `delete` to clean up (the `attach` context manager does).
        """
        rt = self._runtime(container_id, netns, ifname, capability_args, cni_args)
        return add(self.conflist, rt) or {}

    def check(
        self,
        container_id: str,
        netns: str,
        ifname: str = "eth0",
        *,
        capability_args: Mapping[str, Any] | None = None,
        cni_args: str = "",
    ) -> None:
        """CHECK the attachment against its cached result; the arguments ADD had are used
        when none are given."""
        rt = self._runtime(container_id, netns, ifname, capability_args, cni_args)
        check(self.conflist, rt)

    def delete(
        self,
        container_id: str,
        netns: str = "",
        ifname: str = "eth0",
        *,
        capability_args: Mapping[str, Any] | None = None,
        cni_args: str = "",
    ) -> None:
        """DEL in reverse order; the arguments ADD had are used when none are given."""
        rt = self._runtime(container_id, netns, ifname, capability_args, cni_args)
        delete(self.conflist, rt)

    def gc(self, valid: Sequence[tuple[str, str]] | None = None) -> None:
        """GC (1.1.0): `valid` are the (container ID, ifname) pairs still alive; default:
        the attachments of this network in the cache dir."""
        rt = self._runtime("", "")
        if valid is None:
            alive = cached_attachments(self.conflist, self.cache_dir)
        else:
            for cid, ifname in valid:
                validate_attachment(self.name, cid, ifname)
            alive = [{"containerID": c, "ifname": i} for c, i in valid]
        gc(self.conflist, rt, alive)

    def status(self) -> None:
        """STATUS (1.1.0): PluginError from the first plugin that is not ready."""
        status(self.conflist, self._runtime("", ""))

    def versions(self) -> dict[str, Any]:
        """VERSION of every plugin of the list, by plugin type."""
        return version_info(self.conflist, self._runtime("", ""))

    def attach(
        self,
        container_id: str,
        netns: str,
        ifname: str = "eth0",
        *,
        capability_args: Mapping[str, Any] | None = None,
        cni_args: str = "",
    ) -> Attachment:
        """ADD now and return the attachment; used in a `with` block, DEL runs when the
        block ends (see `Attachment`). When ADD fails, DEL runs at once (cleaning up what
        the plugins before the failing one made) and ADD's error is raised."""
        caps = dict(capability_args or {})
        try:
            result = self.add(container_id, netns, ifname, capability_args=caps, cni_args=cni_args)
        except BaseException as e:
            try:
                self.delete(container_id, netns, ifname, capability_args=caps, cni_args=cni_args)
            except ChainError as d:
                e.add_note(f"and the DEL after it failed too: {d}")
            raise
        return Attachment(self, container_id, netns, ifname, result, caps, cni_args)

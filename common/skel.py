"""Dispatch of a CNI invocation to a plugin's verbs: the part every plugin shares.

A plugin hands `run` a `Plugin` naming one function per verb. `run` reads the environment
and stdin, answers VERSION and the banner itself, validates everything generic (env,
cniVersion, verb/version combinations, the shared config keys), calls the verb, prints the
result in the config's cniVersion, and turns any failure into exactly one CNI error JSON
on stdout (a human line on stderr, the traceback, if any, in the log).
"""

from __future__ import annotations

import sys

from common import jsontext as json
from common import versions
from common.errors import INTERNAL, MAX_STDIN_BYTES, CniError

# `typing` costs several ms to import; type checkers treat this name as true whatever its
# value, so the annotations below are checked without the runtime paying for them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import IO, Any

    from common.config import NetConf
    from common.env import Invocation
    from common.log import Log
    from common.result import Result

    AddFn = Callable[["Request"], "Result | None"]
    VerbFn = Callable[["Request"], None]


# Request and Plugin are plain classes rather than dataclasses: `dataclasses` imports
# `inspect` (~6 ms), and VERSION - which podman sends for every plugin of every list on
# every command - should pay for as little as possible.
class Request:
    """Everything a verb needs: the environment, the parsed config and a logger."""

    __slots__ = ("conf", "env", "environ", "log", "stdin")

    def __init__(
        self,
        env: Invocation,
        conf: NetConf,
        log: Log,
        environ: Mapping[str, str] | None = None,
        stdin: bytes = b"",
    ) -> None:
        self.env = env
        self.conf = conf
        self.log = log
        self.environ: Mapping[str, str] = environ if environ is not None else {}
        # The raw config, for what the parsed JSON cannot tell (e.g. a key given twice:
        # json.loads keeps only the last one).
        self.stdin = stdin

    @property
    def network(self) -> str:
        return self.conf.name

    @property
    def container_id(self) -> str:
        return self.env.container_id

    @property
    def ifname(self) -> str:
        return self.env.ifname

    @property
    def netns(self) -> str:
        return self.env.netns


def _no_op(_: Request) -> None:
    return None


def lazy(target: str) -> Callable[[Request], Any]:
    """A verb named "module:function", imported on its first call.

    A plugin's table of contents names its verbs this way so that VERSION and the banner -
    podman calls VERSION for every plugin of every list on every command - never pay for
    importing them.
    """
    module_name, _, attr = target.partition(":")

    def verb(request: Request) -> Any:
        # __import__ with a fromlist returns the submodule itself, and spares importing
        # importlib (~1 ms) on the call path.
        return getattr(__import__(module_name, fromlist=[attr]), attr)(request)

    verb.__qualname__ = verb.__name__ = attr
    return verb


class Plugin:
    """A plugin's table of contents: which function handles which verb.

    `add` returns the result to print, or None to pass prevResult through unchanged.
    """

    __slots__ = ("add", "check", "delete", "gc", "name", "status", "version")

    def __init__(
        self,
        name: str,
        add: AddFn,
        delete: VerbFn,
        check: VerbFn,
        gc: VerbFn = _no_op,
        status: VerbFn = _no_op,
        version: str = "0.1.0",
    ) -> None:
        self.name = name
        self.add = add
        self.delete = delete
        self.check = check
        self.gc = gc
        self.status = status
        self.version = version

    def banner(self) -> str:
        return (
            f"CNI {self.name} plugin (cni-meta-plugins {self.version}), "
            f"CNI spec versions {', '.join(versions.SUPPORTED_VERSIONS)}"
        )


def verbs_module_plugin(name: str, module: str = "") -> Plugin:
    """The table of a plugin whose verbs are add/delete/check/gc/status in one module
    (`<name>.verbs` unless named), each imported on its first call."""
    module = module or f"{name}.verbs"
    return Plugin(
        name=name,
        add=lazy(f"{module}:add"),
        delete=lazy(f"{module}:delete"),
        check=lazy(f"{module}:check"),
        gc=lazy(f"{module}:gc"),
        status=lazy(f"{module}:status"),
    )


def _read_stdin(stream: IO[bytes]) -> bytes:
    # Read one byte more than allowed so that decode() can tell "too large" without us
    # ever holding an unbounded input in memory.
    return stream.read(MAX_STDIN_BYTES + 1)


def _best_effort_version(data: bytes) -> str:
    """The cniVersion to put in an error JSON, even when the config is broken."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return versions.LATEST
    if isinstance(raw, dict):
        v = raw.get("cniVersion")
        if isinstance(v, str) and v in versions.SUPPORTED_VERSIONS:
            return v
        if v is None or v == "":
            return versions.DEFAULT_VERSION
    return versions.LATEST


def version_answer(data: bytes) -> dict[str, Any]:
    """VERSION: never fails; echoes the requested version when there is a sensible one."""
    requested = versions.LATEST
    try:
        raw = json.loads(data) if data.strip() else {}
    except (ValueError, RecursionError):
        raw = {}
    if isinstance(raw, dict):
        v = raw.get("cniVersion")
        if isinstance(v, str):
            try:
                versions.parse(v)
                requested = v
            except ValueError:
                pass
    return {"cniVersion": requested, "supportedVersions": list(versions.SUPPORTED_VERSIONS)}


def _make_log(plugin: str, raw: dict[str, Any] | None, env: Mapping[str, str]) -> Log:
    from common.log import LOG_ENV, Log, escape_field

    path = ""
    level = "info"
    if raw is not None:
        v = raw.get("logFile")
        path = v if isinstance(v, str) else ""
        lv = raw.get("logLevel")
        level = lv if isinstance(lv, str) else level
    path = path or env.get(LOG_ENV, "")
    # Logged before they are validated (a refusal of them is logged too): escaped.
    cid = escape_field(env.get("CNI_CONTAINERID", "-")[:64])
    net = raw.get("name", "-") if isinstance(raw, dict) else "-"
    net = escape_field(net[:120] if isinstance(net, str) else "-")
    command = escape_field(env.get("CNI_COMMAND", "-")[:16])
    prefix = f"{plugin} {command} {net}/{cid}/{escape_field(env.get('CNI_IFNAME', '-')[:64])}"
    return Log(path, prefix, level)


def _command(environ: Mapping[str, str] | None) -> str:
    """CNI_COMMAND, read without importing `os` (~1.2 ms, half of what VERSION and the
    banner import): `posix.environ` is the builtin behind os.environ, in bytes."""
    if environ is not None:
        return environ.get("CNI_COMMAND", "")
    import posix

    return posix.environ.get(b"CNI_COMMAND", b"").decode("utf-8", "surrogateescape")


def run(
    plugin: Plugin,
    *,
    environ: Mapping[str, str] | None = None,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    out = stdout or sys.stdout.buffer
    err = stderr or sys.stderr
    command = _command(environ)
    if not command:
        print(plugin.banner(), file=err)
        return 0
    data = _read_stdin(stdin or sys.stdin.buffer)
    if command == "VERSION":
        _emit(out, version_answer(data))
        return 0
    env: Mapping[str, str]
    if environ is None:
        import os

        env = os.environ
    else:
        env = environ

    error_version = _best_effort_version(data)
    log = _make_log(plugin.name, None, env)
    try:
        from common.config import decode, parse_netconf
        from common.env import read_invocation

        invocation = read_invocation(env)
        raw = decode(data)
        log = _make_log(plugin.name, raw, env)
        conf = parse_netconf(raw)
        error_version = conf.cni_version
        versions.require_verb(command, conf.cni_version)
        request = Request(invocation, conf, log, env, data)
        result = _dispatch(plugin, request)
        if result is not None:
            _emit(out, result.to_json(conf.cni_version))
        log.debug("ok")
        return 0
    except CniError as e:
        log.error(f"error {e.code}: {e}")
        _emit(out, e.to_json(error_version))
        print(f"{plugin.name}: {command} failed: {e}", file=err)
        return 1
    except Exception as e:  # the one place a bug becomes an honest error 999
        import traceback

        log.error("unexpected exception:\n" + traceback.format_exc())
        failure = CniError(INTERNAL, f"internal error in {plugin.name}: {type(e).__name__}", str(e))
        _emit(out, failure.to_json(error_version))
        print(f"{plugin.name}: {command} failed: {failure}", file=err)
        return 1


def _dispatch(plugin: Plugin, request: Request) -> Result | None:
    command = request.env.command
    if command == "ADD":
        result = plugin.add(request)
        if result is None:
            from common.result import Result

            result = request.conf.prev_result or Result()
        return result
    if command == "DEL":
        plugin.delete(request)
    elif command == "CHECK":
        plugin.check(request)
    elif command == "GC":
        plugin.gc(request)
    elif command == "STATUS":
        plugin.status(request)
    return None


def _emit(out: IO[bytes], obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()


def main(plugin: Plugin) -> None:
    """Entry point for a plugin executable."""
    sys.exit(run(plugin))

"""Dispatch of a CNI invocation to a plugin's verbs: the part every plugin shares.

A plugin hands `run` its `Plugin`, whose verbs are in `<name>.verbs`. `run` reads the
environment and stdin, answers VERSION and the banner itself, validates everything generic
(env, cniVersion, verb/version combinations, the shared config keys), calls the verb,
prints the result in the config's cniVersion, and turns any failure into exactly one CNI
error JSON on stdout (a human line on stderr, the traceback, if any, in the log).
"""

from __future__ import annotations

import sys

from common import jsontext as json
from common import versions
from common.errors import INTERNAL, MAX_STDIN_BYTES, CniError, escape

# `typing` is costly to import; type checkers treat this name as true whatever its value,
# so the annotations below are checked without the runtime paying for them.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import IO, Any

    from common.config import NetConf
    from common.env import Invocation
    from common.log import Log


PACKAGE_VERSION = "0.1.0"
# CNI_COMMAND -> the function of a plugin's verbs module that handles it.
VERB_FUNCTIONS = {"ADD": "add", "DEL": "delete", "CHECK": "check", "GC": "gc", "STATUS": "status"}


class Request:
    """Everything a verb needs: the environment, the parsed config, a logger and the
    plugin's kernel port (None: the verbs open the real kernel's; `run` is handed another
    implementation of the same port to run them against a model of the kernel).

    Plain rather than a common.values.Value, as Plugin: VERSION would import that module
    only to define the two (its start-up budget counts modules)."""

    __slots__ = ("conf", "env", "environ", "kernel", "log")

    def __init__(
        self,
        env: Invocation,
        conf: NetConf,
        log: Log,
        environ: Mapping[str, str],
        kernel: Any = None,
    ) -> None:
        self.env = env
        self.conf = conf
        self.log = log
        self.environ = environ
        self.kernel = kernel

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


class Plugin:
    """A plugin's table of contents: its name; the functions `add`, `delete`, `check`, `gc`
    and `status` of `<name>.verbs` (a "-" in the name is "_" there) handle the verbs (`add`
    returns the result to print, or None to pass prevResult through unchanged).

    That module is imported on the first verb call, so that VERSION and the banner - podman
    calls VERSION for every plugin of every list on every command - never pay for it.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def banner(self) -> str:
        return (
            f"CNI {self.name} plugin (cni-meta-plugins {PACKAGE_VERSION}), "
            f"CNI spec versions {', '.join(versions.SUPPORTED_VERSIONS)}"
        )


def _asked_version(data: bytes) -> object:
    """The config's cniVersion as given (None when it has none), or ... when the config
    is not a JSON object."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return ...
    return raw.get("cniVersion") if isinstance(raw, dict) else ...


def _best_effort_version(data: bytes) -> str:
    """The cniVersion to put in an error JSON, even when the config is broken."""
    v = _asked_version(data)
    if isinstance(v, str) and v in versions.SUPPORTED_VERSIONS:
        return v
    return versions.DEFAULT_VERSION if v is None or v == "" else versions.LATEST


def version_answer(data: bytes) -> dict[str, Any]:
    """VERSION: never fails; echoes the requested version when there is a sensible one."""
    requested = versions.LATEST
    # Nothing on stdin (some callers send none) is no version asked, said without the
    # decoder: its error for empty text would import the `json` package (common.jsontext).
    v = _asked_version(data) if data.strip() else None
    if isinstance(v, str):
        try:
            versions.parse(v)
            requested = v
        except ValueError:
            pass
    return {"cniVersion": requested, "supportedVersions": list(versions.SUPPORTED_VERSIONS)}


def _make_log(plugin: str, raw: dict[str, Any] | None, env: Mapping[str, str]) -> Log:
    from common.log import LOG_ENV, Log

    raw = raw or {}
    path = raw.get("logFile")
    level = raw.get("logLevel")
    net = raw.get("name")
    owner = (
        net[:120] if isinstance(net, str) else "-",
        env.get("CNI_CONTAINERID", "-")[:64],
        env.get("CNI_IFNAME", "-")[:64],
    )
    # Logged before they are validated (a refusal of them is logged too): escaped.
    command = escape(env.get("CNI_COMMAND", "-")[:16], spaces=True)
    return Log(
        path if isinstance(path, str) and path else env.get(LOG_ENV, ""),
        f"{plugin} {command} {'/'.join(escape(x, spaces=True) for x in owner)}",
        level if isinstance(level, str) else "info",
    )


def _command(environ: Mapping[str, str] | None) -> str:
    """CNI_COMMAND, read without importing `os` (a large part of what VERSION and the
    banner would import): `posix.environ` is the builtin behind os.environ, in bytes."""
    if environ is not None:
        return environ.get("CNI_COMMAND", "")
    import posix

    return posix.environ.get(b"CNI_COMMAND", b"").decode("utf-8", "surrogateescape")


def _environ() -> dict[str, str]:
    """The environment as os.environ has it, read without importing `os` (a call that
    passes through needs nothing else of it): `posix.environ` decoded the way os does."""
    import posix

    code, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    return {k.decode(code, errors): v.decode(code, errors) for k, v in posix.environ.items()}


def run(
    plugin: Plugin,
    *,
    environ: Mapping[str, str] | None = None,
    stdin: IO[bytes] | None = None,
    stdout: IO[bytes] | None = None,
    stderr: IO[str] | None = None,
    kernel: Any = None,
) -> int:
    out = stdout or sys.stdout.buffer
    err = stderr or sys.stderr
    command = _command(environ)
    if not command:
        print(plugin.banner(), file=err)
        return 0
    # One byte more than allowed, so that decode() can tell "too large" without us ever
    # holding an unbounded input in memory.
    data = (stdin or sys.stdin.buffer).read(MAX_STDIN_BYTES + 1)
    if command == "VERSION":
        _emit(out, version_answer(data))
        return 0
    if environ is None:
        environ = _environ()
    error_version = ""  # the config's, once it parsed (else guessed from stdin on failure)
    log = _make_log(plugin.name, None, environ)
    try:
        from common.config import decode, parse_netconf
        from common.env import read_invocation

        invocation = read_invocation(environ)
        raw = decode(data)
        log = _make_log(plugin.name, raw, environ)
        conf = parse_netconf(raw)
        error_version = conf.cni_version
        versions.require_verb(command, conf.cni_version)
        request = Request(invocation, conf, log, environ, kernel)
        # The submodule; a plugin named with a dash (flatnet-ipam) is the package with "_".
        verbs = __import__(f"{plugin.name.replace('-', '_')}.verbs", fromlist=["add"])
        result = getattr(verbs, VERB_FUNCTIONS[invocation.command])(request)
        if invocation.command == "ADD":
            if result is None:
                from common.result import Result

                result = conf.prev_result or Result()
            _emit(out, result.to_json(conf.cni_version))
        log.debug("ok")
        return 0
    except Exception as e:
        if isinstance(e, CniError):
            failure = e
            log.error(f"error {e.code}: {e}")
        else:  # the one place a bug becomes an honest error 999
            import traceback

            log.error("unexpected exception:\n" + traceback.format_exc())
            failure = CniError(
                INTERNAL, f"internal error in {plugin.name}: {type(e).__name__}", str(e)
            )
        _emit(out, failure.to_json(error_version or _best_effort_version(data)))
        print(f"{plugin.name}: {escape(command)} failed: {failure}", file=err)
        return 1


def _emit(out: IO[bytes], obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj).encode() + b"\n")
    out.flush()

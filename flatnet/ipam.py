"""IPAM for flatnet: any `ipam.type` is exec'd through CNI_PATH exactly as the Go bridge
does (the same stdin, CNI_COMMAND and the rest of the environment), and its answer read
as a CNI result or error.

posix_spawn rather than subprocess (whose imports every ADD would pay); the config goes
in through a memfd, so a large one cannot stall on a full pipe.
"""

from __future__ import annotations

import os

from common import jsontext as json
from common.errors import INCOMPATIBLE_VERSION, INVALID_CONFIG, CniError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from common.result import Result
    from common.skel import Request

MAX_ANSWER = 1 << 20


def find_plugin(kind: str, cni_path: tuple[str, ...]) -> str:
    """The first executable named `kind` in CNI_PATH (error 7 naming both when none)."""
    for directory in cni_path:
        candidate = os.path.join(directory, kind)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise CniError(
        INVALID_CONFIG,
        f"failed to find IPAM plugin {kind!r} in CNI_PATH",
        f"CNI_PATH is {':'.join(cni_path) or '(empty)'}",
    )


def spawn(argv: list[str], stdin: bytes, env: Mapping[str, str]) -> tuple[int, bytes]:
    """Run argv[0] with `stdin`; (exit status, its stdout). Its stderr goes where ours does."""
    memfd = os.memfd_create("cni-stdin", os.MFD_CLOEXEC)
    out_r, out_w = os.pipe()
    try:
        view = memoryview(stdin)
        while view:
            view = view[os.write(memfd, view) :]
        os.lseek(memfd, 0, os.SEEK_SET)
        actions = [(os.POSIX_SPAWN_DUP2, memfd, 0), (os.POSIX_SPAWN_DUP2, out_w, 1)]
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
    finally:
        os.close(memfd)
        os.close(out_w)
    chunks = []
    size = 0
    with os.fdopen(out_r, "rb") as f:
        while chunk := f.read(65536):
            size += len(chunk)
            if size <= MAX_ANSWER:
                chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks)


def exec_plugin(
    path: str, command: str, stdin: bytes, environ: Mapping[str, str], overrides: dict[str, str]
) -> bytes:
    """Run the plugin at `path` for `command`; its stdout, or its error raised."""
    env = {**environ, **overrides, "CNI_COMMAND": command}
    code, out = spawn([path], stdin, env)
    if code != 0:
        raise _failure(path, command, code, out)
    return out


def _failure(path: str, command: str, code: int, out: bytes) -> CniError:
    """The IPAM plugin's own error (its code, message and details), else what we saw."""
    name = os.path.basename(path)
    try:
        raw = json.loads(out)
    except (ValueError, RecursionError):
        raw = None
    if isinstance(raw, dict) and isinstance(raw.get("code"), int):
        msg = raw["msg"] if isinstance(raw.get("msg"), str) else ""
        details = raw["details"] if isinstance(raw.get("details"), str) else ""
        return CniError(raw["code"], f"IPAM {name} {command}: {msg}", details)
    text = out[:300].decode("utf-8", "replace")
    return CniError(999, f"IPAM {name} {command} failed (exit status {code})", text)


class ExecIpam:
    """An IPAM plugin exec'd through CNI_PATH, given the network's config as we got it."""

    def __init__(self, request: Request, kind: str) -> None:
        self.request = request
        self.kind = kind
        self.stdin = json.dumps(request.conf.body.raw).encode()

    def locate(self) -> str:
        """The plugin's path (error 7 when CNI_PATH has none): before anything is leased."""
        return find_plugin(self.kind, self.request.env.path)

    def _run(
        self, command: str, container_id: str = "", ifname: str = "", netns: str | None = None
    ) -> bytes:
        """`command` for the request's attachment, or for another one of the network (GC
        releases the leases of attachments it finds stale: their ids, no netns).

        An IPAM that refuses the config's cniVersion (error 1; Debian's host-local stops
        at 1.0.0) is asked again in the newest version it supports below it; GC and STATUS
        are skipped for one that predates them."""
        path = self.locate()
        overrides = {}
        if container_id:
            overrides = {"CNI_CONTAINERID": container_id, "CNI_IFNAME": ifname}
        if netns is not None:
            overrides["CNI_NETNS"] = netns
        environ = self.request.environ
        try:
            return exec_plugin(path, command, self.stdin, environ, overrides)
        except CniError as e:
            if e.code != INCOMPATIBLE_VERSION:
                raise
            older = self._older_version(path)
            if older is None:
                raise
            if command in ("GC", "STATUS") and older not in ("1.1.0",):
                return b""
            stdin = json.dumps({**self.request.conf.body.raw, "cniVersion": older}).encode()
            return exec_plugin(path, command, stdin, environ, overrides)

    def _older_version(self, path: str) -> str | None:
        """The newest version the plugin supports below the config's, if any."""
        from common import versions

        wanted = self.request.conf.cni_version
        out = exec_plugin(path, "VERSION", self.stdin, self.request.environ, {})
        try:
            supported = json.loads(out).get("supportedVersions")
        except (ValueError, RecursionError, AttributeError):
            return None
        if not isinstance(supported, list):
            return None
        known = [v for v in supported if v in versions.SUPPORTED_VERSIONS]
        below = [v for v in known if versions.parse(v) < versions.parse(wanted)]
        return max(below, key=versions.parse, default=None)

    def add(self) -> Result:
        from common.result import Result

        out = self._run("ADD")
        try:
            raw = json.loads(out)
        except (ValueError, RecursionError):
            raise CniError(
                999, f"IPAM {self.kind} answered ADD with something that is not JSON"
            ) from None
        return Result.from_json(raw, self.request.conf.cni_version)

    def delete(self, container_id: str = "", ifname: str = "") -> None:
        """Release the lease of the request's attachment, or of (container_id, ifname)."""
        self._run("DEL", container_id, ifname, "" if container_id else None)

    def check(self) -> None:
        self._run("CHECK")

    def predates_gc(self) -> bool:
        """Whether the plugin supports no version with GC and STATUS (1.1.0): such a
        plugin (Debian's host-local) answers them with an error of its own."""
        path = self.locate()
        out = exec_plugin(path, "VERSION", self.stdin, self.request.environ, {})
        try:
            supported = json.loads(out).get("supportedVersions")
        except (ValueError, RecursionError, AttributeError):
            return True
        return not isinstance(supported, list) or "1.1.0" not in supported

    def gc(self) -> None:
        if not self.predates_gc():
            self._run("GC")

    def status(self) -> None:
        if not self.predates_gc():
            self._run("STATUS")


class InProcessIpam:
    """flatnet-ipam's library called in this process (no second exec): the same leases
    the `flatnet-ipam` executable keeps, with the same answers."""

    def __init__(self, request: Request) -> None:
        from flatnet_ipam import lib

        self.lib = lib
        self.request = request
        # Parsed now: a bad ipam section is error 7 before anything is touched.
        self.config = lib.parse_config(request.conf, request.env.cni_args)

    def locate(self) -> str:
        return "flatnet-ipam (in-process)"

    def add(self) -> Result:
        request = self.request
        return self.lib.allocate(self.config, request.container_id, request.ifname, request.log)

    def delete(self, container_id: str = "", ifname: str = "") -> None:
        request = self.request
        self.lib.release(self.config, container_id or request.container_id,
                         ifname or request.ifname, request.log)  # fmt: skip

    def check(self) -> None:
        request = self.request
        self.lib.check(self.config, request.container_id, request.ifname, request.log)

    def gc(self) -> None:
        from common.gc import valid_attachments

        valid = valid_attachments(self.request.network, self.request.conf.body)
        self.lib.gc(self.config, valid, self.request.log)

    def status(self) -> None:
        self.lib.status(self.config, self.request.log)

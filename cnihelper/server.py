"""The resident helper: a fork server that keeps the plugins' libraries loaded.

What it does, whom it serves and why, and its options: docs/helper.md. The plugin side
(the wire protocol) is common/fastpath.py.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import io
import os
import select
import signal
import socket
import sys
import time

from bandwidth import hooks as bandwidth_hooks
from common import fastpath
from common.errors import MAX_STDIN_BYTES
from common.netns import CLONE_NEWNET, CLONE_NEWNS, libc, setns
from portmap import hooks as portmap_hooks
from tuning import hooks as tuning_hooks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PR_SET_PDEATHSIG = 1
# Linux 6.5: a pidfd of the connecting process, taken by the kernel at connect time.
SO_PEERPIDFD = 77
REFILL_DELAY = 0.03  # seconds between a spare taking a call and its replacement's fork
DEFAULT_CALL_LIMIT = 300.0  # seconds; the plugins bound their own waits far below this
DEFAULT_MAX_WORKERS = 16
_MAX_REQUEST = 256 * 1024
# What the helper may touch of each plugin: its hooks module (preload), nothing else; its
# table is common.skel.Plugin(name).
HOOKS = {"portmap": portmap_hooks, "bandwidth": bandwidth_hooks, "tuning": tuning_hooks}


class Declined(Exception):
    """The helper will not serve this call; the plugin does the work itself."""


def peer_pidfd(conn: socket.socket) -> int:
    """A pidfd of the process at the other end of `conn`.

    SO_PEERPIDFD names the process that connected, whatever happened since. Older kernels
    only give the pid (SO_PEERCRED): pidfd_open of it could name a new process if the peer
    exited and its pid was reused before this call; the window is a few microseconds after
    accept, and the caller must then also be root for the socket to be reachable at all.
    """
    try:
        return conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError as e:
        if e.errno != errno.ENOPROTOOPT:  # the peer is gone (EINVAL): never guess by pid
            raise Declined("the caller has exited") from None
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return os.pidfd_open(int.from_bytes(creds[:4], sys.byteorder))


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""  # e.g. attr/current without an LSM: no label, same as ours


def _privileges(proc: str) -> dict[str, str]:
    """The fields of /proc/PID/status that bound what a process may do, and its LSM label."""
    fields = {"label": _read_text(f"{proc}/attr/current").strip("\0\n")}
    for line in _read_text(f"{proc}/status").splitlines():
        key, _, value = line.partition(":")
        if key in ("CapEff", "CapBnd", "NoNewPrivs", "Seccomp"):
            fields[key] = value.strip()
    return fields


def caller_privileges(pidfd: int) -> dict[str, str]:
    """`_privileges` of the process behind `pidfd`, read race-free.

    /proc/PID is read by number; the process is confirmed alive (not reaped, so that
    number was still its own) after the read.
    """
    pid = -1
    for line in _read_text(f"/proc/self/fdinfo/{pidfd}").splitlines():
        if line.startswith("Pid:"):
            pid = int(line.split()[1])
    if pid <= 0:
        raise Declined("the caller has exited")
    fields = _privileges(f"/proc/{pid}")
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        raise Declined("the caller has exited") from None
    return fields


def lacks(caller: dict[str, str], own: dict[str, str]) -> str:
    """Why a caller with these privileges may not run with the helper's ('' if it may).

    A worker runs with the helper's credentials, not the caller's: a root caller that
    dropped capabilities, or is confined by no_new_privs, seccomp or an LSM profile the
    helper is not under, would get more through the helper than by running the plugin.
    """
    for key in ("CapEff", "CapBnd"):
        try:
            missing = int(own[key], 16) & ~int(caller[key], 16)
        except (KeyError, ValueError):
            return f"cannot read the caller's {key}"
        if missing:
            return f"the caller lacks capabilities the helper has ({key} {missing:#x})"
    if caller.get("NoNewPrivs", "0") != "0" and own.get("NoNewPrivs", "0") == "0":
        return "the caller runs under no_new_privs"
    if caller.get("Seccomp", "0") != "0" and own.get("Seccomp", "0") == "0":
        return "the caller runs under seccomp"
    if caller.get("label", "") != own.get("label", ""):
        return f"the caller has another security label ({caller.get('label')!r})"
    return ""


def _same_file(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def preload() -> dict[str, Any]:
    """Import what the three plugins' verbs use, so that workers start warm: each plugin's
    table of contents and its hooks' preload (its verbs, and the common modules they use).

    Only imports: nothing here opens a socket, a table or a netns-bound context, so a
    worker in any namespace starts from a clean slate.
    """
    from common.rtnl import pyroute2
    from common.skel import Plugin

    pyroute2()  # pyroute2's message classes, without its __init__ (asyncio & co.)
    tables = {}
    for name, hooks in HOOKS.items():
        tables[name] = Plugin(name)
        hooks.preload()
    from common import digest

    digest.sha256_hex(b"")  # finds and caches the builtin hash constructors
    digest.sha512_hex(b"")
    return tables


class Server:
    def __init__(
        self, path: str, tables: dict[str, Any], max_workers: int, call_limit: float
    ) -> None:
        self.path = path
        self.tables = tables
        self.max_workers = max_workers
        self.call_limit = call_limit
        self.code_id = fastpath.code_id()
        self.own = _privileges("/proc/self")  # a caller must have at least these
        self.parent = os.getpid()
        self.listener: socket.socket | None = None
        self.stopping = False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def bind(self) -> None:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(self.path)
        except OSError:
            pass  # nobody there: a stale socket file at most
        else:
            raise SystemExit(f"cni-meta-helper: another helper already serves {self.path}")
        finally:
            probe.close()
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)
        old = os.umask(0o077)
        try:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.listener.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.listener.listen(128)
        self._inode = os.stat(self.path).st_ino
        self._clear_stalled()

    def _clear_stalled(self) -> None:
        """Plugins that found the helper unresponsive skip it while this marker exists
        (fastpath.STALLED); a helper that is alive and looping says otherwise."""
        with contextlib.suppress(OSError):
            os.unlink(self.path + fastpath.STALLED)

    def close(self) -> None:
        """Stop taking calls: new connections are refused at once (the plugins do their
        own work), the spares serve what is already queued and then exit."""
        if self.listener is not None:
            with contextlib.suppress(OSError):
                # Shared by every spare: accept() returns the queued connections, then
                # fails (EINVAL); connect() is refused from now on.
                self.listener.shutdown(socket.SHUT_RD)
            self.listener.close()
            self.listener = None
            try:
                if os.stat(self.path).st_ino == self._inode:
                    os.unlink(self.path)
            except OSError:
                pass

    def stop(self) -> None:
        """From a signal handler: finish the calls in flight, then return from serve."""
        self.stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def serve_forever(self, spares: int) -> None:
        """Keep `spares` workers forked and waiting in accept(), until stopped.

        Forking a ~40 MB interpreter takes a millisecond or more; done ahead of time, it
        is off the plugin's path. The kernel hands each connection to one waiting worker,
        which tells this process (its pid on a pipe) so that a replacement is forked.
        This process watches every child through a pidfd: it kills a call that runs past
        `call_limit`, forks nothing while `max_workers` run (a caller that finds no spare
        is then told at once to do its own work), and after `stop` returns only once
        every call in flight has finished.
        """
        assert self.listener is not None
        # Children are reaped here, once their pidfd says they ended: until then their pid
        # cannot be reused, so a pidfd_open right after the fork names the right process.
        taken_r, taken_w = os.pipe2(os.O_CLOEXEC)
        idle: dict[int, int] = {}  # pid -> pidfd of spares waiting for a call
        busy: dict[int, tuple[int, float]] = {}  # pid -> (pidfd, deadline) of workers
        refill_at = 0.0
        while self.listener is not None or idle or busy:
            if self.stopping:
                self.close()
            else:
                self._clear_stalled()
            # Refill at once when no spare is left; otherwise a little later, so that the
            # fork does not compete for the CPU with the call a spare just took.
            room = self.listener is not None and len(idle) + len(busy) < self.max_workers
            while room and len(idle) < spares and (not idle or time.monotonic() >= refill_at):
                pid = os.fork()
                if pid == 0:
                    try:
                        os.close(taken_r)
                        self._spare(taken_w)  # never returns
                    finally:
                        os._exit(70)  # whatever happened, never back into this loop
                idle[pid] = os.pidfd_open(pid)
                room = len(idle) + len(busy) < self.max_workers
            now = time.monotonic()
            wait = 1.0
            if room and len(idle) < spares:
                wait = max(0.0, refill_at - now)
            for _, deadline in busy.values():
                wait = min(wait, max(0.0, deadline - now))
            # No spare and no room for one: this process answers callers itself.
            full = self.listener is not None and not idle and not room
            watched = [taken_r, self._wake_r, *idle.values(), *(fd for fd, _ in busy.values())]
            ready = select.select(watched + ([self.listener] if full else []), [], [], wait)[0]
            if self._wake_r in ready:
                with contextlib.suppress(OSError):
                    os.read(self._wake_r, 64)
            if taken_r in ready:
                data = os.read(taken_r, 4096)
                for i in range(0, len(data) - len(data) % 4, 4):
                    pid = int.from_bytes(data[i : i + 4], sys.byteorder)
                    if pid in idle:
                        busy[pid] = (idle.pop(pid), time.monotonic() + self.call_limit)
                refill_at = time.monotonic() + REFILL_DELAY
            # Exited: a finished call, a spare killed by someone (replaced above).
            ended = [pid for pid, fd in idle.items() if fd in ready]
            for pid in ended:
                os.close(idle.pop(pid))
            for pid in [pid for pid, (fd, _) in busy.items() if fd in ready]:
                os.close(busy.pop(pid)[0])
                ended.append(pid)
            for pid in ended:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            if full and self.listener is not None and self.listener in ready:
                self._turn_away()
            now = time.monotonic()
            for pid, (pidfd, deadline) in list(busy.items()):
                if now >= deadline:
                    print(
                        f"cni-meta-helper: killed worker {pid}: its call ran longer than"
                        f" {self.call_limit:g} s (--call-limit)",
                        file=sys.stderr,
                        flush=True,
                    )
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    busy[pid] = (pidfd, float("inf"))

    def _turn_away(self) -> None:
        """All --max-workers are busy: tell the caller to run the plugin itself, now,
        instead of letting it wait in the queue for its handshake timeout."""
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with contextlib.suppress(OSError):
            # Its request first (sent right after connect): closing a socket with unread
            # data resets the connection, and the caller would never read the "F".
            conn.settimeout(0.1)
            conn.recv(_MAX_REQUEST)
            conn.send(b"F")
        conn.close()

    def _spare(self, taken: int) -> None:
        """A waiting worker: take one call from a root peer, then serve it and exit."""
        assert self.listener is not None
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        # A helper killed outright (SIGKILL, OOM) must not leave spares accepting calls.
        libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.parent:
            os._exit(0)  # the helper died before the line above took effect
        while True:
            try:
                conn, _ = self.listener.accept()
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            except OSError as e:
                if e.errno == errno.EINVAL:
                    os._exit(0)  # the helper stopped listening (close) and none is queued
                continue
            if int.from_bytes(creds[4:8], sys.byteorder) == 0:
                break
            conn.close()  # not root: it gets no answer and does its own work
        # From here on this process serves one call, which runs to its end like a plugin
        # process would: the helper stopping (its SIGTERM, systemd's to the whole unit, a
        # terminal's ^C) or dying does not cut it short. The plugin's death still does
        # (_die_with_caller), and so does --call-limit.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        libc().prctl(PR_SET_PDEATHSIG, 0)
        os.write(taken, os.getpid().to_bytes(4, sys.byteorder))
        os.close(taken)
        self.listener.close()
        os._exit(self._worker(conn))

    # --- in the worker -----------------------------------------------------------------

    def _worker(self, conn: socket.socket) -> int:
        """Serve the call on `conn`: the worker's exit status (unless it declines)."""
        status = 70
        try:
            conn.settimeout(fastpath.HANDSHAKE_SECONDS)
            try:
                caller = peer_pidfd(conn)
                name, environ, umask = self._read_request(conn)
                why = lacks(caller_privileges(caller), self.own)
                if why:
                    raise Declined(why)
            except (Declined, OSError, ValueError) as e:
                self._decline(conn, e)
            conn.send(b"R")
            try:
                self._become_caller(conn)
            except (Declined, OSError, ValueError) as e:
                self._decline(conn, e)
            conn.settimeout(None)
            finished = self._die_with_caller(conn)
            status = self._run(name, environ, umask, conn)
            finished.append(True)  # the plugin may now exit without taking us along
            conn.send(b"X" + bytes([status & 0xFF]))
        except BaseException:  # noqa: S110 - nothing may escape a forked child; 70 it is
            pass
        return status

    def _decline(self, conn: socket.socket, why: Exception) -> None:
        """Tell the plugin to do the work itself, and end this worker (nothing ran)."""
        with contextlib.suppress(OSError):
            conn.send(b"F")
        if str(why):
            print(f"cni-meta-helper: declined a call: {why}", file=sys.stderr, flush=True)
        os._exit(0)

    def _read_request(self, conn: socket.socket) -> tuple[str, dict[bytes, bytes], int]:
        data, _, flags, _ = conn.recvmsg(_MAX_REQUEST)
        if flags & socket.MSG_TRUNC:
            raise Declined("request too large")
        parts = data.split(b"\0")
        if len(parts) < 4 or parts[0] != fastpath.MAGIC:
            raise Declined("not a cni-meta-plugins request")
        name = parts[1].decode()
        if name not in self.tables:
            raise Declined(f"unknown plugin {name!r}")
        if parts[2] != self.code_id:
            raise Declined("the plugin runs other installed code (restart the helper)")
        umask = int(parts[3], 8)
        environ: dict[bytes, bytes] = {}
        for entry in parts[4:]:
            key, sep, value = entry.partition(b"=")
            if key:
                environ[key] = value
            elif sep or value:
                # "=x=y" is legal for execve and Python keeps it (key ""), but putenv
                # cannot recreate it: the plugin runs it faithfully itself.
                raise Declined("an environment entry with an empty name")
        return name, environ, umask

    def _become_caller(self, conn: socket.socket) -> None:
        """Take the plugin's descriptors and enter its namespaces, root and cwd."""
        data, fds, flags, _ = socket.recv_fds(
            conn, 16, len(fastpath.PASSED), socket.MSG_CMSG_CLOEXEC
        )
        if data != b"G":
            os._exit(0)  # the plugin gave up waiting and does the work itself
        if flags & socket.MSG_CTRUNC or len(fds) != len(fastpath.PASSED):
            raise Declined("descriptors missing")
        fd = dict(zip(fastpath.PASSED, fds, strict=True))
        if not _same_file(fd["user"], "/proc/self/ns/user"):
            raise Declined("caller in another user namespace")
        if not _same_file(fd["pid"], "/proc/self/ns/pid"):
            raise Declined("caller in another pid namespace")
        if not _same_file(fd["mnt"], "/proc/self/ns/mnt"):
            setns(fd["mnt"], CLONE_NEWNS)
        os.fchdir(fd["root"])
        os.chroot(".")
        os.fchdir(fd["cwd"])
        setns(fd["net"], CLONE_NEWNET)
        for target, stream in enumerate(("stdin", "stdout", "stderr")):
            os.dup2(fd[stream], target)
        for n in fds:
            if n > 2:
                os.close(n)

    def _die_with_caller(self, conn: socket.socket) -> list[bool]:
        """Kill this worker if the plugin process goes away before the call is finished
        (as if the plugin had been killed). Append to the returned list when finished."""
        import _thread

        finished: list[bool] = []

        def watch() -> None:
            try:
                while conn.recv(16):
                    pass
            except OSError:
                pass
            if not finished:
                os.kill(os.getpid(), signal.SIGKILL)

        _thread.start_new_thread(watch, ())
        return finished

    def _run(self, name: str, environ: dict[bytes, bytes], umask: int, conn: socket.socket) -> int:
        from common import skel

        os.umask(umask)
        os.environb.clear()
        os.environb.update(environ)
        sys.argv = [name]
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        # Read as skel would, to tell the plugin the request's cniVersion: the error it
        # prints if this worker dies (killed, --call-limit) must carry it.
        data = bytes(sys.stdin.buffer.read(MAX_STDIN_BYTES + 1))
        conn.send(b"V" + skel._best_effort_version(data).encode())
        try:
            status = skel.run(self.tables[name], stdin=io.BytesIO(data))
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        return status


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="cni-meta-helper", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=fastpath.DEFAULT_SOCKET, help="Unix socket to serve")
    ap.add_argument(
        "--spares", type=int, default=2, help="workers kept forked and waiting (default 2)"
    )
    ap.add_argument(
        "--max-workers",
        type=int,
        default=DEFAULT_MAX_WORKERS,
        help="calls served at once, spares included; beyond, plugins run alone (default 16)",
    )
    ap.add_argument(
        "--call-limit",
        type=float,
        default=DEFAULT_CALL_LIMIT,
        help="kill a worker whose call runs longer; its plugin reports error 11 (default 300 s)",
    )
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("cni-meta-helper: must run as root (the plugins run as root)")
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    tables = preload()
    # Everything loaded so far lives as long as the helper: keep the collector off it, so
    # that a worker's collections neither walk nor write (copy) those pages.
    gc.freeze()
    server = Server(args.socket, tables, max(1, args.max_workers), max(0.0, args.call_limit))
    server.bind()
    # Calls in flight finish; systemd's TimeoutStopSec bounds the wait.
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    print(
        f"cni-meta-helper: serving {args.socket} (pid {os.getpid()})", file=sys.stderr, flush=True
    )
    server.serve_forever(max(1, min(args.spares, args.max_workers)))
    print("cni-meta-helper: stopped", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

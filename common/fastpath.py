"""The plugin side of the resident helper: hand this invocation to it, or return.

A plugin executable calls `delegate(name)` before importing anything else. When a helper
(cnihelper.server) takes the call, a worker that has every library loaded runs the very
same plugin code with this process's stdio, environment, namespaces, root, working
directory and umask, and this process exits with its status. When there is no helper, it
is not root, it declines, or anything goes wrong before the worker starts, `delegate`
returns and the plugin does the work itself: correctness never depends on the helper,
only start-up time does. The handshake, and why it never runs a call twice nor holds the
runtime's stdout: docs/helper.md ("Wire protocol").

This module runs on every container start, so it imports only builtin modules (`posix`,
`_socket`; not even `os`) and costs well under a millisecond when no helper is there.
"""

from __future__ import annotations

import _socket
import posix
import sys

MAGIC = b"CNIMETA1"
ENV_VAR = b"CNI_META_HELPER"
DEFAULT_SOCKET = "/run/cni/meta-helper.sock"
# How long the plugin waits for the helper to say ready before doing the work itself. A
# live helper answers in about a millisecond (a spare is waiting, or one is forked at once).
HANDSHAKE_SECONDS = 0.5
# Next to the socket: a plugin found the helper unresponsive; the helper removes it.
STALLED = ".stalled"
# The cniVersion of an error when the worker died before it read the request: the newest
# (common.versions.LATEST, not imported here: this module imports only builtins).
LATEST_VERSION = b"1.1.0"
# The descriptors sent, in this order (the helper relies on it).
PASSED = ("stdin", "stdout", "stderr", "net", "mnt", "user", "pid", "root", "cwd")
_NS_FILES = ("/proc/self/ns/net", "/proc/self/ns/mnt", "/proc/self/ns/user", "/proc/self/ns/pid")
_SO_PEERCRED = 17


def code_id() -> bytes:
    """Which installed copy of this code is running: (device, inode) of the package dir.

    A reinstall (deploy/install.sh makes a new tree and swaps a symlink) gives a new
    inode, so a helper started before an upgrade declines and the new code runs.
    """
    st = posix.stat(__file__.rpartition("/")[0] or ".")
    return b"%d:%d" % (st.st_dev, st.st_ino)


def request_message(name: str, umask: int) -> bytes:
    # An entry "=x=y" (legal for execve) arrives here with the name "": it cannot be
    # recreated with putenv, so such a call is not handed over (see delegate).
    env = b"\0".join(k + b"=" + v for k, v in posix.environ.items())
    return b"\0".join((MAGIC, name.encode(), code_id(), b"%o" % umask, env))


def _open_passed() -> list[int]:
    fds: list[int] = []
    try:
        for path in _NS_FILES:
            fds.append(posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC))
        for path in ("/", "."):
            fds.append(posix.open(path, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_CLOEXEC))
    except OSError:
        for fd in fds:
            posix.close(fd)
        raise
    return [0, 1, 2, *fds]


def delegate(name: str) -> None:
    """Let the helper run this invocation and exit with its status, or return."""
    path = posix.environ.get(ENV_VAR, DEFAULT_SOCKET.encode())
    if (
        not posix.environ.get(b"CNI_COMMAND")  # the banner: nothing to gain
        or path in (b"", b"off", b"0", b"no")
        or posix.geteuid() != 0
        or b"" in posix.environ  # see request_message
    ):
        return
    try:
        posix.stat(path + STALLED.encode())
        return  # the helper did not answer a recent call and has not recovered since
    except OSError:
        pass
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)
    except OSError:
        return
    try:
        status = _handoff(sock, path, name)
    except TimeoutError:
        status = None  # connected, but nobody answered in time: frozen or swamped
        _mark_stalled(path)
    except OSError:
        status = None  # connection refused, no socket, helper gone before "R"
    finally:
        sock.close()
    if status is not None:
        posix._exit(status)


def _mark_stalled(path: bytes) -> None:
    try:
        fd = posix.open(
            path + STALLED.encode(),
            posix.O_WRONLY | posix.O_CREAT | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK,
            0o600,
        )
        posix.close(fd)
    except OSError:
        pass  # e.g. a read-only directory: every call then pays the short wait


def _handoff(sock: _socket.socket, path: bytes, name: str) -> int | None:
    sock.settimeout(HANDSHAKE_SECONDS)
    sock.connect(path)
    creds = sock.getsockopt(_socket.SOL_SOCKET, _SO_PEERCRED, 12)  # pid, uid, gid
    if int.from_bytes(creds[4:8], sys.byteorder) != 0:
        return None  # the helper must be root
    umask = posix.umask(0o077)
    posix.umask(umask)
    sock.send(request_message(name, umask))
    if sock.recv(16) != b"R":
        return None  # declined or gone: nothing has been done on our behalf
    fds = _open_passed()
    try:
        rights = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
        sock.sendmsg([b"G"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
    finally:
        for fd in fds[3:]:
            posix.close(fd)
    # Committed: the worker is running our invocation. Wait as long as it takes (the
    # plugins bound their own waits, e.g. lock deadlines).
    sock.settimeout(None)
    version = LATEST_VERSION
    reply = sock.recv(64)
    if reply == b"F":
        return None  # it could not enter our namespaces: nothing ran
    if reply[:1] == b"V":
        if reply[1:].replace(b".", b"").isdigit():  # it goes into JSON as it is
            version = reply[1:]
        reply = sock.recv(16)
    if len(reply) == 2 and reply[:1] == b"X":
        return reply[1]
    # The worker died without an answer (killed, out of memory, --call-limit): like a
    # crashed plugin. Every verb is safe to retry, so say so.
    posix.write(
        1,
        b'{"cniVersion": "%s", "code": 11, "msg": "the cni-meta-plugins helper worker ended'
        b' without an answer", "details": "retry; the plugins recover from interrupted calls"}\n'
        % version,
    )
    return 1

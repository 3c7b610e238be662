"""A lock between plugin processes (exclusive or shared, of a whole file or of one key in
it), with a deadline (error 11 past it)."""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager

from common.errors import IO_FAILURE, TRY_AGAIN_LATER, CniError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

LOCK_TIMEOUT_ENV = "CNI_META_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 30.0


def lock_timeout() -> float:
    """CNI_META_LOCK_TIMEOUT in seconds (default 30); a value that is not a non-negative
    number falls back to the default rather than making every verb fail."""
    try:
        value = float(os.environ.get(LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT))
    except ValueError:
        return DEFAULT_LOCK_TIMEOUT
    return value if 0 <= value < 1e9 else DEFAULT_LOCK_TIMEOUT  # NaN compares False too


class _Expired(Exception):
    """Raised by the SIGALRM handler to interrupt a blocking flock at the deadline."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Expired


def _take(fd: int, operation: int, byte: int) -> None:
    """flock(2) the file (`byte` < 0), or lock its one byte at offset `byte` (a POSIX
    record lock: a file holds as many locks as it has bytes, and no file per lock is
    left behind)."""
    if byte < 0:
        fcntl.flock(fd, operation)
    else:
        fcntl.lockf(fd, operation, 1, byte)


def _flock(
    fd: int, path: str, timeout: float, operation: int = fcntl.LOCK_EX, byte: int = -1
) -> bool:
    """Lock `fd` (`operation`: LOCK_EX or LOCK_SH; `byte`, see _take); False when it is
    still taken after `timeout` seconds.

    The wait is a blocking flock cut off by SIGALRM: a blocked flock is woken the moment
    the holder lets go, where a poller with sleeps loses that race to every caller that
    happens to be awake and can starve for the whole timeout (many tuning ADDs waiting on
    one dataDir lock). Signals need the main thread: plugin code runs there.
    """
    try:
        _take(fd, operation | fcntl.LOCK_NB, byte)
        return True
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise CniError(IO_FAILURE, f"cannot lock {path}", str(e)) from None
    import signal

    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001))
        try:
            _take(fd, operation, byte)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return True
    except _Expired:
        return False  # (if it fired just after flock returned, the caller's close frees it)
    except OSError as e:
        raise CniError(IO_FAILURE, f"cannot lock {path}", str(e)) from None
    finally:
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def flock_with_deadline(
    path: str,
    timeout: float | None = None,
    *,
    dir_fd: int | None = None,
    shared: bool = False,
    key: str = "",
) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the `with` block.

    Error 11 (try again later) when it is still taken after `timeout` seconds (default:
    CNI_META_LOCK_TIMEOUT): a runtime retries, where a flock without deadline would hang
    it. flock is released by the kernel when the holder dies, so a SIGKILLed plugin never
    leaves a lock behind. A lock belongs to the open file description: a child forked
    inside the block holds it too until it exits. With `dir_fd`, `path` is opened by its
    last component in that directory (StateDir: the directory it checked).

    `shared`: a shared flock. `key`: instead of the whole file, the one byte of it at an
    offset hashed from `key` (a POSIX record lock, also released when the holder dies):
    a lock per attachment without a file per attachment. Two keys that hash alike share
    a lock, which only serializes them. Record locks belong to the process and go with
    any close of the file in it: only this function opens such a file, once per block.
    """
    timeout = lock_timeout() if timeout is None else timeout
    operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    byte = -1
    if key:
        from common.digest import sha256_hex

        byte = int(sha256_hex(key.encode())[:15], 16)  # below 2**60: any off_t
    try:
        name = path if dir_fd is None else os.path.basename(path)
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except OSError as e:
        raise CniError(IO_FAILURE, f"cannot open lock file {path}", str(e)) from None
    try:
        if not _flock(fd, path, timeout, operation, byte):
            raise CniError(
                TRY_AGAIN_LATER,
                f"another plugin call holds {path}",
                f"waited {timeout:g}s ({LOCK_TIMEOUT_ENV}); try again later",
            )
        yield
    finally:
        os.close(fd)  # closing releases the flock

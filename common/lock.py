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
    """CNI_META_LOCK_TIMEOUT in seconds; a value that is not a non-negative number falls
    back to the default rather than making every verb fail."""
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
    """flock(2) the file (`byte` < 0), or lock its one byte at offset `byte`."""
    if byte < 0:
        fcntl.flock(fd, operation)
    else:
        fcntl.lockf(fd, operation, 1, byte)


def _flock(fd: int, path: str, timeout: float, operation: int, byte: int) -> bool:
    """Lock `fd` (`operation`: LOCK_EX or LOCK_SH); False when it is still taken after
    `timeout` seconds. The wait is a blocking lock cut off by SIGALRM: a blocked lock is
    woken the moment the holder lets go, where a poller with sleeps loses that race to
    every caller awake and can starve for the whole timeout (many tuning ADDs on one
    dataDir lock). Signals need the main thread: plugin code runs there."""
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
    """Hold a lock on `path` (created if missing; with `dir_fd`, its last component in
    that directory) for the `with` block: an exclusive flock, or `shared`; with `key`, a
    POSIX record lock of the one byte at an offset hashed from `key` instead: a lock per
    attachment without a file per attachment (two keys that hash alike only serialize).

    Error 11 (try again later) when it is still taken after `timeout` seconds (default:
    CNI_META_LOCK_TIMEOUT): a runtime retries, where a lock without deadline would hang
    it. The kernel releases both kinds when the holder dies, so a SIGKILLed plugin leaves
    no lock behind. A flock belongs to the open file description (a child forked inside
    the block holds it too), a record lock to the process, and any close of the file in it
    drops it: only this function opens such a file, once per block.
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

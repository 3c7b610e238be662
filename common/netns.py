"""Entering a network namespace by path for a block of code (its /proc/sys files are read
and written with common.sysctl).

Python 3.11 has no os.setns, so this calls setns(2) through ctypes (imported only here).
setns(CLONE_NEWNET) switches the calling thread only; sockets (netlink, nft, inet) keep the
namespace they were created in, so a socket opened inside the block keeps working after it.
"""

from __future__ import annotations

import os

from common.errors import INVALID_NETNS, CniError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from typing import Any

CLONE_NEWNET = 0x40000000
_libc: Any = None


def libc() -> Any:
    """The C library through ctypes (loaded on first use), keeping errno for get_errno."""
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def setns(fd: int) -> None:
    """setns(2) into the network namespace `fd` on the calling thread; OSError when the
    kernel refuses."""
    if libc().setns(fd, CLONE_NEWNET) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class entered:
    """Run the block inside the network namespace at `path`, then come back.

    A class rather than a @contextmanager generator: contextlib (with functools and
    collections) would be imported by every call that enters a container's netns."""

    __slots__ = ("origin", "path", "target")

    def __init__(self, path: str) -> None:
        self.path = path
        self.target = self.origin = -1

    def __enter__(self) -> None:
        path = self.path
        try:
            self.target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise CniError(INVALID_NETNS, f"cannot open network namespace {path}", str(e)) from None
        try:
            self.origin = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            setns(self.target)
        except OSError as e:
            self._close()
            raise CniError(
                INVALID_NETNS, f"cannot enter network namespace {path}", str(e)
            ) from None

    def __exit__(self, *_: object) -> None:
        # Failing to come back would leave the rest of the process in the wrong
        # namespace: nothing sensible can continue after that.
        try:
            setns(self.origin)
        except OSError:  # pragma: no cover - the kernel refusing our own ns
            os._exit(70)
        finally:
            self._close()

    def _close(self) -> None:
        for fd in (self.target, self.origin):
            if fd >= 0:
                os.close(fd)
        self.target = self.origin = -1


class entered_if_present:
    """DEL's way into a container netns that may be gone: `opener(path)` entered for the
    block, or None when there is no netns at `path` (any more), which DEL must tolerate."""

    __slots__ = ("inner", "opener", "path")

    def __init__(self, path: str, opener: Callable[[str], AbstractContextManager[Any]]) -> None:
        self.path = path
        self.opener = opener
        self.inner: AbstractContextManager[Any] | None = None

    def __enter__(self) -> Any:
        path = self.path
        try:
            if path and os.path.exists(path):
                inner = self.opener(path)
                inside = inner.__enter__()
                self.inner = inner
                return inside
        except CniError as e:
            if e.code != INVALID_NETNS:  # e.g. the path exists but is no longer a netns
                raise
        return None

    def __exit__(self, *exc: Any) -> Any:
        if self.inner is not None:
            return self.inner.__exit__(*exc)
        return None

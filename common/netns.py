"""Entering a network namespace by path for a block of code (its /proc/sys files are read
and written with common.sysctl).

Python 3.11 has no os.setns, so this calls setns(2) through ctypes (imported only here).
setns(CLONE_NEWNET) switches the calling thread only; sockets (netlink, nft, inet) keep the
namespace they were created in, so a socket opened inside the block keeps working after it.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from functools import cache

from common.errors import INVALID_NETNS, CniError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager
    from typing import Any, TypeVar

    T = TypeVar("T")

CLONE_NEWNET = 0x40000000


@cache
def libc() -> Any:
    """The C library through ctypes, keeping errno for get_errno."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def setns(fd: int) -> None:
    """setns(2) of the calling thread into the network namespace `fd`."""
    if libc().setns(fd, CLONE_NEWNET) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextmanager
def entered(path: str) -> Iterator[None]:
    """Run the block inside the network namespace at `path`, then come back."""
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise CniError(INVALID_NETNS, f"cannot open network namespace {path}", str(e)) from None
    origin = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            setns(target)
        except OSError as e:
            raise CniError(
                INVALID_NETNS, f"cannot enter network namespace {path}", str(e)
            ) from None
        try:
            yield
        finally:
            # Failing to come back would leave the rest of the process in the wrong
            # namespace: nothing sensible can continue after that.
            try:
                setns(origin)
            except OSError:  # pragma: no cover - the kernel refusing our own ns
                os._exit(70)
    finally:
        os.close(target)
        os.close(origin)


@contextmanager
def entered_if_present(
    path: str, opener: Callable[[str], AbstractContextManager[T]]
) -> Iterator[T | None]:
    """DEL's way into a container netns that may be gone: `opener(path)` entered for the
    block, or None when there is no netns at `path` (any more), which DEL must tolerate."""
    with ExitStack() as stack:
        inside = None
        try:
            if path and os.path.exists(path):
                inside = stack.enter_context(opener(path))
        except CniError as e:
            if e.code != INVALID_NETNS:  # e.g. the path exists but is no longer a netns
                raise
        yield inside

"""Waiting on background plugin processes in kernel tests: a bounded wait, a process's
scheduler state, and whether it is blocked on a file lock."""

from __future__ import annotations

import time
from collections.abc import Callable

HANG_GUARD = 60.0  # seconds; a wait that takes this long is a hang, not a slow machine


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what} after {HANG_GUARD:g}s")
        time.sleep(0.005)


def proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return "gone"


def blocked_on_flock(pid: int) -> bool:
    """Whether `pid` waits for a lock: an flock, or a record lock (bandwidth's lock per
    attachment, common.lock). A `->` line of /proc/locks names the waiters."""
    with open("/proc/locks") as f:
        return any(
            len(p) > 5 and p[1] == "->" and p[2] in ("FLOCK", "POSIX") and p[5] == str(pid)
            for p in (line.split() for line in f)
        )

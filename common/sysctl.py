"""/proc/sys files: one reader and one single-write(2) writer for every plugin.

Which namespace's value a file holds is decided by the thread that opens it (see
common.netns). Only `os` is imported: portmap's ADD writes route_localnet through this
without loading the namespace-entering code.
"""

from __future__ import annotations

import os


def read_sysctl(file: str) -> str:
    """A /proc/sys file's value without its newline."""
    with open(file, "rb") as f:
        return f.read().decode("utf-8", "replace").rstrip("\n")


def write_sysctl(file: str, value: str) -> None:
    # One write(2) for the whole value: a sysctl handler parses what a single write gives
    # it, and a buffered file object chooses itself how many writes a value takes.
    fd = os.open(file, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)

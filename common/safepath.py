"""The way to a state directory, walked so that nobody but root (or us) can redirect it.

Whoever can write a directory can rename what is in it, and so make a plugin running as
root write where they like: every directory on the way is checked before it is passed.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import suppress

from common.errors import IO_FAILURE, CniError

# Every state and lock file is opened so: a symlink in its place is an error (ELOOP).
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW
_MAX_SYMLINKS = 40  # as the kernel's path walk


def safe_file_name(*parts: str) -> str:
    """A file name from validated identifiers; refuses anything path-like."""
    name = "_".join(parts)
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        raise CniError(IO_FAILURE, f"refusing unsafe state file name {name[:80]!r}")
    return name


class UnsafePath(Exception):
    """A directory on the way to a state directory that someone else could swap."""


def open_directory(path: str, *, create: bool = False) -> int | None:
    """An fd of the directory `path`, reached from / one component at a time with
    O_NOFOLLOW; None when it does not exist (components missing with `create` are made,
    mode 0700). Every directory passed on the way must belong to root or to us and be
    writable by nobody else, unless its sticky bit keeps others from renaming what they
    do not own (/tmp), and what is in it is then ours (checked as the next step). A symlink
    on the way is followed only when it is root's or ours; the last component is the
    caller's to check. Raises UnsafePath naming the component, or OSError."""
    trusted = (0, os.geteuid())
    todo = [p for p in reversed(path.split("/")) if p not in ("", ".")]
    names: list[str] = []  # where each fd of `fds` beyond the first is, for messages
    fds = [os.open("/", _DIR)]
    links = 0
    try:
        while todo:
            name = todo.pop()
            if name == "..":
                if len(fds) > 1:
                    os.close(fds.pop())
                    names.pop()
                continue
            here = os.fstat(fds[-1])
            where = "/" + "/".join(names)
            if here.st_uid not in trusted:
                raise UnsafePath(f"{where} belongs to uid {here.st_uid}, who could swap {name}")
            if here.st_mode & 0o022 and not here.st_mode & stat.S_ISVTX:
                raise UnsafePath(
                    f"{where} is writable by others (mode {here.st_mode & 0o7777:o}) without "
                    f"the sticky bit: they could swap {name}"
                )
            try:
                fd = os.open(name, _DIR, dir_fd=fds[-1])
            except FileNotFoundError:
                if not create:
                    return None
                with suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fds[-1])
                fd = os.open(name, _DIR, dir_fd=fds[-1])
            except OSError as e:
                st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
                if e.errno not in (errno.ELOOP, errno.ENOTDIR) or not stat.S_ISLNK(st.st_mode):
                    raise
                if not todo:
                    raise UnsafePath("it is a symlink") from None
                if st.st_uid not in trusted:
                    raise UnsafePath(
                        f"{os.path.join(where, name)} is a symlink of uid {st.st_uid}"
                    ) from None
                links += 1
                if links > _MAX_SYMLINKS:
                    raise
                target = os.readlink(name, dir_fd=fds[-1])
                if target.startswith("/"):
                    while len(fds) > 1:
                        os.close(fds.pop())
                    names.clear()
                todo += [p for p in reversed(target.split("/")) if p not in ("", ".")]
                continue
            fds.append(fd)
            names.append(name)
        return fds.pop()
    finally:
        for fd in fds:
            os.close(fd)

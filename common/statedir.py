"""A directory of state files: checked before anything is written in it, each file
written whole or not at all, and a lock between the plugin processes that share it.
"""

from __future__ import annotations

import os
from contextlib import suppress

from common import jsontext as json
from common.errors import IO_FAILURE, CniError
from common.lock import flock_with_deadline
from common.safepath import NOFOLLOW, UnsafePath, open_directory

TYPE_CHECKING = False
if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from typing import Any

TMP_SUFFIX = ".tmp"  # <name>.tmp: the replacement being written (see write_json)


class StateDir:
    """One directory of state files, checked before anything is written in it.

    It must be a real directory (not a symlink) owned by us and writable by nobody else,
    and so must be the way to it (open_directory): whoever else can write there can plant
    a symlink named like a file we are about to write, or swap the directory itself, and
    make us overwrite any file of the node. The directory is opened once, component by
    component, and checked on that fd before any chmod; every file operation is then
    relative to the fd, so renaming a directory on the way afterwards redirects nothing.
    The files themselves are opened with O_NOFOLLOW too (the temporary one with O_EXCL).
    """

    # Refusing the directory: error 5 for the plugins' own dirs, which they create
    # (remove it and they recreate it); tuning's dataDir, a config key, says 7.
    refusal_code = IO_FAILURE
    # Re-mode a looser directory of ours to 0700 (never one named by the config).
    private = True
    lock_name = "lock"

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fd = -1

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)

    def ensure(self) -> None:
        """Create the directory if needed, then check it (see `check`). Every directory made
        is 0700, the state root included: under a runtime's umask of 0 the parents would
        be world-writable."""
        self._open(create=True)

    def check(self) -> None:
        """Refuse the directory unless only we can write in it and the way to it (error
        `refusal_code`)."""
        if self._open() is None:
            raise CniError(
                IO_FAILURE, f"cannot open state directory {self.directory}", "it does not exist"
            )

    def _open(self, create: bool = False) -> int | None:
        """The directory's fd (None: it does not exist), opened and checked once."""
        if self._fd >= 0:
            return self._fd
        # mkdir's 0700 must not lose owner bits to an odd umask of the runtime's: only a
        # call that may create directories sets one.
        old = os.umask(0o077) if create else -1
        try:
            fd = open_directory(self.directory, create=create)
        except UnsafePath as e:
            remedy = "give the directory's real path" if str(e) == "it is a symlink" else ""
            raise self._refusal(str(e), remedy) from None
        except OSError as e:
            doing = "create" if create else "open"
            raise CniError(
                IO_FAILURE, f"cannot {doing} state directory {self.directory}", str(e)
            ) from None
        finally:
            if old >= 0:
                os.umask(old)
        if fd is None:
            return None
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                # Made by someone else first (through a writable parent?)
                raise self._refusal(f"it belongs to uid {st.st_uid}")
            mode = st.st_mode & 0o7777
            if mode & 0o022:
                who = "others" if mode & 0o002 else "its group"
                raise self._refusal(f"it is writable by {who} (mode {mode:o})")
            if self.private and mode != 0o700:
                os.fchmod(fd, 0o700)
        except BaseException as e:
            os.close(fd)
            if isinstance(e, OSError):
                raise CniError(
                    IO_FAILURE, f"cannot check state directory {self.directory}", str(e)
                ) from None
            raise
        self._fd = fd
        return fd

    def _stat(self, name: str) -> os.stat_result | None:
        fd = self._open()
        try:
            return None if fd is None else os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _refusal(self, problem: str, remedy: str = "") -> CniError:
        if not remedy:
            remedy = (
                "remove it; the plugins recreate it"
                if self.private
                else f"make it a directory of uid {os.geteuid()} that only it can write, "
                "or point dataDir at one"
            )
        return CniError(
            self.refusal_code,
            f"refusing state directory {self.directory}: {problem}",
            remedy + " (anyone who can write there could make the plugin overwrite files)",
        )

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def write_json(self, name: str, data: Any) -> None:
        """Write atomically: a crash leaves the old file or the new one, never half of one,
        and no stray temporary file that nothing would ever remove.

        The content is written to `<name>.tmp` and renamed over `name`, which works on
        every filesystem. The temporary name is fixed per file: the next write and
        `remove` (DEL) delete a killed writer's leftover, and GC those it finds unchanged
        (AttachmentStore.leftovers). Callers hold the dir's lock while writing (every
        plugin does), so no two writers share that name. No fsync (a cost on every
        container start): the files live in tmpfs, as the kernel state they describe does
        not survive a reboot either.
        """
        self.ensure()
        tmp = name + TMP_SUFFIX
        try:
            # a killed writer's leftover; O_EXCL below never reuses one
            with suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=self._fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW
            fd = os.open(tmp, flags, 0o600, dir_fd=self._fd)
            try:
                os.write(fd, json.dumps(data, sort_keys=True).encode())
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except OSError as e:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=self._fd)
            where = self.path(name)
            raise CniError(IO_FAILURE, f"cannot write state file {where}", str(e)) from None

    def read_bytes(self, name: str) -> bytes | None:
        """The file's bytes, or None when there is none."""
        try:
            dir_fd = self._open()
            if dir_fd is None:
                return None
            with open(os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=dir_fd), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CniError(
                IO_FAILURE, f"cannot read state file {self.path(name)}", str(e)
            ) from None

    def remove(self, name: str) -> None:
        """Remove the file and what a writer killed mid-write may have left beside it
        (that first: a DEL killed in between still finds the attachment's file)."""
        dir_fd = self._open()
        for each in (name + TMP_SUFFIX, name):
            try:
                if dir_fd is not None:
                    os.unlink(each, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise CniError(
                    IO_FAILURE, f"cannot remove state file {self.path(each)}", str(e)
                ) from None

    def names(self, suffix: str = ".json") -> list[str]:
        dir_fd = self._open()
        return [] if dir_fd is None else sorted(n for n in os.listdir(dir_fd) if n.endswith(suffix))

    def holds_other_than(self, name: str) -> bool:
        """Whether a record other than `name` is here; reads only up to the first one."""
        dir_fd = self._open()
        if dir_fd is None:
            return False
        with os.scandir(dir_fd) as entries:
            return any(e.name.endswith(".json") and e.name != name for e in entries)

    def lock(
        self, name: str = "", timeout: float | None = None, *, shared: bool = False, key: str = ""
    ) -> AbstractContextManager[None]:
        """An exclusive lock between plugin processes, taken when the `with` block is
        entered; error 11 when it stays taken. `shared`: a shared one (many holders, none
        while an exclusive one is held). `key`: the lock of that key alone, one of many
        in the one file `name` (see common.lock.flock_with_deadline).

        The lock file stays after the block, on purpose: a waiter on an unlinked file and a
        newcomer locking a fresh one would be two holders at once.
        """
        self.ensure()
        name = name or self.lock_name
        return flock_with_deadline(
            self.path(name), timeout, dir_fd=self._fd, shared=shared, key=key
        )

"""Per-plugin state files: atomic writes, restrictive modes, and a lock with a deadline.

Layout: <root>/<plugin>/ (mode 0700) holding JSON files (mode 0600). The root defaults to
/run/cni/meta-plugins (tmpfs: state does not outlive a reboot, and neither do the netns,
links and rules it describes); CNI_META_STATE_ROOT overrides it, which the tests use.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from common.errors import IO_FAILURE, TRY_AGAIN_LATER, CniError

DEFAULT_ROOT = "/run/cni/meta-plugins"
ROOT_ENV = "CNI_META_STATE_ROOT"
LOCK_TIMEOUT_ENV = "CNI_META_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 30.0


def state_root(environ: dict[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(ROOT_ENV) or DEFAULT_ROOT


def safe_file_name(*parts: str) -> str:
    """A file name from validated identifiers; refuses anything path-like."""
    name = "_".join(parts)
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        raise CniError(IO_FAILURE, f"refusing unsafe state file name {name[:80]!r}")
    return name


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateDir:
    def __init__(self, directory: str) -> None:
        self.directory = directory

    @classmethod
    def for_plugin(cls, plugin: str, root: str | None = None) -> StateDir:
        return cls(os.path.join(root or state_root(), plugin))

    def ensure(self) -> None:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            os.chmod(self.directory, 0o700)
        except OSError as e:
            raise CniError(
                IO_FAILURE, f"cannot create state directory {self.directory}", str(e)
            ) from None

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def write_json(self, name: str, data: Any) -> None:
        """Write atomically: a crash leaves the old file or the new one, never half of one."""
        self.ensure()
        final = self.path(name)
        tmp = f"{final}.tmp.{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, json.dumps(data, sort_keys=True).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, final)
            _fsync_dir(self.directory)
        except OSError as e:
            with suppress(OSError):
                os.unlink(tmp)
            raise CniError(IO_FAILURE, f"cannot write state file {final}", str(e)) from None

    def read_json(self, name: str) -> Any:
        """The file's content, or None when there is none (or it is unreadable garbage)."""
        try:
            with open(self.path(name), "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError:
            # A torn file cannot come from write_json; treat a corrupted one as absent
            # rather than making DEL fail forever.
            return None
        except OSError as e:
            raise CniError(
                IO_FAILURE, f"cannot read state file {self.path(name)}", str(e)
            ) from None

    def remove(self, name: str) -> None:
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise CniError(
                IO_FAILURE, f"cannot remove state file {self.path(name)}", str(e)
            ) from None

    def names(self, suffix: str = ".json") -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.directory) if n.endswith(suffix))
        except FileNotFoundError:
            return []

    @contextmanager
    def lock(self, name: str = "lock", timeout: float | None = None) -> Iterator[None]:
        """An exclusive lock between plugin processes; error 11 when it stays taken.

        flock is released by the kernel when the holder dies, so a SIGKILLed plugin never
        leaves the lock behind.
        """
        if timeout is None:
            timeout = float(os.environ.get(LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT))
        self.ensure()
        fd = os.open(self.path(name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + timeout
            delay = 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                        raise CniError(
                            IO_FAILURE, f"cannot lock {self.path(name)}", str(e)
                        ) from None
                if time.monotonic() >= deadline:
                    raise CniError(
                        TRY_AGAIN_LATER,
                        f"another plugin call holds {self.path(name)}",
                        f"waited {timeout:g}s; try again later",
                    )
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            yield
        finally:
            os.close(fd)  # closing releases the flock

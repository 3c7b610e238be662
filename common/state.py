"""The attachment store: what each plugin remembers per attachment between ADD and DEL.

One JSON file per attachment under <root>/<plugin>/, written atomically, read and written
under a lock with a deadline, swept by GC the same way for every plugin (AttachmentStore).
What a plugin keeps, and how it spells it, is its record type, declared once (Record,
below) and decoded the same way for every plugin. Layout, modes and what stays after the
last DEL: docs/architecture.md ("The attachment store").
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from common import jsontext as json
from common.errors import IO_FAILURE, TRY_AGAIN_LATER, CniError
from common.jsonobj import flag, non_empty
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager
    from typing import Any, ClassVar, Protocol, Self

    from common.gc import AttachmentId
    from common.log import Log

    class Owner(Protocol):
        """Whose entry: a Request, an entry itself, or any (network, container, ifname)."""

        @property
        def network(self) -> str: ...
        @property
        def container_id(self) -> str: ...
        @property
        def ifname(self) -> str: ...

    class Codec(Protocol):
        """A plugin's record type (Record, below): what it keeps for one attachment, to
        and from JSON, and the file it is kept in."""

        @staticmethod
        def file_name(network: str, container_id: str, ifname: str) -> str: ...
        @classmethod
        def from_json(cls, raw: Any) -> Any: ...  # a record, None or ValueError: unusable

    Stamps = dict[str, tuple[int, int]]
    Keys = dict[str, "Key | Flat"]

LOCK_TIMEOUT_ENV = "CNI_META_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 30.0
TMP_SUFFIX = ".tmp"  # <name>.tmp: the replacement being written (see write_json)
# Every state and lock file is opened so: a symlink in its place is an error (ELOOP).
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
_MAX_SYMLINKS = 40  # as the kernel's path walk


class UnsafePath(Exception):
    """A directory on the way to a state directory that someone else could swap."""


def open_directory(path: str, *, create: bool = False) -> int | None:
    """An fd of the directory `path`, reached from / one component at a time with
    O_NOFOLLOW, so that nobody but root (or us) can redirect where it leads; None when it
    does not exist (components missing with `create` are made, mode 0700).

    Whoever can write a directory can rename what is in it: every directory passed on the
    way must belong to root or to us and be writable by nobody else, unless its sticky bit
    keeps others from renaming what they do not own (/tmp), and what is in it is then
    ours (checked as the next step). A symlink on the way is followed only when it is
    root's or ours; the last component is the caller's to check (its fd is returned).
    Raises UnsafePath naming the component, or OSError."""
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
                try:  # noqa: SIM105 (contextlib is not on the call path)
                    os.mkdir(name, 0o700, dir_fd=fds[-1])
                except FileExistsError:
                    pass
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


def safe_file_name(*parts: str) -> str:
    """A file name from validated identifiers; refuses anything path-like."""
    name = "_".join(parts)
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        raise CniError(IO_FAILURE, f"refusing unsafe state file name {name[:80]!r}")
    return name


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

        A new file is written unnamed (O_TMPFILE) and linked into place complete. A file
        that exists is replaced by rename from `<name>.tmp`: a name fixed per file, which
        `remove` deletes too, so a plugin killed mid-write leaves nothing that DEL or GC
        of that attachment misses. Callers hold the dir's lock while writing (every plugin
        does), so no two writers share that name. No fsync (a cost on every container
        start): the files live in tmpfs, as the kernel state they describe does not
        survive a reboot either.
        """
        self.ensure()
        final = self.path(name)
        payload = json.dumps(data, sort_keys=True).encode()
        if self._stat(name) is None and self._create_whole(name, payload):
            return
        tmp = name + TMP_SUFFIX
        try:
            # a killed writer's leftover; O_EXCL below never reuses one
            try:  # noqa: SIM105 (contextlib is not on the call path)
                os.unlink(tmp, dir_fd=self._fd)
            except FileNotFoundError:
                pass
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=self._fd
            )
            try:
                os.write(fd, payload)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except OSError as e:
            try:  # noqa: SIM105
                os.unlink(tmp, dir_fd=self._fd)
            except OSError:
                pass
            raise CniError(IO_FAILURE, f"cannot write state file {final}", str(e)) from None

    def _create_whole(self, name: str, payload: bytes) -> bool:
        """Create `name` with its whole content at once; False when that cannot be done
        this way (no O_TMPFILE on this filesystem, no /proc, or `name` appeared)."""
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=self._fd)
        except OSError:
            return False
        try:
            os.write(fd, payload)
            # A dir fd makes os.link use linkat(AT_SYMLINK_FOLLOW), which links the file
            # behind /proc/self/fd/N; plain link(2) would refuse the magic link (EXDEV).
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=self._fd)
        except OSError:
            return False
        finally:
            os.close(fd)
        return True

    def read_bytes(self, name: str) -> bytes | None:
        """The file's bytes, or None when there is none."""
        try:
            dir_fd = self._open()
            if dir_fd is None:
                return None
            with open(os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd), "rb") as f:
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

    def names(self) -> list[str]:
        dir_fd = self._open()
        return (
            [] if dir_fd is None else sorted(n for n in os.listdir(dir_fd) if n.endswith(".json"))
        )

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
        in the one file `name` (see flock_with_deadline).

        The lock file stays after the block, on purpose: a waiter on an unlinked file and a
        newcomer locking a fresh one would be two holders at once.
        """
        self.ensure()
        name = name or self.lock_name
        return flock_with_deadline(self.path(name), timeout, dir_fd=self._fd, shared=shared,
                                   key=key)  # fmt: skip


class AttachmentStore(StateDir):
    """One record per attachment, in a file the record type names; nothing else reads them.

    A record (Record, below) has `network`, `container_id` and `ifname` (its owner, ""
    where unknown: a file another program wrote) and `to_json()`. `load` and `save` take
    the owner apart from the record, so that a record without one (Go's tuning's) is put
    back where it was found. A record type with a `former_name` is also looked for there
    (see bandwidth's): such a file is read, and replaced by the next save.
    """

    def __init__(self, directory: str, codec: type[Codec], log: Log | None = None) -> None:
        super().__init__(directory)
        self.codec = codec
        self.log = log  # where load says which file it could not use
        self._former = getattr(codec, "former_name", None)

    def file_of(self, owner: Owner) -> str:
        return self.codec.file_name(owner.network, owner.container_id, owner.ifname)

    def _files_of(self, owner: Owner) -> tuple[str, ...]:
        """The attachment's file name, then its former one (when the type had one)."""
        name = self.file_of(owner)
        if self._former is None:
            return (name,)
        former: str = self._former(owner.network, owner.container_id, owner.ifname)
        return (name, former)

    def _found(self, owner: Owner) -> str | None:
        return next((n for n in self._files_of(owner) if self._stat(n) is not None), None)

    def has(self, owner: Owner) -> bool:
        return self._found(owner) is not None

    def load(self, owner: Owner) -> Any:
        """The attachment's record, or None: no file, or one it cannot use (see examine;
        said in the store's log). The caller's next save or forget replaces or removes
        such a file: a DEL forgets it whatever it held, so that it always finishes."""
        name = self._found(owner)
        if name is None:
            return None
        entry, problem = self.examine(name)
        if problem and self.log is not None:
            self.log.warning(f"ignoring unusable state file {self.path(name)}: {problem}")
        return entry

    def read(self, name: str) -> Any:
        return self.examine(name)[0]

    def examine(self, name: str) -> tuple[Any, str]:
        """(entry, "") from the file `name`; (None, "") when there is none; (None, what is
        wrong) when it is there but no call can use it: not JSON, nested too deep, or
        refused by the codec (a value of the wrong type or out of range)."""
        data = self.read_bytes(name)
        if data is None:
            return None, ""
        raw, problem = decode(data)
        if not problem:
            try:
                entry = self.codec.from_json(raw)
            except Exception as e:  # pure decoding of a damaged file: whatever it provokes
                problem = f"{type(e).__name__}: {e}"
            else:
                if entry is not None:
                    return entry, ""
                problem = f"not a {self.codec.__name__}"
        return None, f"{problem[:120]} ({len(data)} bytes: {data[:300]!r})"

    def unusable(self, before: Stamps, prefix: str = "") -> list[tuple[str, str]]:
        """(name, what is wrong) of each file whose name starts with `prefix` that no call
        can use (examine), unchanged since GC started (`before`, see sweep): GC removes
        them, as a DEL does its own. An ADD writes whole files, so a file that changed
        meanwhile is left to the next GC."""
        now = self.stamps()
        out = []
        for name in self.names():
            if name.startswith(prefix) and name in before and before[name] == now.get(name):
                problem = self.examine(name)[1]
                if problem:
                    out.append((name, problem))
        return out

    def save(self, owner: Owner, entry: Any) -> None:
        name, *former = self._files_of(owner)
        self.write_json(name, entry.to_json())
        for each in former:
            self.remove(each)

    def forget(self, owner: Owner) -> None:
        for name in self._files_of(owner):
            self.remove(name)

    def entries(self, network: str) -> dict[str, Any]:
        """File name -> entry of every attachment of `network` (an entry that names
        another attachment than its file's name says is nobody's: left alone)."""
        out = {}
        for name in self.names():
            entry = self.read(name)
            if entry is None or entry.network != network or not entry.container_id:
                continue
            try:
                if name in self._files_of(entry):
                    out[name] = entry
            except CniError:  # an owner no file of ours could be named after
                continue
        return out

    # GC. A runtime lists the attachments it knows; one whose ADD has not returned yet is
    # not in that list, yet it is about to be alive. GC cannot tell it from a leak by the
    # list, so it asks the files: every ADD (re)writes its entry at its end, under the
    # lock GC takes too. A file that appeared or was replaced after GC started belongs to
    # an ADD that was in flight then: GC leaves that attachment alone, and the next GC
    # (whose list was made after the ADD returned) decides. A file exactly as it was when
    # GC started belongs to a call that had ended before: fair game.

    def stamps(self) -> Stamps:
        """name -> (inode, mtime) of each file, taken when GC starts, before it waits for
        the lock that an ADD in flight may hold."""
        out: Stamps = {}
        for name in self.names():
            st = self._stat(name)
            if st is not None:
                out[name] = (st.st_ino, st.st_mtime_ns)
        return out

    def sweep(
        self, network: str, valid: set[AttachmentId], before: Stamps
    ) -> tuple[list[Any], list[Any]]:
        """(stale, in flight): the entries of `network`'s attachments not in `valid`,
        split by whether their file is as it was at `before` (stamps() when GC started).
        Call it holding the lock ADD writes under."""
        from common.gc import AttachmentId

        now = self.stamps()
        stale: list[Any] = []
        in_flight: list[Any] = []
        for name, entry in self.entries(network).items():
            if AttachmentId(entry.container_id, entry.ifname) not in valid:
                (stale if before.get(name) == now.get(name) else in_flight).append(entry)
        return stale, in_flight


# ---------------------------------------------------------------------------- records
# What the store keeps of one attachment, and how it is spelled in JSON, declared once per
# record type.
#
# A record type is a common.values.Value with the owner (`network`, `container_id`,
# `ifname`) and `committed` (common.attachment) from `Record`, its own fields, and in `KEYS`
# the JSON key and the decoder of each of its own fields:
#
#     class Shaping(Record):
#         device: str = ""
#         netns: str = ""
#         KEYS = {"device": Key("device", non_empty, required=True),
#                 "netns": Key("netns", text)}
#
# Decoding is the same for every type. An absent key (or null) gives the field's default,
# but for a `required` key of a strict record, which is unusable without it. A value its
# decoder refuses (ValueError) makes the whole record unusable, naming the key (the store
# then ignores the file, DEL forgets it, GC removes it), unless the type is `TOLERANT`:
# then the field takes its default, for files that other programs write too. A field
# whose value is None (or encodes to None) is not written.
#
# Files are named `<network tag>-<attachment tag>.json` (`tagged_name`), so that GC can
# tell a network's files by their names alone; a type may keep another name (tuning keeps
# Go's, for takeover).


def tagged_name(network: str, container_id: str, ifname: str) -> str:
    """`<network hash>-<attachment hash>.json`: GC tells a network's files by the first
    part (portmap's kernel objects carry the same tag)."""
    from common.digest import sha256_hex

    raw = "\0".join((network, container_id, ifname)).encode()
    return f"{sha256_hex(network.encode())[:8]}-{sha256_hex(raw)[:16]}.json"


def _same(value: Any) -> Any:
    return value


class Key(Value):
    """A field's JSON key, its decoder, (when the JSON is not the value) its encoder, and
    whether a strict record is unusable without it (else its absence is the default)."""

    json: str
    decode: Callable[[Any], Any]
    encode: Callable[[Any], Any] = _same
    required: bool = False


class Flat(Value):
    """A field that is a Value of its own, whose keys sit in the record's object."""

    of: type[Value]
    keys: Keys


# A strict record is nobody's without its owner.
BASE_KEYS: Keys = {
    "network": Key("network", non_empty, required=True),
    "container_id": Key("containerID", non_empty, required=True),
    "ifname": Key("ifname", non_empty, required=True),
    "committed": Key("committed", flag),
}


def _encode(value: Value, keys: Keys, out: dict[str, Any]) -> None:
    for field, key in keys.items():
        item = getattr(value, field)
        if isinstance(key, Flat):
            _encode(item, key.keys, out)
            continue
        if item is not None:
            item = key.encode(item)
        if item is not None:
            out[key.json] = item


def _decode(of: type[Value], raw: dict[str, Any], keys: Keys, tolerant: bool) -> Any:
    fields: dict[str, Any] = {}
    for field, key in keys.items():
        if isinstance(key, Flat):
            fields[field] = _decode(key.of, raw, key.keys, tolerant)
            continue
        value = raw.get(key.json)
        if value is None:
            if key.required and not tolerant:
                raise ValueError(f"{key.json} is missing")
            continue
        try:
            fields[field] = key.decode(value)
        except ValueError as e:
            if not tolerant:
                raise ValueError(f"{key.json} {e}") from None
    return of(**fields)


class Record(Value):
    """The base of every record type (see "records" above)."""

    network: str = ""
    container_id: str = ""
    ifname: str = ""
    committed: bool = False
    KEYS: ClassVar[Keys] = {}
    TOLERANT: ClassVar[bool] = False

    @staticmethod
    def file_name(network: str, container_id: str, ifname: str) -> str:
        return tagged_name(network, container_id, ifname)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        _encode(self, BASE_KEYS | self.KEYS, out)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Self | None:
        """The record in `raw` (None when it is not even an object); ValueError when one
        of its values is not as `to_json` writes it (see "records" above)."""
        if not isinstance(raw, dict):
            return None
        record: Self = _decode(cls, raw, BASE_KEYS | cls.KEYS, cls.TOLERANT)
        return record


def decode(data: bytes) -> tuple[Any, str]:
    """(content, "") of a state file's bytes, or (None, why) for bytes that are not JSON we
    can decode. A torn file cannot come from write_json, but a damaged or planted one must
    not make every DEL fail: RecursionError (thousands of nested arrays) is caught as well
    as ValueError (not JSON, not UTF-8)."""
    try:
        return json.loads(data), ""
    except (ValueError, RecursionError) as e:
        return None, f"{type(e).__name__}: {e}"


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


def _flock(fd: int, path: str, timeout: float, operation: int = fcntl.LOCK_EX,
           byte: int = -1) -> bool:  # fmt: skip
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


class flock_with_deadline:  # lower case: called like the function it was
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
    any close of the file in it: only this class opens such a file, once per block.

    A class rather than a @contextmanager generator: contextlib (with functools and
    collections) is not otherwise loaded by a DEL that finds nothing to do.
    """

    __slots__ = ("byte", "dir_fd", "fd", "operation", "path", "timeout")

    def __init__(self, path: str, timeout: float | None = None, *, dir_fd: int | None = None,
                 shared: bool = False, key: str = ""):  # fmt: skip
        self.path, self.timeout, self.dir_fd, self.fd = path, timeout, dir_fd, -1
        self.operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        self.byte = -1
        if key:
            from common.digest import sha256_hex

            self.byte = int(sha256_hex(key.encode())[:15], 16)  # below 2**60: any off_t

    def __enter__(self) -> None:
        path = self.path
        timeout = lock_timeout() if self.timeout is None else self.timeout
        try:
            name = path if self.dir_fd is None else os.path.basename(path)
            fd = os.open(name, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600, dir_fd=self.dir_fd)
        except OSError as e:
            raise CniError(IO_FAILURE, f"cannot open lock file {path}", str(e)) from None
        try:
            if not _flock(fd, path, timeout, self.operation, self.byte):
                raise CniError(
                    TRY_AGAIN_LATER,
                    f"another plugin call holds {path}",
                    f"waited {timeout:g}s ({LOCK_TIMEOUT_ENV}); try again later",
                )
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)  # closing releases the flock

"""The lease store: host-local's lease files, and our index of them.

Leases are host-local's, byte for byte, so that either plugin frees the other's: in
`<dataDir>/<network>/`, one file per address named by it (Go's spelling, addr.format_ip)
holding `<containerID>\\r\\n<ifname>`, the cursor `last_reserved_ip.<range set index>`,
and the `lock` file both plugins flock around every call.

What host-local finds by reading every file (which lease is whose), we keep in an index:
one record per attachment (Lease, a common.state record) in
`<dataDir>/.flatnet-ipam/<network>/`, written through the attachment engine
(common.attachment: intent before a lease exists, confirm, undo, teardown, GC's sweep),
plus the file `seen`: the boot we last ran in and the lease directory's (inode, mtime)
after our last change. So no call of ours reads the other leases:

- ADD probes candidates from the cursor by name (stat), claims one by linking a complete
  unnamed file (O_TMPFILE) to its name: linkat fails with EEXIST when it is taken, and a
  kill at any point leaves no lease or a whole one, never an empty file;
- DEL and CHECK read the attachment's record and its own lease files only;
- the directory changing behind our back (host-local, an operator) shows as another
  (inode, mtime): the next call adopts what appeared (records for host-local's leases)
  by one scan. That scan, a GC's scan, and the first call after a reboot (which frees
  every lease recorded in an earlier boot) are the only walks, and none repeats per call.
"""

from __future__ import annotations

import os

from common import state
from common.errors import (
    CHECK_FAILED,
    CONFLICT,
    INVALID_CONFIG,
    IO_FAILURE,
    STATUS_UNAVAILABLE,
    CniError,
)
from common.jsonobj import flag, listed, non_empty
from common.state import AttachmentStore, Key, flock_with_deadline
from common.values import field
from flatnet_ipam.addr import format_cidr, format_ip, parse_ip

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from common.gc import AttachmentId
    from common.log import Log
    from common.result import DNS, Result
    from common.state import Owner as StoreOwner
    from flatnet_ipam.config import IpamConfig, Range, RangeSet

INDEX_DIR = ".flatnet-ipam"  # in dataDir; no network is named so (names start alnum)
SEEN = "seen"  # not *.json: the store's listings are records only
CURSOR = "last_reserved_ip."
LOCK = "lock"
TMP_PREFIX = ".flatnet-ipam."  # a lease written under a name first (no O_TMPFILE here)
BOOT_ID = "/proc/sys/kernel/random/boot_id"
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _addresses(value: object) -> list[str]:
    out = [non_empty(item) for item in listed(value)]
    for item in out:
        if parse_ip(item) is None:
            raise ValueError(f"has {item[:60]!r}, not an address")
    return out


class Lease(state.Record):
    """An attachment's leases: the file names (addresses) it holds, the boot it got them
    in, and whether we adopted them from another writer (host-local)."""

    addresses: list[str] = field(default_factory=list)
    boot: str = ""
    adopted: bool = False
    KEYS = {
        "addresses": Key("addresses", _addresses, required=True),
        "boot": Key("boot", non_empty, required=True),
        "adopted": Key("adopted", flag),
    }

    @staticmethod
    def file_name(network: str, container_id: str, ifname: str) -> str:
        """common.state.tagged_name, the network's part computed once per process: a GC
        names thousands of records of one network."""
        from common.digest import sha256_hex

        tag = _NETWORK_TAGS.get(network)
        if tag is None:
            tag = _NETWORK_TAGS[network] = sha256_hex(network.encode())[:8]
        raw = "\0".join((network, container_id, ifname)).encode()
        return f"{tag}-{sha256_hex(raw)[:16]}.json"

    @classmethod
    def from_json(cls, raw: Any) -> Lease | None:
        """As common.state.Record.from_json decodes by KEYS, without its generic walk (a
        GC decodes thousands); tests/unit hold the two to the same answers."""
        if not isinstance(raw, dict):
            return None
        owner = [raw.get(k) for k in ("network", "containerID", "ifname")]
        for key, value in zip(("network", "containerID", "ifname"), owner, strict=True):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{key} is missing" if value is None else f"{key} is not valid")
        committed, adopted = raw.get("committed", False), raw.get("adopted", False)
        for key, value in (("committed", committed), ("adopted", adopted)):
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{key} is not true or false")
        boot = raw.get("boot")
        if not isinstance(boot, str) or not boot:
            raise ValueError("boot is missing" if boot is None else "boot is not valid")
        if raw.get("addresses") is None:
            raise ValueError("addresses is missing")
        addresses = _addresses(raw["addresses"])
        network, container_id, ifname = (str(v) for v in owner)
        return cls(network, container_id, ifname, bool(committed), addresses, boot, bool(adopted))


_NETWORK_TAGS: dict[str, str] = {}


def boot_id() -> str:
    """This boot's id: a reboot changes it, a clock step does not."""
    try:
        with open(BOOT_ID, "rb") as f:
            return f.read().decode().strip() or "unknown"
    except OSError:
        return "unknown"


def lease_content(container_id: str, ifname: str) -> bytes:
    return f"{container_id}\r\n{ifname}".encode()


class _Held:
    """The network's lock for a block; re-entrant within one LeaseStore (flock is per
    open file: a second flock of ours on the same file would wait for ourselves)."""

    __slots__ = ("leases",)

    def __init__(self, leases: LeaseStore) -> None:
        self.leases = leases

    def __enter__(self) -> None:
        leases = self.leases
        if leases._depth == 0:
            lock = flock_with_deadline(os.path.join(leases.lease_dir, LOCK), None)
            leases.open_lease_dir()
            lock.__enter__()
            leases._lock = lock
        leases._depth += 1

    def __exit__(self, *exc: object) -> None:
        leases = self.leases
        leases._depth -= 1
        if leases._depth == 0 and leases._lock is not None:
            leases._entries = None  # what another process may change from now on
            leases._lock.__exit__(*exc)
            leases._lock = None


class LeaseStore(AttachmentStore):
    """The index (an AttachmentStore of Lease records) and the lease directory it indexes,
    under host-local's lock (`lock` overrides the store's own: one lock for both)."""

    def __init__(self, config: IpamConfig, log: Log) -> None:
        super().__init__(os.path.join(config.data_dir, INDEX_DIR, config.network), Lease, log)
        self.config = config
        self.logger = log
        self.lease_dir = config.lease_dir
        self.boot = boot_id()
        self._depth = 0
        self._lock: flock_with_deadline | None = None
        self._dfd = -1
        self._seen: dict[str, object] | None = None
        # The records, read once per lock held (the scans and GC's sweep need them all).
        self._entries: dict[str, Any] | None = None
        # A lease of a record named another attachment: the address changed hands behind
        # our back, so the next call reads every lease file again (see adopt).
        self.rescan_next = False

    def __del__(self) -> None:
        if self._dfd >= 0:
            os.close(self._dfd)
        super().__del__()

    def lock(self, name: str = "", timeout: float | None = None) -> _Held:  # type: ignore[override]
        return _Held(self)

    def entries(self, network: str) -> dict[str, Any]:
        if self._entries is None or self._depth == 0:
            self._entries = super().entries(network)
        return self._entries

    def save(self, owner: StoreOwner, entry: Any) -> None:
        super().save(owner, entry)
        if self._entries is not None:
            self._entries[self.file_of(owner)] = entry

    def forget(self, owner: StoreOwner) -> None:
        name = self.file_of(owner)  # (a Lease has no former name)
        self.remove(name)
        if self._entries is not None:
            self._entries.pop(name, None)

    # ------------------------------------------------------------ the lease directory

    def open_lease_dir(self) -> int:
        """The lease directory's fd, made as host-local makes it (0755) when missing."""
        if self._dfd < 0:
            try:
                os.makedirs(self.lease_dir, 0o755, exist_ok=True)
                self._dfd = os.open(self.lease_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as e:
                raise CniError(
                    IO_FAILURE, f"cannot open lease directory {self.lease_dir}", str(e)
                ) from None
        return self._dfd

    def _io_error(self, doing: str, name: str, e: OSError) -> CniError:
        return CniError(IO_FAILURE, f"cannot {doing} {os.path.join(self.lease_dir, name)}", str(e))

    def taken(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self._dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise self._io_error("look at lease", name, e) from None
        return True

    def holder(self, name: str) -> bytes | None:
        """The lease file's content, stripped as host-local compares it; None: no file."""
        try:
            fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=self._dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._io_error("read lease", name, e) from None
        try:
            return os.read(fd, 4096).strip()
        finally:
            os.close(fd)

    def claim(self, name: str, content: bytes) -> bool:
        """Create the lease `name` holding `content`, whole or not at all; False when it
        is taken. The file is written unnamed and linked into place: linkat refuses a
        name that exists, and a kill before the link leaves nothing."""
        dfd = self._dfd
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        except OSError:
            return self._claim_by_name(name, content)
        try:
            os.write(fd, content)
            # A dir fd makes os.link use linkat(AT_SYMLINK_FOLLOW), which links the file
            # behind /proc/self/fd/N (see common.state.StateDir._create_whole).
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd)
        except FileExistsError:
            return False
        except OSError as e:
            raise self._io_error("create lease", name, e) from None
        finally:
            os.close(fd)
        return True

    def _claim_by_name(self, name: str, content: bytes) -> bool:
        """claim() where O_TMPFILE is missing: a temporary name, linked (EEXIST when
        taken), then unlinked. A kill in between leaves the temporary file, which the
        next scan under the lock removes (all our writers hold it)."""
        dfd = self._dfd
        tmp = f"{TMP_PREFIX}{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644, dir_fd=dfd)
            try:
                os.write(fd, content)
            finally:
                os.close(fd)
            try:
                os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                return False
            return True
        except OSError as e:
            raise self._io_error("create lease", name, e) from None
        finally:
            try:  # noqa: SIM105 (contextlib is not on the call path)
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass

    def free(self, name: str, content: bytes) -> bool:
        """Remove the lease `name` if it still holds `content` (a file that names another
        attachment now is theirs); True when it was removed."""
        held = self.holder(name)
        if held != content:
            if held:
                self.rescan_next = True
            return False
        try:
            os.unlink(name, dir_fd=self._dfd)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise self._io_error("remove lease", name, e) from None
        return True

    def cursor(self, index: int) -> tuple[int, int] | None:
        """The last address handed out from range set `index` (host-local's cursor)."""
        data = self.holder(f"{CURSOR}{index}")
        return None if data is None else parse_ip(data.decode("ascii", "replace"))

    def write_cursor(self, index: int, name: str) -> None:
        """As host-local writes it (truncate and write): a torn cursor only loses the
        round-robin position once, as host-local says of a wrong one."""
        try:
            fd = os.open(
                f"{CURSOR}{index}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644,
                dir_fd=self._dfd,
            )  # fmt: skip
            try:
                os.write(fd, name.encode())
            finally:
                os.close(fd)
        except OSError as e:
            raise self._io_error("write", f"{CURSOR}{index}", e) from None

    def _dir_stamp(self) -> list[int]:
        st = os.fstat(self._dfd)
        return [st.st_ino, st.st_mtime_ns]

    # ------------------------------------------------------------ what we saw last

    def _read_seen(self) -> dict[str, object] | None:
        data = self.read_bytes(SEEN)
        if data is None:
            return None
        raw = state.decode(data)[0]
        return raw if isinstance(raw, dict) else None

    def note_seen(self) -> None:
        """Remember this boot and the lease directory as our last change left it.

        A change to the directory sets its mtime to the kernel's coarse clock, so a change
        by another writer within the same tick as ours would leave the mtime we recorded.
        After a change of ours the mtime is set one nanosecond back: whatever changes the
        directory next sets it to a clock reading at or after ours, never to that value."""
        ino, mtime = self._dir_stamp()
        recorded = self._seen.get("dir") if self._seen is not None else None
        if recorded != [ino, mtime]:
            try:
                os.utime(self._dfd, ns=(os.fstat(self._dfd).st_atime_ns, mtime - 1))
                mtime -= 1
            except OSError as e:
                raise self._io_error("set the mtime of", ".", e) from None
        # [0, 0] matches no directory: the next call reads every lease file again.
        stamp = [0, 0] if self.rescan_next else [ino, mtime]
        seen: dict[str, object] = {"boot": self.boot, "dir": stamp}
        if seen != self._seen:
            self.write_json(SEEN, seen)
            self._seen = seen

    def prepare(self, *, scan: bool = False) -> list[str]:
        """Under the lock, before a verb: adopt the leases another writer made since our
        last call (or all of them the first time, or with `scan`), then, in the first call
        after a reboot, free every lease recorded in an earlier boot. Returns the record
        files the adoption wrote."""
        seen = self._seen = self._read_seen()
        adopted: list[str] = []
        if seen is None or seen.get("dir") != self._dir_stamp():
            adopted = self.adopt(read_all=True)
        elif scan:
            adopted = self.adopt(read_all=False)
        if seen is not None and seen.get("boot") != self.boot and self.config.release_on_reboot:
            self.release_earlier_boots()
        return adopted

    def adopt(self, *, read_all: bool) -> list[str]:
        """One scan of the lease directory: every lease no record of ours lists gets one
        (an adopted record, of this boot: we cannot tell when another writer made it, and
        freeing a live lease would hand its address out twice). Empty lease files (a writer
        killed between create and write: no DEL would ever match them) and our temporary
        files are removed: under the lock, no writer is between those steps.

        Without `read_all` (GC's scan, when nothing changed behind our back), a lease that
        a record lists is not read: freeing it checks whose it is, and one found to be
        another's makes the next call read them all (rescan_next)."""
        found: dict[tuple[str, str], list[str]] = {}
        records = self.entries(self.config.network)
        listed = {n: r for r in records.values() for n in r.addresses}
        dfd = self._dfd
        for name in os.listdir(dfd):
            if name.startswith(TMP_PREFIX):
                self._unlink_quietly(name)
                continue
            if not _is_lease_name(name):
                continue
            record = listed.get(name)
            if record is not None and not read_all:
                continue
            content = self.holder(name)
            if content is None:
                continue
            if not content:
                self._unlink_quietly(name)
                self.logger.info(f"removed the empty lease {name}")
                continue
            if record is not None and content == lease_content(record.container_id, record.ifname):
                continue
            cid, sep, ifname = content.decode("utf-8", "replace").partition("\r\n")
            if sep and cid and ifname:
                found.setdefault((cid, ifname), []).append(name)
        written = []
        for (cid, ifname), names in found.items():
            owner = Owner(self.config.network, cid, ifname)
            record = records.get(self.file_of(owner))
            if record is not None and all(n in record.addresses for n in names):
                continue
            if record is None:
                record = Lease(
                    self.config.network, cid, ifname, True, names, self.boot, adopted=True
                )
            else:
                extra = [n for n in names if n not in record.addresses]
                record = record.replace(addresses=[*record.addresses, *extra])
            self.save(owner, record)
            written.append(self.file_of(owner))
            self.logger.info(f"adopted the leases {', '.join(names)} of {cid}/{ifname}")
        return written

    def release_earlier_boots(self) -> None:
        """Free every lease recorded in an earlier boot: no container outlives a reboot."""
        for record in list(self.entries(self.config.network).values()):
            if record.boot != self.boot:
                freed = self.free_all(record)
                self.forget(record)
                self.logger.info(
                    f"freed {', '.join(freed) or 'nothing'} of {record.container_id}/"
                    f"{record.ifname}: leased before this boot"
                )

    def free_all(self, record: Lease | None) -> list[str]:
        if record is None:
            return []
        content = lease_content(record.container_id, record.ifname)
        return [n for n in record.addresses if self.free(n, content)]

    def _unlink_quietly(self, name: str) -> None:
        try:  # noqa: SIM105
            os.unlink(name, dir_fd=self._dfd)
        except OSError:
            pass


class Owner:
    """An attachment, as the store names its record."""

    __slots__ = ("container_id", "ifname", "network")

    def __init__(self, network: str, container_id: str, ifname: str) -> None:
        self.network, self.container_id, self.ifname = network, container_id, ifname


def _is_lease_name(name: str) -> bool:
    parsed = parse_ip(name)
    return parsed is not None and format_ip(*parsed) == name


def candidates(ranges: RangeSet, last: tuple[int, int] | None) -> Iterator[tuple[Range, int]]:
    """host-local's RangeIter: from the address after `last` (or the set's first when
    `last` is in none of its ranges), through every range of the set, wrapping, until
    back where it started; gateways skipped."""
    rs = ranges.ranges
    if last is not None and (r := ranges.range_for(*last)) is not None:
        idx, cur, start = rs.index(r), last[1], None
    else:
        idx, cur, start = 0, None, rs[0].start
    while True:
        r = rs[idx]
        if cur is None:
            cur = start = r.start
        elif cur == r.end:
            idx = (idx + 1) % len(rs)
            r = rs[idx]
            cur = r.start
            if start is None:
                start = cur
            elif cur == start:
                return
        else:
            cur += 1
            if start is None:
                start = cur
            elif cur == start:
                return
        if cur != r.gateway:
            yield r, cur


# ---------------------------------------------------------------------------- verbs


def _quiet_log(log: Log | None) -> Log:
    if log is not None:
        return log
    from common.log import Log

    return Log()


def allocate(config: IpamConfig, container_id: str, ifname: str, log: Log | None) -> Result:
    from common.attachment import Engine

    log = _quiet_log(log)
    leases = LeaseStore(config, log)
    owner = Owner(config.network, container_id, ifname)
    content = lease_content(container_id, ifname)
    with leases.lock():
        leases.prepare()
        with Engine(leases, log).add(owner) as change:
            previous: Lease | None = change.previous
            held = [] if previous is None else list(previous.addresses)
            chosen = _choose(config, leases, held, content)
            names = [format_ip(family, value) for _, _, family, value in chosen]
            # What it held and keeps no more (a range set the config no longer has, a
            # request for another address): recorded until freed, below.
            dropped = [n for n in held if n not in names]

            def undo() -> None:
                # All of them, those it held before too: a failed ADD leaves the
                # attachment nothing, and its record is forgotten.
                for name in [*names, *dropped]:
                    leases.free(name, content)

            record = Lease(config.network, container_id, ifname, False, names, leases.boot)
            change.intend(record.replace(addresses=[*names, *dropped]), undo=undo)
            for (index, fresh, _, _), name in zip(chosen, names, strict=True):
                if fresh:
                    if not leases.claim(name, content):
                        raise CniError(
                            CONFLICT,
                            f"address {name} was taken while this ADD held the lock",
                            "a writer that does not take the network's lock? try again",
                        )
                    leases.write_cursor(index, name)
            for name in dropped:
                leases.free(name, content)
            change.confirm(record)
        leases.note_seen()
    return _result(config, chosen)


def _choose(
    config: IpamConfig, leases: LeaseStore, held: list[str], content: bytes
) -> list[tuple[int, bool, int, int]]:
    """(range set index, whether to claim it, family, address) per range set: an address
    the attachment already holds in that set, else the one requested, else the next free
    one after the cursor."""
    requested = list(config.requested)
    out: list[tuple[int, bool, int, int]] = []
    for index, ranges in enumerate(config.range_sets):
        mine = next(
            (
                p
                for p in map(parse_ip, held)
                if p is not None and ranges.range_for(*p) is not None
                and leases.holder(format_ip(*p)) == content
            ),
            None,
        )  # fmt: skip
        asked = next((p for p in requested if ranges.range_for(*p) is not None), None)
        if asked is not None:
            requested.remove(asked)
        if mine is not None and (asked is None or asked == mine):
            out.append((index, False, *mine))
            continue
        if asked is not None:
            family, value = asked
            name = format_ip(family, value)
            r = ranges.range_for(family, value)
            if r is not None and value == r.gateway:
                raise CniError(CONFLICT, f"requested address {name} is the subnet's gateway")
            if leases.taken(name):
                raise CniError(
                    CONFLICT,
                    f"requested IP address {name} is not available in range set {ranges}",
                    f"it is leased (file {os.path.join(leases.lease_dir, name)})",
                )
            out.append((index, True, family, value))
            continue
        for r, value in candidates(ranges, leases.cursor(index)):
            if not leases.taken(format_ip(r.family, value)):
                out.append((index, True, r.family, value))
                break
        else:
            raise CniError(CONFLICT, f"no IP addresses available in range set: {ranges}")
    if requested:
        raise CniError(
            INVALID_CONFIG,
            "failed to allocate all requested IPs: " + " ".join(format_ip(*p) for p in requested),
            "each requested address must be in one of the range sets, one per set",
        )
    return out


def _result(config: IpamConfig, chosen: list[tuple[int, bool, int, int]]) -> Result:
    from common.result import DNS, IPConfig, Result

    ips = []
    gateways: dict[int, str] = {}
    for index, _, family, value in chosen:
        r = config.range_sets[index].range_for(family, value)
        assert r is not None
        gateway = format_ip(family, r.gateway)
        gateways.setdefault(family, gateway)
        ips.append(IPConfig(address=format_cidr(family, value, r.prefix), gateway=gateway))
    routes = [
        route if route.gw else route.replace(gw=gateways.get(6 if ":" in route.dst else 4, ""))
        for route in config.routes
    ]
    dns = DNS() if not config.resolv_conf else _resolv_conf(config.resolv_conf)
    return Result(ips=ips, routes=routes, dns=dns)


def _resolv_conf(path: str) -> DNS:
    """The DNS settings of a resolv.conf, as host-local reads them (nameserver, domain,
    search, options; `#` and `;` start a comment)."""
    from common.result import DNS

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise CniError(INVALID_CONFIG, f"cannot read ipam.resolvConf {path}", str(e)) from None
    nameservers: list[str] = []
    domain = ""
    search: list[str] = []
    options: list[str] = []
    for line in lines:
        words = line.split()
        if not words or words[0][0] in "#;":
            continue
        key, values = words[0], words[1:]
        if key == "nameserver" and values:
            nameservers.append(values[0])
        elif key == "domain" and values:
            domain = values[0]
        elif key == "search":
            search = values
        elif key == "options":
            options += values
    return DNS(tuple(nameservers), domain, tuple(search), tuple(options))


def release(config: IpamConfig, container_id: str, ifname: str, log: Log | None) -> list[str]:
    from common.attachment import Engine

    log = _quiet_log(log)
    leases = LeaseStore(config, log)
    with leases.lock():
        leases.prepare()
        freed: list[str] = Engine(leases, log).delete(
            Owner(config.network, container_id, ifname), leases.free_all
        )
        leases.note_seen()
    return freed


def check(config: IpamConfig, container_id: str, ifname: str, log: Log | None) -> list[str]:
    log = _quiet_log(log)
    leases = LeaseStore(config, log)
    owner = Owner(config.network, container_id, ifname)
    content = lease_content(container_id, ifname)
    with leases.lock():
        leases.prepare()
        record: Lease | None = leases.load(owner)
        leases.note_seen()
        if record is None:
            raise CniError(
                CHECK_FAILED, f"no lease of {container_id}/{ifname} in network {config.network}"
            )
        if not record.committed:
            raise CniError(CHECK_FAILED, f"the ADD of {container_id}/{ifname} did not finish")
        held = []
        for ranges in config.range_sets:
            name = next(
                (n for n in record.addresses if (p := parse_ip(n)) and ranges.range_for(*p)),
                None,
            )
            if name is None:
                raise CniError(CHECK_FAILED, f"{container_id}/{ifname} has no lease in {ranges}")
            if leases.holder(name) != content:
                raise CniError(
                    CHECK_FAILED,
                    f"the lease {name} of {container_id}/{ifname} is gone",
                    f"{os.path.join(leases.lease_dir, name)} is missing or names another",
                )
            held.append(name)
    return held


def gc(config: IpamConfig, valid: set[AttachmentId], log: Log | None) -> None:
    from common.attachment import Engine

    log = _quiet_log(log)
    leases = LeaseStore(config, log)
    # Before the lock, which an ADD in flight may hold: what was there when GC started.
    before = leases.stamps()
    try:
        names_before = set(os.listdir(config.lease_dir))
    except FileNotFoundError:
        names_before = set()
    except OSError as e:
        raise CniError(IO_FAILURE, f"cannot list {config.lease_dir}", str(e)) from None
    with leases.lock():
        adopted = leases.prepare(scan=True)
        records = leases.entries(config.network)
        for name in adopted:
            record, st = records.get(name), leases._stat(name)
            # Adopted from leases that were all there when GC started: not an ADD in flight.
            if record is not None and st and all(n in names_before for n in record.addresses):
                before[name] = (st.st_ino, st.st_mtime_ns)
        with Engine(leases, log).collecting(config.network, valid, leases.free_all, before=before):
            pass
        leases.note_seen()


def status(config: IpamConfig, log: Log | None) -> None:
    log = _quiet_log(log)
    leases = LeaseStore(config, log)
    try:
        with leases.lock():
            leases.prepare()
            leases.note_seen()
            for index, ranges in enumerate(config.range_sets):
                if not any(
                    not leases.taken(format_ip(r.family, v))
                    for r, v in candidates(ranges, leases.cursor(index))
                ):
                    raise CniError(
                        STATUS_UNAVAILABLE,
                        f"no IP addresses available in range set {index}: {ranges}",
                    )
    except CniError as e:
        if e.code == STATUS_UNAVAILABLE:
            raise
        raise CniError(
            STATUS_UNAVAILABLE, f"the lease store cannot be used: {e.msg}", e.details
        ) from None

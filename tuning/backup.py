"""tuning's entry in the attachment store: the originals of what ADD changed, kept until DEL
puts them back.

One file per attachment (common.state's AttachmentStore, in the dataDir),
``<dataDir>/<containerID>_<ifName>.json`` like Go's tuning, in a format both read: Go's
keys (``mac``, ``mtu``, ``promisc``, ``allmulti``, ``txQLen``) plus ``sysctls`` (which Go
never restores), and who owns the file (``network``, ``containerID``, ``ifName``) for GC.
So a container set up by Go's tuning is restored by this one, and the other way round for
the link attributes.
"""

from __future__ import annotations

from common.errors import INVALID_CONFIG
from common.state import AttachmentStore, safe_file_name
from common.values import Value
from tuning.plan import LinkState, Plan

TYPE_CHECKING = False  # avoids importing typing at runtime
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from common.state import Owner

LOCK_NAME = "tuning.lock"
# NAME_MAX less the room once kept for a ".tmp.<pid>" suffix (state files now use ".tmp"):
# kept as it was, so that every backup file keeps the name it was written under.
MAX_FILE_NAME = 255 - len(".tmp.4194304")


class Backup(Value):
    """Original values; None (or absent from `sysctls`) means "not changed by us"."""

    __slots__ = (
        "allmulti",
        "container_id",
        "ifname",
        "mac",
        "mtu",
        "network",
        "promisc",
        "sysctls",
        "tx_qlen",
    )

    mac: str | None
    mtu: int | None
    promisc: bool | None
    allmulti: bool | None
    tx_qlen: int | None
    # (path below /proc/sys, original value), in the order they were first changed
    sysctls: list[tuple[str, str]]
    network: str
    container_id: str
    ifname: str

    def __init__(
        self,
        mac: str | None = None,
        mtu: int | None = None,
        promisc: bool | None = None,
        allmulti: bool | None = None,
        tx_qlen: int | None = None,
        sysctls: list[tuple[str, str]] | None = None,
        network: str = "",
        container_id: str = "",
        ifname: str = "",
    ) -> None:
        self.mac = mac
        self.mtu = mtu
        self.promisc = promisc
        self.allmulti = allmulti
        self.tx_qlen = tx_qlen
        self.sysctls = [] if sysctls is None else sysctls
        self.network = network
        self.container_id = container_id
        self.ifname = ifname

    @staticmethod
    def file_name(network: str, container_id: str, ifname: str) -> str:
        """Go's name (the network is not part of it), unless it would not fit in a directory
        entry (MAX_FILE_NAME, leaving room for the suffix of an atomic write): runtimes
        may send container ids of up to 1024 characters, which then get a hashed name.
        Go's tuning cannot write such a file at all, so no compatibility is lost."""
        name = safe_file_name(container_id, ifname) + ".json"
        if len(name.encode()) <= MAX_FILE_NAME:
            return name
        from common.digest import sha256_hex

        digest = sha256_hex(container_id.encode())[:32]
        return safe_file_name(f"{container_id[:64]}-{digest}", ifname) + ".json"

    @property
    def has_link(self) -> bool:
        return any(
            v is not None for v in (self.mac, self.mtu, self.promisc, self.allmulti, self.tx_qlen)
        )

    def keeping_older(self, older: Backup | None) -> Backup:
        """This backup with `older`'s values where both have one: a second ADD must not
        record the values the first ADD set as "originals"."""
        if older is None:
            return self
        known = {path for path, _ in older.sysctls}
        return Backup(
            mac=older.mac if older.mac is not None else self.mac,
            mtu=older.mtu if older.mtu is not None else self.mtu,
            promisc=older.promisc if older.promisc is not None else self.promisc,
            allmulti=older.allmulti if older.allmulti is not None else self.allmulti,
            tx_qlen=older.tx_qlen if older.tx_qlen is not None else self.tx_qlen,
            sysctls=older.sysctls + [(p, v) for p, v in self.sysctls if p not in known],
            network=older.network or self.network,
            container_id=older.container_id or self.container_id,
            ifname=older.ifname or self.ifname,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in (
            ("mac", self.mac),
            ("mtu", self.mtu),
            ("promisc", self.promisc),
            ("allmulti", self.allmulti),
            ("txQLen", self.tx_qlen),
        ):
            if value is not None:
                out[key] = value
        if self.sysctls:
            out["sysctls"] = [{"path": p, "value": v} for p, v in self.sysctls]
        out["network"] = self.network
        out["containerID"] = self.container_id
        out["ifName"] = self.ifname
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Backup:
        """Tolerant: a file from Go's tuning or an older version of ours reads fine, and a
        field of the wrong type is dropped rather than making DEL fail forever."""
        if not isinstance(raw, dict):
            return cls()

        def typed(key: str, kind: type) -> Any:
            value = raw.get(key)
            if isinstance(value, bool) and kind is not bool:
                return None
            return value if isinstance(value, kind) else None

        mtu = typed("mtu", int)
        tx_qlen = typed("txQLen", int)
        sysctls = []
        for entry in raw.get("sysctls") or []:
            if isinstance(entry, dict):
                path, value = entry.get("path"), entry.get("value")
                if isinstance(path, str) and isinstance(value, str):
                    sysctls.append((path, value))
        return cls(
            mac=typed("mac", str) or None,
            mtu=mtu if mtu else None,  # Go writes 0 for "not changed"
            promisc=typed("promisc", bool),
            allmulti=typed("allmulti", bool),
            tx_qlen=tx_qlen if tx_qlen is not None and tx_qlen >= 0 else None,
            sysctls=sysctls,
            network=typed("network", str) or "",
            container_id=typed("containerID", str) or "",
            ifname=typed("ifName", str) or "",
        )


def originals(plan: Plan, link: LinkState | None, sysctls: Mapping[str, str | None]) -> Backup:
    """The live values of exactly what `plan` is about to change. `sysctls` holds the values
    read before the change; one absent or None (unreadable) has no original to save."""
    want = plan.link
    backup = Backup()
    if link is not None:
        backup.mac = link.mac if want.mac is not None else None
        backup.mtu = link.mtu if want.mtu is not None else None
        backup.promisc = link.promisc if want.promisc is not None else None
        backup.allmulti = link.allmulti if want.allmulti is not None else None
        backup.tx_qlen = link.tx_qlen if want.tx_qlen is not None else None
    for w in plan.sysctls:
        original = sysctls.get(w.path)
        if original is not None:
            backup.sysctls.append((w.path, original))
    return backup


class BackupStore(AttachmentStore):
    """The dataDir comes from the config: never re-moded (chmod 0700 on an existing /tmp or
    /run would break the node), and a directory that is not safe to write is error 7.

    Its files are shared by every network (Go's names), so one without an owner (written
    by Go's tuning) is never stale for GC: its name cannot say which network it is for.
    """

    refusal_code = INVALID_CONFIG
    private = False
    lock_name = LOCK_NAME

    def __init__(self, data_dir: str) -> None:
        super().__init__(data_dir, Backup)

    def load(self, owner: Owner) -> Backup | None:
        # DEL reads before it locks: the dataDir is checked here too, so that a planted
        # file or symlink is refused as what it is.
        self.check()
        backup: Backup | None = super().load(owner)
        return backup

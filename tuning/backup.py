"""tuning's entry in the attachment store: the originals of what ADD changed, kept until DEL
puts them back, in ``<dataDir>/<containerID>_<ifName>.json`` in a format Go's tuning reads
too (docs/tuning.md shows it).
"""

from __future__ import annotations

from common.errors import INVALID_CONFIG, CniError
from common.state import AttachmentStore, safe_file_name
from tuning.config import LINK_FIELDS, MTU_MAX, MTU_MIN, TXQLEN_MAX, LinkSettings, parse_mac
from tuning.plan import LinkState, Plan

TYPE_CHECKING = False  # avoids importing typing at runtime
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from common.state import Owner

LOCK_NAME = "tuning.lock"
# NAME_MAX less room for a ".tmp.<pid>" suffix: the limit every backup file was named under.
MAX_FILE_NAME = 255 - len(".tmp.4194304")
# The link attributes' keys in the file: Go's names, which are ours but for txQLen.
JSON_KEYS = {**{name: name for name in LINK_FIELDS}, "tx_qlen": "txQLen"}


class Backup(LinkSettings):
    """Original values; None (or absent from `sysctls`) means "not changed by us"."""

    # (path below /proc/sys, original value), in the order they were first changed
    sysctls: tuple[tuple[str, str], ...] = ()
    network: str = ""
    container_id: str = ""
    ifname: str = ""

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

    def keeping_older(self, older: Backup | None) -> Backup:
        """This backup with `older`'s values where both have one: a second ADD must not
        record the values the first ADD set as "originals"."""
        if older is None:
            return self
        known = {path for path, _ in older.sysctls}
        kept: dict[str, Any] = {
            name: value for name, value in older.fields().items() if value not in (None, "")
        }
        kept["sysctls"] = older.sysctls + tuple((p, v) for p, v in self.sysctls if p not in known)
        return self.replace(**kept)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            key: getattr(self, name)
            for name, key in JSON_KEYS.items()
            if getattr(self, name) is not None
        }
        if self.sysctls:
            out["sysctls"] = [{"path": p, "value": v} for p, v in self.sysctls]
        out.update(network=self.network, containerID=self.container_id, ifName=self.ifname)
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

        def in_range(key: str, low: int, high: int) -> int | None:
            value = typed(key, int)
            return value if value is not None and low <= value <= high else None

        def mac() -> str | None:
            try:
                return parse_mac(typed("mac", str) or "", "") or None
            except CniError:
                return None

        entries = typed("sysctls", list) or []
        return cls(
            mac=mac(),
            mtu=in_range("mtu", MTU_MIN, MTU_MAX),  # Go writes 0 for "not changed"
            promisc=typed("promisc", bool),
            allmulti=typed("allmulti", bool),
            tx_qlen=in_range("txQLen", 0, TXQLEN_MAX),
            sysctls=tuple(
                (e["path"], e["value"])
                for e in entries
                if isinstance(e, dict)
                and isinstance(e.get("path"), str)
                and isinstance(e.get("value"), str)
            ),
            network=typed("network", str) or "",
            container_id=typed("containerID", str) or "",
            ifname=typed("ifName", str) or "",
        )


def originals(plan: Plan, link: LinkState | None, sysctls: Mapping[str, str | None]) -> Backup:
    """The live values of exactly what `plan` is about to change. `sysctls` holds the values
    read before the change; one absent or None (unreadable) has no original to save."""
    changed: dict[str, Any] = {}
    if link is not None:
        changed = {f: getattr(link, f) for f in LINK_FIELDS if getattr(plan.link, f) is not None}
    saved = tuple((w.path, v) for w in plan.sysctls if (v := sysctls.get(w.path)) is not None)
    return Backup(**changed, sysctls=saved)


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

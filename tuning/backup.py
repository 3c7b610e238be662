"""tuning's record in the attachment store: the originals of what ADD changed, kept until
DEL puts them back, in ``<dataDir>/<containerID>_<ifName>.json`` in a format Go's tuning
reads too (docs/tuning.md shows it).
"""

from __future__ import annotations

from common.errors import INVALID_CONFIG
from common.jsonobj import listed
from common.records import Flat, Key, Record
from common.safepath import safe_file_name
from common.store import AttachmentStore
from common.values import field
from tuning.config import LINK_OPTIONS, LinkSettings

TYPE_CHECKING = False  # avoids importing typing at runtime
if TYPE_CHECKING:
    from typing import Any

    from common.identity import Attachment
    from tuning.plan import LinkState, Plan

# NAME_MAX less room for a ".tmp.<pid>" suffix: the limit every backup file was named under.
MAX_FILE_NAME = 255 - len(".tmp.4194304")


def _sysctls(value: Any) -> tuple[tuple[str, str], ...]:
    return tuple(
        (e["path"], e["value"])
        for e in listed(value)
        if isinstance(e, dict)
        and isinstance(e.get("path"), str)
        and isinstance(e.get("value"), str)
    )


def _sysctls_json(sysctls: tuple[tuple[str, str], ...]) -> list[dict[str, str]] | None:
    return [{"path": p, "value": v} for p, v in sysctls] or None


class Backup(Record):
    """Original values; None (or absent from `sysctls`) means "not changed by us".

    Tolerant: a file from Go's tuning reads fine, and a value of the wrong type is
    dropped rather than making DEL fail forever. The link attributes are written with
    Go's keys (LINK_OPTIONS), which Go's tuning reads back; the owner is ours alone."""

    link: LinkSettings = field(default_factory=LinkSettings)
    # (path below /proc/sys, original value), in the order they were first changed
    sysctls: tuple[tuple[str, str], ...] = ()
    TOLERANT = True
    KEYS = {
        "link": Flat(LinkSettings, {o.field: Key(o.key, o.decode) for o in LINK_OPTIONS}),
        "sysctls": Key("sysctls", _sysctls, _sysctls_json),
    }

    @staticmethod
    def file_name(attachment: Attachment) -> str:
        """Go's name (the network is not part of it), unless it would not fit in a directory
        entry (MAX_FILE_NAME, leaving room for the suffix of an atomic write): runtimes
        may send container ids of up to 1024 characters, which then get a hashed name.
        Go's tuning cannot write such a file at all, so no compatibility is lost."""
        container_id, ifname = attachment.container_id, attachment.ifname
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
        kept = {name: v for name, v in older.link.fields().items() if v not in (None, "")}
        return self.replace(
            link=self.link.replace(**kept),
            sysctls=older.sysctls + tuple((p, v) for p, v in self.sysctls if p not in known),
        )


def originals(plan: Plan, link: LinkState | None, sysctls: dict[str, str | None]) -> Backup:
    """The live values of exactly what `plan` is about to change. `sysctls` holds the values
    read before the change; one absent or None (unreadable) has no original to save."""
    changed: dict[str, Any] = {}
    if link is not None:
        changed = {f: getattr(link, f) for f, v in plan.link.fields().items() if v is not None}
    saved = tuple((w.path, v) for w in plan.sysctls if (v := sysctls.get(w.path)) is not None)
    return Backup(link=LinkSettings(**changed), sysctls=saved)


class BackupStore(AttachmentStore[Backup]):
    """The dataDir comes from the config: never re-moded (chmod 0700 on an existing /tmp or
    /run would break the node), and a directory that is not safe to write is error 7.

    Its files are shared by every network (Go's names), so one without an owner (written
    by Go's tuning) is never stale for GC: its name cannot say which network it is for.
    """

    refusal_code = INVALID_CONFIG
    private = False
    lock_name = "tuning.lock"

    def __init__(self, data_dir: str) -> None:
        super().__init__(data_dir, Backup)

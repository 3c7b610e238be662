"""Network names that share portmap's 32-bit network tag (sha256(name)[:8])."""

from __future__ import annotations

import hashlib


def colliding_names(stem: str = "tenant") -> tuple[str, str]:
    """Two network names `<stem>-N` whose tags are the same: a birthday search, about
    2^16 names (well under a second)."""
    seen: dict[str, str] = {}
    i = 0
    while True:
        name = f"{stem}-{i}"
        tag = hashlib.sha256(name.encode()).hexdigest()[:8]
        if tag in seen:
            return seen[tag], name
        seen[tag] = name
        i += 1

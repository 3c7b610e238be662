"""Small helpers on raw JSON dicts that several modules need."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any


def split_known(raw: Mapping[str, Any], known: Iterable[str]) -> dict[str, Any]:
    """The entries of raw whose key is not one of `known` (compared ignoring case)."""
    folded = {k.casefold() for k in known}
    return {k: v for k, v in raw.items() if k.casefold() not in folded}

"""What a resident program (the helper) calls on bandwidth, and nothing else of it.

preload()    imports what bandwidth's verbs use, without opening anything bound to a namespace
"""

from __future__ import annotations


def preload() -> None:
    from bandwidth import tc, verbs  # noqa: F401 - loaded, not used here

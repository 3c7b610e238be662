"""What a resident program (the helper) calls on tuning, and nothing else of it.

preload()    imports what tuning's verbs use, without opening anything bound to a namespace
"""

from __future__ import annotations


def preload() -> None:
    from tuning import apply, verbs  # noqa: F401 - loaded, not used here

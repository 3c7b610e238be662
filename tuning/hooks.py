"""What a resident program (the helper) calls on tuning, and nothing else of it.

preload()    imports what tuning's verbs use, without opening anything bound to a namespace
rehearsal()  the calls a spare runs once in private namespaces before it waits for a
             real one: (CNI_COMMAND, keys to add to the program's network config)
release()    frees what a rehearsal left in the process (nothing: tuning keeps no handles)
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def preload() -> None:
    from tuning import apply, verbs  # noqa: F401 - loaded, not used here


def rehearsal() -> list[tuple[str, dict[str, Any]]]:
    # A DEL of an attachment that does not exist: the usual path, nothing to undo.
    return [("DEL", {})]


def release() -> None:
    return None

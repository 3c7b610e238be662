"""What a resident program (the helper) calls on portmap, and nothing else of it.

preload()    imports what portmap's verbs use and maps its libraries, without opening
             anything bound to a namespace (a table, a context, a socket)
rehearsal()  the calls a spare runs once in private namespaces before it waits for a
             real one: (CNI_COMMAND, keys to add to the program's network config)
release()    frees what a rehearsal left in the process (libnftables contexts)
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_MAPPINGS = [{"hostPort": 9, "containerPort": 9, "protocol": p} for p in ("tcp", "udp")]


def preload() -> None:
    from portmap import libnftables, netlink, nft, verbs, xtables  # noqa: F401 - loaded, not used here

    # Mapped once here, a worker's dlopen is a reference count (a context, which binds a
    # netlink socket to a namespace, is only ever made in the worker).
    libnftables.load()


def rehearsal() -> list[tuple[str, dict[str, Any]]]:
    # Never iptables: its rehearsal would exec iptables-restore in every spare.
    conf = {"backend": "nftables", "runtimeConfig": {"portMappings": _MAPPINGS}}
    return [("ADD", conf), ("DEL", conf)]


def release() -> None:
    from portmap.nft import release_contexts

    release_contexts()

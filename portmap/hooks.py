"""What a resident program (the helper) calls on portmap, and nothing else of it.

preload()    imports what portmap's verbs use and maps its libraries, without opening
             anything bound to a namespace (a table, a context, a socket)
"""

from __future__ import annotations


def preload() -> None:
    from portmap import libnftables, netlink, nft, verbs, xtables  # noqa: F401 - loaded, not used here

    # Mapped once here, a worker's dlopen is a reference count (a context, which binds a
    # netlink socket to a namespace, is only ever made in the worker).
    libnftables.load()

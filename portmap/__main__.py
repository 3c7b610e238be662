"""portmap: table of contents.

parse    portmap/config.py    options, PortMapping, validation (error 7)
plan     portmap/plan.py      the attachment's forwards and masquerading, pure data
apply    portmap/nft.py       nftables backend (default): map elements, one transaction
         portmap/xtables.py   iptables backend (iptables-restore, the host's variant)
extras   portmap/netlink.py   route_localnet's interface, UDP conntrack flush
verbs    portmap/verbs.py     ADD, DEL, CHECK, GC, STATUS on top of the above,
                              imported on first use (VERSION stays cheap)
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.skel import Plugin


def plugin() -> Plugin:
    from common.skel import verbs_module_plugin

    return verbs_module_plugin("portmap")


def main() -> None:
    from common import entry

    entry("portmap", plugin)


if __name__ == "__main__":
    main()

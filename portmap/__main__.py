"""portmap: table of contents.

parse    portmap/config.py    options, PortMapping, validation (error 7)
plan     portmap/plan.py      the attachment's forwards and masquerading, pure data
apply    portmap/nft.py       nftables backend (default): map elements, one transaction
         portmap/iptables.py  iptables backend (python-iptables, legacy xtables)
extras   portmap/netlink.py   route_localnet's interface, UDP conntrack flush
verbs    portmap/verbs.py     ADD, DEL, CHECK, GC, STATUS on top of the above,
                              imported on first use (VERSION stays cheap)
"""

from __future__ import annotations

from common.skel import Plugin, lazy
from common.skel import main as run_plugin

PLUGIN = Plugin(
    name="portmap",
    add=lazy("portmap.verbs:add"),
    delete=lazy("portmap.verbs:delete"),
    check=lazy("portmap.verbs:check"),
    gc=lazy("portmap.verbs:gc"),
    status=lazy("portmap.verbs:status"),
)


def main() -> None:
    run_plugin(PLUGIN)


if __name__ == "__main__":
    main()

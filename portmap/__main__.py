"""portmap: table of contents.

parse    portmap/config.py    options, PortMapping, validation (error 7)
plan     portmap/plan.py      the attachment's forwards and masquerading, pure data
apply    portmap/nft.py       nftables backend (default): map elements, one transaction
         portmap/iptables.py  iptables backend (python-iptables, legacy xtables)
extras   portmap/netlink.py   route_localnet's interface, UDP conntrack flush
verbs    portmap/verbs.py     ADD, DEL, CHECK, GC, STATUS on top of the above
"""

from __future__ import annotations

from common.skel import Plugin
from common.skel import main as run_plugin
from portmap import verbs

PLUGIN = Plugin(
    name="portmap",
    add=verbs.add,
    delete=verbs.delete,
    check=verbs.check,
    gc=verbs.gc,
    status=verbs.status,
)


def main() -> None:
    run_plugin(PLUGIN)


if __name__ == "__main__":
    main()

"""portmap: table of contents.

parse    portmap/config.py    options, PortMapping, validation (error 7)
plan     portmap/plan.py      the attachment's forwards and masquerading, pure data
apply    portmap/nft.py       nftables backend (default): map elements, one transaction
         portmap/xtables.py   iptables backend (iptables-restore, the host's variant)
ports    portmap/ports.py     the kernel ports declared (Protocols the fakes implement)
kernel   portmap/kernel.py    the kernel ports handed to the verbs (one per backend,
                              and the route to a container, sysctls, UDP conntrack flush)
         portmap/localnet.py  route_localnet: which interface may get it, who needs it,
                              back off with the last attachment that did
state    portmap/state.py     the records in the store (NftRecord, XtablesRecord)
         portmap/go_takeover.py  what Go's portmap made: recognised and released
verbs    portmap/verbs.py     which backend; ADD, DEL, CHECK, GC, STATUS on top of the
                              above, imported on first use (VERSION stays cheap)
"""


def main() -> None:
    from common import entry

    entry("portmap")


if __name__ == "__main__":
    main()

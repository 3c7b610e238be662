"""flatnet: table of contents. The main plugin: a veth pair per attachment, its host end
on a bridge, addresses from IPAM, masquerade per network. A drop-in for the Go `bridge`
(same option names and defaults; docs/flatnet.md lists what differs and why).

parse    flatnet/config.py   options (Go's names and defaults), refusals (error 7)
plan     flatnet/plan.py     gateways, routes, the result: pure data
ipam     flatnet/ipam.py     IPAM: flatnet-ipam in-process, any other type exec'd
                             through CNI_PATH as the Go bridge does
apply    flatnet/links.py    rtnetlink: bridge, veth pair, addresses, routes, sysctls
         flatnet/masq.py     masquerade: nftables (one table, a chain and sets per
                             network) or Go's iptables chains
record   flatnet/record.py   what ADD made (host veth, bridge, masquerade, IPAM), so that
                             DEL without a netns and GC remove it
verbs    flatnet/verbs.py    ADD, DEL, CHECK, GC, STATUS, imported on first use
"""


def main() -> None:
    from common import entry

    entry("flatnet")


if __name__ == "__main__":
    main()

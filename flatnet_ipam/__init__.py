"""flatnet-ipam: an IPAM plugin, a drop-in for host-local whose leases never leak
(docs/flatnet-ipam.md). flatnet_ipam.lib is its library for a main plugin in-process."""

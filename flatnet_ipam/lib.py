"""flatnet-ipam as a library: what the `flatnet-ipam` executable's verbs run, and what a
main plugin (flatnet) calls in-process instead of exec'ing an IPAM plugin.

    from flatnet_ipam import lib

    config = lib.parse_config(request.conf, request.env.cni_args)   # error 7 naming a field
    result = lib.allocate(config, container_id, ifname, log)         # ADD: ips, routes, dns
    lib.check(config, container_id, ifname, log)                     # CHECK: error 102 if not
    freed = lib.release(config, container_id, ifname, log)           # DEL: never fails for
                                                                     # an unknown attachment
    lib.gc(config, valid, log)                                       # GC: valid attachments
    lib.status(config, log)                                          # STATUS: error 50 or None

Every call takes the network's lease lock (host-local's `<dataDir>/<network>/lock`), so a
call of ours, one of host-local's and one of another process of ours never interleave.
Leases are host-local's files (docs/flatnet-ipam.md): either side frees the other's.
Errors are common.errors.CniError with the code a runtime should see; a caller in-process
lets them propagate (or turns them into its own).
"""

from __future__ import annotations

from flatnet_ipam.config import IpamConfig, parse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from common.config import NetConf
    from common.gc import AttachmentId
    from common.log import Log
    from common.result import Result

__all__ = ["IpamConfig", "allocate", "check", "gc", "parse_config", "release", "status"]


def parse_config(conf: NetConf, cni_args: Mapping[str, str] | None = None) -> IpamConfig:
    """The `ipam` section of `conf` (a main plugin's config, or the IPAM plugin's own),
    with the runtime's requested addresses: runtimeConfig `ips`, `args.cni.ips` and
    CNI_ARGS `IP=` (`cni_args`: the parsed CNI_ARGS, common.env.Invocation.cni_args), and
    runtimeConfig `ipRanges`. Pure: touches no file. Error 7 naming the field."""
    return parse(conf, cni_args)


def allocate(config: IpamConfig, container_id: str, ifname: str, log: Log | None = None) -> Result:
    """ADD: one address per range set for the attachment (network, container_id, ifname),
    as host-local hands them out (the cursor `last_reserved_ip.N` + 1, wrapping, gateway
    skipped; a requested address or nothing), and the result an IPAM plugin returns:
    `ips` (address/prefix and the range's gateway, `interface` unset: the main plugin
    sets it), `routes` (a route without gw gets the gateway of its family), `dns` (from
    resolvConf).

    An attachment that already holds leases gets the same addresses again. Crash-safe:
    its record (intent) is written before a lease exists, each lease is created complete
    or not at all, and a failure undoes what this call claimed. Errors: 7 (a requested
    address in no range set), 101 (a requested address taken or the gateway, or "no IP
    addresses available in range set ..."), 11 (the lock not taken in time), 5 (the lease
    directory or the index cannot be used)."""
    from flatnet_ipam import store

    return store.allocate(config, container_id, ifname, log)


def release(
    config: IpamConfig, container_id: str, ifname: str, log: Log | None = None
) -> list[str]:
    """DEL: free every lease of the attachment (ours, or host-local's) and forget its
    record; returns the addresses freed (no prefix), [] when there was nothing, which is
    a success. A lease whose file names another attachment now is never touched."""
    from flatnet_ipam import store

    return store.release(config, container_id, ifname, log)


def check(config: IpamConfig, container_id: str, ifname: str, log: Log | None = None) -> list[str]:
    """CHECK: the attachment holds a lease in every range set of `config`, each file still
    naming it; returns the addresses (no prefix). Error 102 (CHECK_FAILED) saying what is
    missing otherwise."""
    from flatnet_ipam import store

    return store.check(config, container_id, ifname, log)


def gc(config: IpamConfig, valid: set[AttachmentId], log: Log | None = None) -> None:
    """GC: free every lease of the network whose attachment is not in `valid`
    (common.gc.valid_attachments), host-local's included, except those of an ADD still
    in flight; also empty lease files (host-local killed mid-create) and what a killed
    call of ours left."""
    from flatnet_ipam import store

    store.gc(config, valid, log)


def status(config: IpamConfig, log: Log | None = None) -> None:
    """STATUS: None when an ADD could get an address in every range set; CniError 50
    (STATUS_UNAVAILABLE) when the lease directory cannot be used or a set is full."""
    from flatnet_ipam import store

    store.status(config, log)

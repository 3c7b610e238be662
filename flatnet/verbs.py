"""flatnet's verbs, each parse -> plan -> apply -> report.

ADD runs under the store's lock (common.attachment): the record of what it is about to
make (its host veth's name, bridge, IPAM type, masquerade backend) is written before the
kernel is touched, so that a DEL with or without the container's namespace, a GC, or the
undo of a failed ADD removes exactly that, even after a SIGKILL at any step.
"""

from __future__ import annotations

import os

from common.errors import (
    CHECK_FAILED,
    CONFLICT,
    INVALID_CONFIG,
    KERNEL_FAILURE,
    STATUS_UNAVAILABLE,
    CniError,
)
from flatnet import config

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from common.attachment import Engine
    from common.result import Result
    from common.skel import Request
    from common.store import AttachmentStore
    from flatnet.config import Config
    from flatnet.links import Link, Rtnl
    from flatnet.record import Record


class Progress:
    """What a running ADD has made so far: what its undo must take back (and no more: a
    lease the ADD never asked for may be another attachment's)."""

    __slots__ = ("ipam", "masq", "veth")

    def __init__(self) -> None:
        self.veth = self.ipam = self.masq = False


def _engine(request: Request, store: AttachmentStore[Record]) -> Engine[Record]:
    from common.attachment import Engine

    return Engine(store, request.log)


def _ipam(request: Request, kind: str) -> Any:
    """The IPAM of `kind`: flatnet-ipam's library in-process, any other type exec'd
    through CNI_PATH (ExecIpam and InProcessIpam answer the same calls)."""
    if kind == config.IN_PROCESS_IPAM:
        from flatnet.ipam import InProcessIpam

        return InProcessIpam(request)
    from flatnet.ipam import ExecIpam

    return ExecIpam(request, kind)


# ---------------------------------------------------------------------------- ADD


def add(request: Request) -> Result:
    cfg = config.parse(request.conf, request.env)
    if cfg.ipam_in_process:
        _ipam(request, cfg.ipam_type)  # its config's refusals come before any change
    from flatnet import links, record

    links.preload(ip=bool(cfg.ipam_type))
    store = record.store(request.log)
    with _engine(request, store).add(request.attachment) as change:
        host = links.Rtnl()
        if change.previous is not None:
            _forget_stale(request, cfg, host, change.previous)
        rec = record.Record(
            network=request.network,
            container_id=request.container_id,
            ifname=request.ifname,
            bridge=cfg.bridge,
            host_veth="veth" + os.urandom(4).hex(),
            netns=request.netns,
            ipam=cfg.ipam_type,
            masq=cfg.masq_backend if cfg.ip_masq and cfg.ipam_type else "",
        )
        done = Progress()
        change.intend(rec, undo=lambda: _teardown(request, cfg, rec, host, store, done))
        try:
            result = _attach(request, cfg, rec, host, store, done)
        except OSError as e:  # a netlink refusal no step above turned into its own error
            raise links.kernel_error(f"could not attach {request.ifname}", e) from None
        change.confirm(rec.replace(addresses=tuple(ip.address for ip in result.ips)))
    request.log.info(
        f"attached {request.ifname} ({', '.join(ip.address for ip in result.ips) or 'no IP'}) "
        f"to {cfg.bridge} through {rec.host_veth}"
    )
    return result


def _forget_stale(request: Request, cfg: Config, host: Rtnl, previous: Record) -> None:
    """A record of this attachment exists: a second ADD without a DEL is refused while
    the interface is there; a record left by a killed ADD is taken back first."""
    from common.netns import entered_if_present

    with entered_if_present(request.netns, _opened) as ctr:
        there = ctr is not None and ctr.link(request.ifname) is not None
    if there:
        raise CniError(
            CONFLICT,
            f"{request.ifname} of container {request.container_id} is already attached",
            "DEL it first",
        )
    done = Progress()
    done.veth = done.ipam = done.masq = True
    _teardown(request, cfg, previous, host, None, done)


def _opened(path: str) -> Any:
    """A with-block holding an Rtnl opened in the namespace at `path`."""
    from contextlib import closing

    from flatnet.links import Rtnl

    return closing(Rtnl(path))


def _attach(
    request: Request,
    cfg: Config,
    rec: Record,
    host: Rtnl,
    store: AttachmentStore[Record],
    done: Progress,
) -> Result:
    from common.netns import entered
    from common.result import Interface
    from flatnet import links, plan

    bridge = _ensure_bridge(host, cfg)
    host_mac, ctr_mac = links.random_mac(), cfg.mac or links.random_mac()
    fd = os.open(request.netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        done.veth = True
        host.create_veth(rec.host_veth, host_mac, request.ifname, ctr_mac, fd, cfg.mtu,
                         bridge.index)  # fmt: skip
    except OSError as e:
        import errno

        if e.errno != errno.EEXIST:
            what = f"could not create the veth pair for {request.ifname}"
            raise links.kernel_error(what, e) from None
        done.veth = False  # nothing of ours was made
        raise CniError(
            CONFLICT, f"container {request.container_id} already has an interface {request.ifname}"
        ) from None
    finally:
        os.close(fd)
    if cfg.hairpin or cfg.port_isolation or cfg.vlan:
        port = host.link(rec.host_veth)
        if port is None:
            raise CniError(KERNEL_FAILURE, f"host veth {rec.host_veth} vanished during ADD")
        if cfg.hairpin or cfg.port_isolation:
            host.set_port(port.index, cfg.hairpin, cfg.port_isolation)
        if cfg.vlan:
            host.set_port_vlan(port.index, cfg.vlan)

    ipam_result = None
    the_plan = None
    if cfg.ipam_type:
        ipam = _ipam(request, cfg.ipam_type)
        ipam.locate()
        done.ipam = True
        ipam_result = ipam.add()
        if not ipam_result.ips:
            raise CniError(KERNEL_FAILURE, f"IPAM plugin {cfg.ipam_type} returned no IP config")
        the_plan = plan.make_plan(cfg, ipam_result)

    with entered(request.netns):
        ifname = request.ifname
        links.set_sysctl(f"net/ipv6/conf/{ifname}/accept_dad", "1" if cfg.enable_dad else "0")
        links.set_sysctl(f"net/ipv4/conf/{ifname}/arp_notify", "1")
        if cfg.enable_dad:
            links.set_sysctl(f"net/ipv6/conf/{ifname}/enhanced_dad", "1")
        ctr = links.Rtnl()
    try:
        _configure_container(ctr, request.ifname, the_plan, cfg)
    finally:
        ctr.close()

    if the_plan is not None:
        for cidr in the_plan.bridge_addresses:
            _ensure_gateway(host, bridge, cidr, cfg.force_address)
        if the_plan.bridge_addresses:
            families = {6 if ":" in cidr else 4 for cidr in the_plan.bridge_addresses}
            if 4 in families:
                links.set_sysctl("net/ipv4/ip_forward", "1", only_if_different=True)
            if 6 in families:
                links.set_sysctl("net/ipv6/conf/all/forwarding", "1", only_if_different=True)
        if rec.masq:
            done.masq = True
            _masquerade(request, rec, [ip.address for ip in the_plan.ips])

    host.wait_oper_up(rec.host_veth)
    result = plan.report(
        the_plan,
        ipam_result,
        Interface(name=bridge.name, mac=bridge.mac),
        Interface(name=rec.host_veth, mac=host_mac),
        Interface(name=request.ifname, mac=ctr_mac, sandbox=request.netns),
    )
    dns = _config_dns(request)
    if dns is not None:
        result.dns = dns
    return result


def _config_dns(request: Request) -> Any:
    """The config's own `dns`, which replaces IPAM's when it says anything (as in Go)."""
    raw = request.conf.body.get("dns")
    if not isinstance(raw, dict):
        return None
    from common.result import Result

    dns = Result.from_json({"cniVersion": "1.0.0", "dns": raw}, "1.0.0").dns
    if dns.nameservers or dns.search or dns.options or dns.domain:
        return dns
    return None


def _ensure_bridge(host: Rtnl, cfg: Config) -> Link:
    from flatnet import links

    bridge = host.link(cfg.bridge)
    if bridge is None:
        if host.create_bridge(cfg.bridge, links.random_mac(), cfg.mtu, bool(cfg.vlan)):
            # A bridge that takes router advertisements would configure itself; one that
            # runs DAD would keep its addresses tentative for a second after it is up.
            links.set_sysctl(f"net/ipv6/conf/{cfg.bridge}/accept_ra", "0")
            links.set_sysctl(f"net/ipv6/conf/{cfg.bridge}/accept_dad", "0")
        bridge = host.link(cfg.bridge)
        if bridge is None:
            raise CniError(KERNEL_FAILURE, f"bridge {cfg.bridge} vanished while it was made")
    if bridge.kind != "bridge":
        raise CniError(
            INVALID_CONFIG,
            f"{cfg.bridge!r} already exists but is not a bridge ({bridge.kind or 'no kind'})",
            "name another bridge in the config's 'bridge'",
        )
    host.update_bridge(bridge, cfg.mtu, cfg.promisc)
    return bridge


def _configure_container(ctr: Rtnl, ifname: str, the_plan: Any, cfg: Config) -> None:
    from flatnet.links import kernel_error
    from flatnet.plan import route_gateway

    link = ctr.link(ifname)
    if link is None:
        raise CniError(KERNEL_FAILURE, f"{ifname} is missing in the container after its creation")
    try:
        ctr.set_up(link.index)
        if the_plan is None:
            return
        for ip in the_plan.ips:
            ctr.add_address(link.index, ip.address, nodad=not cfg.enable_dad)
        for route in the_plan.routes:
            ctr.add_route(link.index, route, route_gateway(route, the_plan.ips))
    except OSError as e:
        raise kernel_error(f"could not configure {ifname} in the container", e) from None


def _ensure_gateway(host: Rtnl, bridge: Link, cidr: str, force: bool) -> None:
    """The gateway address on the bridge (Go's ensureAddr): another IPv4 address there, or
    an IPv6 one of the same subnet, is an error unless forceAddress replaces it."""
    from flatnet import links
    from flatnet.plan import canonical, network_of

    want = canonical(cidr)
    family = links.AF_INET6 if ":" in cidr else links.AF_INET
    for have in host.addresses(bridge.index, family):
        have = canonical(have)
        if have == want:
            return
        if family == links.AF_INET or network_of(have) == network_of(want):
            if not force:
                raise CniError(
                    INVALID_CONFIG,
                    f"{bridge.name!r} already has an IP address different from {want} ({have})",
                    "set forceAddress to replace it, or use another bridge",
                )
            host.delete_address(bridge.index, have)
    try:
        host.add_address(bridge.index, want)
    except OSError as e:
        import errno

        if e.errno != errno.EEXIST:
            raise links.kernel_error(f"could not add {want} to {bridge.name}", e) from None


def _masquerade(request: Request, rec: Record, addresses: list[str]) -> None:
    from flatnet import masq
    from flatnet.plan import network_of

    if rec.masq == "iptables":
        masq.iptables_add(request.network, request.container_id, addresses)
    else:
        masq.nft_add(request.network, sorted({network_of(a) for a in addresses}))


# ---------------------------------------------------------------------------- teardown


def _others_hold_masq(store: AttachmentStore[Record] | None, rec: Record) -> bool:
    """Whether another attachment of the network still needs its nftables masquerade:
    the files named with the network's tag, read until one of that network says so."""
    if store is None:
        return True  # no store to ask: keep the network's rules
    from common.identity import network_tag

    tag = network_tag(rec.network) + "-"
    own = store.file_of(rec.attachment)
    for name in store.names():
        if name.startswith(tag) and name != own:
            other = store.read(name)
            if other is not None and other.network == rec.network and other.masq == "nftables":
                return True
    return False


def _teardown(
    request: Request,
    cfg: Config,
    rec: Record,
    host: Rtnl | None,
    store: AttachmentStore[Record] | None,
    done: Progress,
) -> None:
    """Remove what `rec` says (as far as `done` says it got): the masquerade, the host
    veth (its peer goes with it), the lease. Each step tolerates what is already gone."""
    from flatnet import masq
    from flatnet.links import Rtnl

    if done.masq and rec.masq == "iptables":
        masq.iptables_delete(rec.network, rec.container_id)
    elif done.masq and rec.masq == "nftables" and not _others_hold_masq(store, rec):
        masq.nft_delete(rec.network)
    if done.veth:
        host = host or Rtnl()
        host.delete_link(rec.host_veth)
    if done.ipam and rec.ipam:
        ipam = _ipam(request, rec.ipam)
        if (rec.container_id, rec.ifname) == (request.container_id, request.ifname):
            ipam.delete()
        else:
            ipam.delete(rec.container_id, rec.ifname)


def _everything() -> Progress:
    done = Progress()
    done.veth = done.ipam = done.masq = True
    return done


# ---------------------------------------------------------------------------- DEL


def delete(request: Request) -> None:
    """Remove what the attachment's record says; without one (a Go bridge's attachment,
    or a lost record), what the config and the container's namespace show."""
    cfg = config.parse_teardown(request.conf)
    from flatnet import record

    store = record.store(request.log)

    def teardown(rec: Record | None) -> None:
        if rec is not None:
            _teardown(request, cfg, rec, None, store, _everything())
            return
        _teardown_unrecorded(request, cfg, store)

    _engine(request, store).delete(request.attachment, teardown)


def _teardown_unrecorded(request: Request, cfg: Config, store: AttachmentStore[Record]) -> None:
    from common.netns import entered_if_present
    from flatnet import masq, record

    with entered_if_present(request.netns, _opened) as ctr:
        if ctr is not None:
            ctr.delete_link(request.ifname)
    if cfg.ip_masq and cfg.masq_backend == "iptables":
        masq.iptables_delete(request.network, request.container_id)
    elif cfg.ip_masq:
        probe = record.Record(network=request.network, container_id=request.container_id,
                              ifname=request.ifname, masq="nftables")  # fmt: skip
        if not _others_hold_masq(store, probe):
            masq.nft_delete(request.network)
    if cfg.ipam_type:
        try:
            ipam = _ipam(request, cfg.ipam_type)
        except CniError as e:
            if e.code != INVALID_CONFIG:
                raise
            # flatnet-ipam's section is one ADD refused: no lease can exist under it.
            request.log.warning(f"DEL without a record: not releasing a lease: {e}")
            return
        ipam.delete()


# ---------------------------------------------------------------------------- CHECK


def check(request: Request) -> None:
    cfg = config.parse(request.conf, request.env)
    prev = request.conf.prev_result
    if prev is None:
        raise CniError(INVALID_CONFIG, "CHECK needs the prevResult of the ADD")
    if cfg.ipam_type:
        _ipam(request, cfg.ipam_type).check()
    from flatnet import record
    from flatnet.links import Rtnl
    from flatnet.plan import canonical

    problems = []
    host = Rtnl()
    bridge = host.link(cfg.bridge)
    if bridge is None or bridge.kind != "bridge":
        problems.append(f"there is no bridge {cfg.bridge}")
    rec = record.store(request.log).load(request.attachment)
    if rec is not None:
        port = host.link(rec.host_veth)
        if port is None:
            problems.append(f"the host veth {rec.host_veth} is gone")
        elif bridge is not None and port.master != bridge.index:
            problems.append(f"the host veth {rec.host_veth} is not on {cfg.bridge}")
    ctr = Rtnl(request.netns)
    try:
        link = ctr.link(request.ifname)
        if link is None:
            problems.append(f"there is no {request.ifname} in the container")
        else:
            have = {canonical(a) for a in ctr.addresses(link.index)}
            for ip in prev.container_ips(request.ifname):
                if canonical(ip.address) not in have:
                    problems.append(f"{request.ifname} lacks {ip.address}")
    finally:
        ctr.close()
    if rec is not None and rec.masq == "nftables":
        from flatnet import masq

        if not masq.nft_network_rules(request.network):
            problems.append(f"the masquerade chain of network {request.network} is gone")
    if problems:
        raise CniError(
            CHECK_FAILED, f"{request.ifname} does not match flatnet's ADD", "; ".join(problems)
        )


# ---------------------------------------------------------------------------- GC, STATUS


def gc(request: Request) -> None:
    """Tear down the attachments of this network the runtime no longer knows (host veth,
    masquerade, lease), then the network's masquerade when no attachment is left, then
    the IPAM's own GC."""
    cfg = config.parse_teardown(request.conf)
    from common.gc import valid_attachments
    from common.identity import network_tag
    from flatnet import record

    valid = valid_attachments(request.network, request.conf.body)
    store = record.store(request.log)

    def teardown(rec: Record) -> None:
        _teardown(request, cfg, rec, None, store, _everything())

    tag = network_tag(request.network) + "-"
    with _engine(request, store).collecting(request.network, valid, teardown, unusable=tag):
        if cfg.ip_masq and cfg.masq_backend == "nftables":
            probe = record.Record(network=request.network, masq="nftables")
            if not _others_hold_masq(store, probe):
                from flatnet import masq

                masq.nft_delete(request.network)
    if cfg.ipam_type:
        _ipam(request, cfg.ipam_type).gc()


def status(request: Request) -> None:
    """Ready when the bridge (if it exists) is a bridge, the IPAM answers STATUS, and the
    masquerade's backend is there."""
    cfg = config.parse(request.conf, request.env)
    from flatnet.links import Rtnl

    bridge = Rtnl().link(cfg.bridge)
    if bridge is not None and bridge.kind != "bridge":
        raise CniError(STATUS_UNAVAILABLE, f"{cfg.bridge!r} exists but is not a bridge")
    if cfg.ipam_type:
        try:
            _ipam(request, cfg.ipam_type).status()
        except CniError as e:
            raise CniError(STATUS_UNAVAILABLE, f"IPAM {cfg.ipam_type} is not ready: {e.msg}",
                           e.details) from None  # fmt: skip
    if cfg.ip_masq and cfg.masq_backend == "nftables":
        from common import libnftables

        try:
            libnftables.load()
        except OSError as e:
            raise CniError(
                STATUS_UNAVAILABLE, "libnftables is missing for ipMasq", str(e)
            ) from None

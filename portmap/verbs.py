"""portmap's verbs: parse -> plan -> apply (through a backend) -> report.

Which backend serves a call is decided here, in one place (the config, the attachment's
record and the host map to a backend object; config.py and state.py only read and write
the names). The
host-side extras that do not depend on the backend live here too: route_localnet on the
interface toward the container (so 127.0.0.1:hostPort can be forwarded) and the UDP
conntrack flush after ADD and DEL.

A pod without port mappings passes prevResult through on ADD: this module imports only
what that needs (the config), each verb the rest once it has something to do.
"""

from __future__ import annotations

from common.errors import CHECK_FAILED, KERNEL_FAILURE, CniError, invalid_config
from portmap import config as cfg

# The interface both backends implement (for the type checker; nothing checks it at run
# time, and `typing` is not imported on the call path).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from common.identity import Attachment
    from common.log import Log
    from common.result import Result
    from common.skel import Request
    from common.store import Stamps
    from portmap.localnet import Rider
    from portmap.plan import Plan, UdpTargets
    from portmap.ports import Kernel
    from portmap.state import Recorded, Store

    class Backend(Protocol):
        name: str  # what its records say

        def owns(self, recorded: Recorded | None) -> bool: ...  # the record is of this backend

        def add(self, plan: Plan) -> None: ...

        def delete(
            self, att: Attachment, plan: Plan | None, rider: Rider | None = None
        ) -> UdpTargets: ...

        def check(self, plan: Plan) -> list[str]: ...  # what differs from the plan

        def may_hold(self) -> bool: ...  # mappings no record names (GC looks for them)

        def gc(self, network: str, valid: set[Attachment], before: Stamps) -> UdpTargets: ...

        def status(self) -> None: ...


NFTABLES, IPTABLES = cfg.BACKENDS  # the config's "backend" values, and a record's


def kernel_of(request: Request) -> Kernel:
    """The kernel port the request was handed, else the host's."""
    from portmap import kernel as host

    kernel: Kernel = request.kernel or host.Kernel()
    return kernel


# ---------------------------------------------------------------------------- which backend


def _make(name: str, sd: Store, log: Log, kernel: Kernel) -> Backend:
    if name == IPTABLES:
        from portmap.xtables import XtablesBackend

        return XtablesBackend(sd, log, kernel.xtables)
    from portmap.nft import NftBackend

    return NftBackend(sd, log, kernel.nft)


def _configured(options: cfg.Options, kernel: Kernel) -> str:
    """The configured backend; for auto, the one the options need (cfg.Options.needs),
    else nftables where libnftables works."""
    return options.backend or options.needs or (NFTABLES if kernel.nft.usable() else IPTABLES)


def choose(
    options: cfg.Options, sd: Store, log: Log, kernel: Kernel, recorded: Recorded | None = None
) -> Backend:
    """The backend of a call: the one that recorded the attachment (for a DEL), else the
    config's."""
    if recorded is not None and recorded.backend in cfg.BACKENDS:
        return _make(recorded.backend, sd, log, kernel)
    return _make(_configured(options, kernel), sd, log, kernel)


def for_gc(
    options: cfg.Options, network: str, sd: Store, log: Log, kernel: Kernel
) -> list[Backend]:
    """Every backend that may hold mappings of `network`: the config's, those of its
    records, and each that says it may hold mappings no record names (Backend.may_hold)."""
    names = {_configured(options, kernel)}
    names |= {e.backend for e in sd.entries(network).values() if e.backend in cfg.BACKENDS}
    backends = [_make(name, sd, log, kernel) for name in sorted(cfg.BACKENDS)]
    return [b for b in backends if b.name in names or b.may_hold()]


# ---------------------------------------------------------------------------- host extras


def claim_localnet(request: Request, plan: Plan, kernel: Kernel, sd: Store) -> None:
    """route_localnet on the interface toward the container, when localhost forwarding
    needs it and that interface faces the container; recorded, so that the last
    attachment to need it puts it back (portmap.localnet). A repeated ADD that needs it
    no more, or elsewhere, lets go of the old one."""
    from portmap.localnet import Registry, interface_for, tag_of

    tag = tag_of(sd.file_of(plan.attachment))
    registry = Registry(kernel, request.log)
    ifname = interface_for(plan, request.conf.prev_result, kernel, request.log)
    if ifname is None:
        registry.release(tag)
        return
    try:
        registry.claim(tag, ifname, plan.attachment.network)
    except CniError:  # its state directory
        registry.release(tag)
        raise
    except OSError as e:
        registry.release(tag)
        raise CniError(
            KERNEL_FAILURE, f"cannot enable route_localnet on {ifname}", str(e)
        ) from None


def flush_conntrack(targets: UdpTargets, log: Log, kernel: Kernel) -> None:
    """Failures are reported in the log only: stale flows are a nuisance, not a failure."""
    for family in (4, 6):
        ports = [(ip, port) for fam, ip, port in targets if fam == family]
        if not ports:
            continue
        try:
            n = kernel.flush_udp_conntrack(family, ports)
            if n:
                log.info(f"deleted {n} stale IPv{family} UDP conntrack entries")
        except OSError as e:
            log.warning(f"could not flush IPv{family} UDP conntrack entries: {e}")


# ---------------------------------------------------------------------------- verbs


def _planned(request: Request) -> tuple[Plan, Backend, Kernel, Store] | None:
    """The plan of an ADD or CHECK and what applies it; None without port mappings."""
    config = cfg.parse(request.conf)
    prev = request.conf.prev_result
    if prev is None:
        raise invalid_config(
            "portmap must be chained after a plugin that assigns addresses",
            "the configuration has no prevResult",
        )
    if not config.mappings:
        return None
    from portmap import state
    from portmap.plan import make_plan

    sd = state.store(request.log)
    kernel = kernel_of(request)
    backend = choose(config.options, sd, request.log, kernel)
    return make_plan(config, request.attachment, prev), backend, kernel, sd


def add(request: Request) -> Result | None:
    planned = _planned(request)
    if planned is None:
        return None  # pass prevResult through, in the config's cniVersion
    plan, backend, kernel, sd = planned
    for note in plan.skipped:
        request.log.warning(f"skipped {note}")
    if plan.empty:
        request.log.warning(f"no address on {request.ifname} to forward ports to")
        return None
    backend.add(plan)
    # After the mappings, not before: a refused ADD must leave the interface's
    # route_localnet as it was (it is shared by every container behind it).
    try:
        claim_localnet(request, plan, kernel, sd)
    except CniError:
        backend.delete(request.attachment, plan)
        raise
    flush_conntrack(plan.udp_ports(), request.log, kernel)
    request.log.info("forwarding " + describe(plan))
    return None


def describe(plan: Plan) -> str:
    """The attachment's forwards, as an operator reads them:
    '0.0.0.0:8080/tcp -> 10.89.0.2:80, [::]:8080/tcp -> [fd00::2]:80'."""
    forwards = []
    for fam in plan.families:
        for fw in fam.forwards:
            to = cfg.host_ports(fam.container_ip, fw.container_port, fw.count, fw.protocol)
            forwards.append(f"{fw.describe(fam.family)} -> {to.rpartition('/')[0]}")
    return ", ".join(forwards)


def delete(request: Request) -> None:
    from portmap import state
    from portmap.plan import make_plan

    att = request.attachment
    sd = state.store(request.log)
    try:
        config = cfg.parse(request.conf)
    except CniError as e:
        # A DEL must not fail forever on a config it cannot read: ownership is known
        # from the kernel and the state file, not from the config.
        request.log.warning(f"ignoring unreadable portmap config on DEL: {e}")
        config = cfg.PortmapConfig(cfg.Options(), ())
    recorded = sd.load(att)
    kernel = kernel_of(request)
    backend = choose(config.options, sd, request.log, kernel, recorded)
    plan = None
    prev = request.conf.prev_result
    # With a state file of its backend, a backend deletes what the file records and never
    # needs the plan: only without one does the config say where to look.
    if not backend.owns(recorded) and prev is not None and config.mappings:
        try:
            plan = make_plan(config, att, prev)
        except CniError as e:
            request.log.warning(f"cannot plan from the DEL config: {e}")
    from portmap.localnet import Registry, tag_of

    # route_localnet goes back before the mappings go (the pod is going), so that the
    # guard's change can ride in the backend's transaction (Registry.releasing)
    with Registry(kernel, request.log).releasing(tag_of(sd.file_of(att))) as rider:
        targets = backend.delete(att, plan, rider)
    flush_conntrack(targets, request.log, kernel)
    if recorded is None:  # not made by us: perhaps by the Go portmap (see go_takeover)
        from portmap.go_takeover import release

        cidrs = [ip.address for ip in prev.container_ips(att.ifname)] if prev else []
        released = release(att.network, att.container_id, cidrs, sd, request.log, kernel)
        flush_conntrack(released, request.log, kernel)


def check(request: Request) -> None:
    planned = _planned(request)
    if planned is None or planned[0].empty:
        return
    plan, backend, kernel, sd = planned
    problems = backend.check(plan)
    if problems:
        more = f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""
        raise CniError(
            CHECK_FAILED,
            f"port mappings of {plan.attachment} differ from the config",
            "; ".join(problems[:10]) + more,
        )
    from portmap.localnet import Registry, interface_for, needed, sysctl_path, tag_of

    ifname = interface_for(plan, request.conf.prev_result, kernel, request.log)
    if ifname is not None:
        try:
            on = kernel.read_sysctl(sysctl_path(ifname)).strip() == "1"
        except OSError:
            on = False
        if not on:
            raise CniError(
                CHECK_FAILED,
                f"route_localnet is off on {ifname}, the interface toward {needed(plan)}",
                f"{sysctl_path(ifname)} is not 1: 127.0.0.1:hostPort cannot reach the container",
            )
        # the guard is ours to keep only where our claim switched it on (an attachment
        # Go's portmap made has no claim: its ADD never guarded anything)
        claims = Registry(kernel, request.log).users().get(ifname, set())
        if tag_of(sd.file_of(plan.attachment)) in claims and not kernel.localnet_guarded(ifname):
            raise CniError(
                CHECK_FAILED,
                f"the localhost guard lacks {ifname}",
                "route_localnet is on there: its link can reach the node's 127.0.0.1",
            )


def gc(request: Request) -> None:
    from common.gc import valid_attachments
    from portmap import state

    config = cfg.parse(request.conf)
    sd = state.store(request.log)
    before = sd.stamps()  # before any lock: see AttachmentStore.sweep
    valid = valid_attachments(request.network, request.conf.body)
    kernel = kernel_of(request)
    for backend in for_gc(config.options, request.network, sd, request.log, kernel):
        flush_conntrack(backend.gc(request.network, valid, before), request.log, kernel)
    from common.identity import network_tag
    from portmap.localnet import Registry

    prefix = network_tag(request.network) + "-"
    Registry(kernel, request.log).sweep(request.network, prefix, sd)


def status(request: Request) -> None:
    from portmap import state

    config = cfg.parse(request.conf)
    kernel = kernel_of(request)
    choose(config.options, state.store(), request.log, kernel).status()

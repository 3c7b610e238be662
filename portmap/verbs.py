"""portmap's verbs: parse -> plan -> apply (through a backend) -> report.

Which backend serves a call is decided here, in one place (the config, the attachment's
record and the host map to a backend object; nothing else knows their names). The
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

    from common.gc import AttachmentId
    from common.log import Log
    from common.result import Result
    from common.skel import Request
    from common.state import AttachmentStore, Stamps
    from portmap.config import Attachment
    from portmap.kernel import Kernel
    from portmap.plan import Plan, UdpTargets
    from portmap.state import Recorded

    class Backend(Protocol):
        name: str  # what its records say

        def owns(self, recorded: Recorded | None) -> bool: ...  # the record is of this backend

        def add(self, plan: Plan) -> None: ...

        def delete(self, att: Attachment, plan: Plan | None) -> UdpTargets: ...

        def check(self, plan: Plan) -> list[str]: ...  # what differs from the plan

        def may_hold(self) -> bool: ...  # mappings no record names (GC looks for them)

        def gc(self, network: str, valid: set[AttachmentId], before: Stamps) -> UdpTargets: ...

        def status(self) -> None: ...


NFTABLES, IPTABLES = cfg.BACKENDS  # the config's "backend" values, and a record's


def attachment(request: Request) -> cfg.Attachment:
    return cfg.Attachment(request.network, request.container_id, request.ifname)


def kernel_of(request: Request) -> Kernel:
    """The kernel port the request was handed, else the host's."""
    if request.kernel is not None:
        kernel: Kernel = request.kernel
        return kernel
    from portmap.kernel import Kernel

    return Kernel()


# ---------------------------------------------------------------------------- which backend


def _make(name: str, sd: AttachmentStore, log: Log, kernel: Kernel) -> Backend:
    if name == IPTABLES:
        from portmap.xtables import XtablesBackend

        return XtablesBackend(sd, log, kernel.xtables)
    from portmap.nft import NftBackend

    return NftBackend(sd, log, kernel.nft)


def _configured(options: cfg.Options, kernel: Kernel) -> str:
    """The configured backend; for auto, the one the options need (cfg.Options.needs),
    else nftables where libnftables works."""
    return options.backend or options.needs or (NFTABLES if kernel.nft.usable() else IPTABLES)


def choose(options: cfg.Options, sd: AttachmentStore, log: Log, kernel: Kernel) -> Backend:
    """The backend of an ADD, CHECK or STATUS."""
    return _make(_configured(options, kernel), sd, log, kernel)


def of_attachment(
    options: cfg.Options, recorded: Recorded | None, sd: AttachmentStore, log: Log, kernel: Kernel
) -> Backend:
    """The backend of a DEL: the one that recorded the attachment, else the config's."""
    if recorded is not None and recorded.backend in cfg.BACKENDS:
        return _make(recorded.backend, sd, log, kernel)
    return choose(options, sd, log, kernel)


def for_gc(
    options: cfg.Options, network: str, sd: AttachmentStore, log: Log, kernel: Kernel
) -> list[Backend]:
    """Every backend that may hold mappings of `network`: the config's, those of its
    records, and each that says it may hold mappings no record names (Backend.may_hold)."""
    names = {_configured(options, kernel)}
    names |= {e.backend for e in sd.entries(network).values() if e.backend in cfg.BACKENDS}
    backends = [_make(name, sd, log, kernel) for name in sorted(cfg.BACKENDS)]
    return [b for b in backends if b.name in names or b.may_hold()]


# ---------------------------------------------------------------------------- host extras


def _route_localnet_path(plan: Plan, kernel: Kernel) -> list[tuple[str, str]]:
    """(container address, /proc path) of route_localnet for each family that needs it."""
    out = []
    for fp in plan.families:
        if fp.forwards and fp.localhost:
            oif = kernel.route_oif_v4(fp.container_ip)
            if oif:
                out.append((fp.container_ip, f"/proc/sys/net/ipv4/conf/{oif}/route_localnet"))
    return out


def enable_route_localnet(plan: Plan, kernel: Kernel) -> None:
    for ip, path in _route_localnet_path(plan, kernel):
        try:
            kernel.write_sysctl(path, "1")
        except OSError as e:
            raise CniError(
                KERNEL_FAILURE, f"cannot enable route_localnet toward {ip} ({path})", str(e)
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


def add(request: Request) -> Result | None:
    config = cfg.parse(request.conf)
    prev = request.conf.prev_result
    if prev is None:
        raise invalid_config(
            "portmap must be chained after a plugin that assigns addresses",
            "the configuration has no prevResult",
        )
    if not config.mappings:
        return None  # pass prevResult through, in the config's cniVersion
    from portmap import state
    from portmap.plan import make_plan

    sd = state.store(request.log)
    kernel = kernel_of(request)
    backend = choose(config.options, sd, request.log, kernel)
    plan = make_plan(config, attachment(request), prev)
    for note in plan.skipped:
        request.log.warning(f"skipped {note}")
    if plan.empty:
        request.log.warning(f"no address on {request.ifname} to forward ports to")
        return None
    backend.add(plan)
    # After the mappings, not before: a refused ADD must leave the interface's
    # route_localnet as it was (it is shared by every container behind it).
    try:
        enable_route_localnet(plan, kernel)
    except CniError:
        backend.delete(attachment(request), plan)
        raise
    flush_conntrack(plan.udp_ports(), request.log, kernel)
    return None


def delete(request: Request) -> None:
    from portmap import state
    from portmap.plan import make_plan

    att = attachment(request)
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
    backend = of_attachment(config.options, recorded, sd, request.log, kernel)
    plan = None
    prev = request.conf.prev_result
    # With a state file of its backend, a backend deletes what the file records and never
    # needs the plan: only without one does the config say where to look.
    if not backend.owns(recorded) and prev is not None and config.mappings:
        try:
            plan = make_plan(config, att, prev)
        except CniError as e:
            request.log.warning(f"cannot plan from the DEL config: {e}")
    flush_conntrack(backend.delete(att, plan), request.log, kernel)
    if recorded is None:  # not made by us: perhaps by the Go portmap (see go_takeover)
        from portmap.go_takeover import release

        cidrs = [ip.address for ip in prev.container_ips(att.ifname)] if prev else []
        released = release(att.network, att.container_id, cidrs, sd, request.log, kernel)
        flush_conntrack(released, request.log, kernel)


def check(request: Request) -> None:
    config = cfg.parse(request.conf)
    prev = request.conf.prev_result
    if prev is None:
        raise invalid_config("CHECK needs a prevResult", "the configuration has no prevResult")
    if not config.mappings:
        return
    from portmap import state
    from portmap.plan import make_plan

    sd = state.store(request.log)
    kernel = kernel_of(request)
    backend = choose(config.options, sd, request.log, kernel)
    plan = make_plan(config, attachment(request), prev)
    if plan.empty:
        return
    problems = backend.check(plan)
    if problems:
        more = f" (+{len(problems) - 10} more)" if len(problems) > 10 else ""
        raise CniError(
            CHECK_FAILED,
            f"port mappings of {plan.attachment} differ from the config",
            "; ".join(problems[:10]) + more,
        )
    for ip, path in _route_localnet_path(plan, kernel):
        try:
            on = kernel.read_sysctl(path).strip() == "1"
        except OSError:
            on = False
        if not on:
            raise CniError(
                CHECK_FAILED,
                f"route_localnet is off on the interface toward {ip}",
                f"{path} is not 1: 127.0.0.1:hostPort cannot reach the container",
            )


def gc(request: Request) -> None:
    from common.gc import valid_attachments
    from portmap import state

    config = cfg.parse(request.conf)
    sd = state.store(request.log)
    before = sd.stamps()  # before any lock: see AttachmentStore.sweep
    valid = valid_attachments(request.conf.body)
    kernel = kernel_of(request)
    for backend in for_gc(config.options, request.network, sd, request.log, kernel):
        flush_conntrack(backend.gc(request.network, valid, before), request.log, kernel)


def status(request: Request) -> None:
    from portmap import state

    config = cfg.parse(request.conf)
    kernel = kernel_of(request)
    choose(config.options, state.store(), request.log, kernel).status()

"""portmap's verbs: parse -> plan -> apply (through a backend) -> report.

The host-side extras that do not depend on the backend live here too: route_localnet on
the interface toward the container (so 127.0.0.1:hostPort can be forwarded) and the UDP
conntrack flush after ADD and DEL.
"""

from __future__ import annotations

from common.errors import CHECK_FAILED, KERNEL_FAILURE, CniError, invalid_config
from common.log import Log
from common.result import Result
from common.skel import Request
from portmap import backend as backends
from portmap import config as cfg
from portmap import state
from portmap.kernel import Kernel
from portmap.plan import Plan, UdpTargets, make_plan


def attachment(request: Request) -> cfg.Attachment:
    return cfg.Attachment(request.network, request.container_id, request.ifname)


def kernel_of(request: Request) -> Kernel:
    """The kernel port the request was handed, else the host's."""
    kernel: Kernel = request.kernel or Kernel()
    return kernel


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
    sd = state.store(request.log)
    kernel = kernel_of(request)
    backend = backends.choose(config.options, sd, request.log, kernel)
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
    backend = backends.of_attachment(config.options, recorded, sd, request.log, kernel)
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

        released = release(att.network, att.container_id, sd, request.log, kernel)
        flush_conntrack(released, request.log, kernel)


def check(request: Request) -> None:
    config = cfg.parse(request.conf)
    prev = request.conf.prev_result
    if prev is None:
        raise invalid_config("CHECK needs a prevResult", "the configuration has no prevResult")
    if not config.mappings:
        return
    sd = state.store(request.log)
    kernel = kernel_of(request)
    backend = backends.choose(config.options, sd, request.log, kernel)
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

    config = cfg.parse(request.conf)
    sd = state.store(request.log)
    before = sd.stamps()  # before any lock: see AttachmentStore.sweep
    valid = valid_attachments(request.conf.body)
    kernel = kernel_of(request)
    for backend in backends.for_gc(config.options, request.network, sd, request.log, kernel):
        flush_conntrack(backend.gc(request.network, valid, before), request.log, kernel)


def status(request: Request) -> None:
    config = cfg.parse(request.conf)
    kernel = kernel_of(request)
    backends.choose(config.options, state.store(), request.log, kernel).status()

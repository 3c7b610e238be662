"""bandwidth's verbs: parse -> plan -> apply -> report, and DEL/CHECK/GC/STATUS from the
same pieces (plan.py decides, tc.py talks to the kernel).

Most attachments are not shaped, and an ADD of one passes prevResult through: each verb
imports the plan, the records and the kernel side only once it has something to do.
"""

from __future__ import annotations

from contextlib import ExitStack

from bandwidth import config
from bandwidth.model import CONTAINER, HOST
from common.errors import (
    CHECK_FAILED,
    INVALID_CONFIG,
    STATUS_UNAVAILABLE,
    CniError,
    invalid_config,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bandwidth.model import Link, Observed
    from bandwidth.plan import Ownership, Placement, Plan
    from bandwidth.ports import Kernel
    from bandwidth.record import Record
    from bandwidth.tc import Rtnl
    from common.attachment import Engine
    from common.identity import Attachment
    from common.result import Result
    from common.skel import Request


def _kernel(request: Request) -> Kernel:
    """The kernel port the request was handed, else the real kernel's."""
    from bandwidth import tc

    kernel: Kernel = request.kernel or tc.Kernel()
    return kernel


def _engine(request: Request) -> Engine[Record]:
    from bandwidth import record
    from common.attachment import Engine

    return Engine(record.store(request.log), request.log, each=_lock_key)


def _lock_key(attachment: Attachment) -> str:
    """Whose calls exclude each other: the ifb is named after the network and container
    (`_names`), so two interfaces of one container on one network share a lock; every
    other attachment's ADD and DEL run beside them (a container that made its own device
    slow to read holds up no one else's call)."""
    return f"{attachment.network}/{attachment.container_id}"


def _prev_result(request: Request) -> Result:
    prev = request.conf.prev_result
    if prev is None:
        raise invalid_config(
            "bandwidth must be called as a chained plugin: the config has no prevResult",
            "put it after the plugin that creates the interface (e.g. bridge) in a conflist",
        )
    return prev


def _locate_and_plan(
    request: Request, cfg: config.BandwidthConfig, stack: ExitStack, gone: int = INVALID_CONFIG
) -> tuple[Placement, Plan, Rtnl]:
    """ADD's and CHECK's start: where to shape, the plan, and the socket of that netns.
    `gone`: the code when the interface is not there; for ADD a config error (nothing
    to shape yet), for CHECK a finding (what was shaped went away, e.g. with its netns)."""
    from bandwidth import plan, tc

    prev = _prev_result(request)
    psched = tc.read_psched()
    kernel = _kernel(request)
    ctr = stack.enter_context(kernel.rtnl(request.netns))
    host = stack.enter_context(kernel.rtnl())
    container_if = ctr.link(request.ifname)
    if container_if is None:
        raise CniError(
            gone,
            f"container interface {request.ifname} not found in {request.netns}",
            "bandwidth must run after the plugin that creates the interface"
            if gone == INVALID_CONFIG
            else "it is gone (deleted, or its netns was); the runtime should DEL it",
        )
    peer = None
    if container_if.kind == "veth" and container_if.peer_index:
        peer = host.link(index=container_if.peer_index)
        if peer is None and gone != INVALID_CONFIG:
            raise CniError(
                gone,
                f"the host side of veth {request.ifname} is gone",
                "the kernel destroys the pair when either end goes; the runtime should DEL it",
            )
    placement = plan.locate(container_if, peer, prev, request.ifname)
    want = plan.build(cfg, placement, *_names(request.attachment), psched)
    return placement, want, host if placement.mode == HOST else ctr


def _names(att: Attachment) -> tuple[str, str]:
    """The attachment's ifb: its name and its alias."""
    from bandwidth import plan

    return (
        plan.ifb_name(att.network, att.container_id),
        plan.ifb_alias(att.network, att.container_id, att.ifname),
    )


# ---------------------------------------------------------------------------- ADD


def add(request: Request) -> Result | None:
    cfg = config.parse(request.conf)
    if not cfg.shapes_anything:
        return None  # nothing to shape: pass prevResult through, like upstream
    from bandwidth import plan
    from bandwidth.plan import Ownership
    from bandwidth.record import Record

    ifb, alias = _names(request.attachment)
    with ExitStack() as stack:
        placement, want, sock = _locate_and_plan(request, cfg, stack)
        device = placement.device
        for note in want.notes:
            request.log.warning(note)
        with _engine(request).add(request.attachment) as change:
            previous: Record | None = change.previous
            owned = Ownership()
            if previous is not None and previous.device_index == device.index:
                owned = previous.ownership
            observed = sock.observe(device, ifb)
            result = plan.reconcile(want, observed, owned, ifb=ifb, alias=alias)
            for kept in result.kept:
                request.log.info(f"kept {kept}")
            new = Record(
                network=request.network,
                container_id=request.container_id,
                ifname=request.ifname,
                mode=placement.mode,
                device=device.name,
                device_index=device.index,
                netns=request.netns,
                ifb=ifb,
                ownership=result.ownership,
            )
            # Undone as a whole, also what a previous ADD made (e.g. the tbf on the host
            # veth): the record says all of it is this attachment's.
            change.intend(new, undo=lambda: _remove(sock, device, new.ownership, ifb, alias))
            sock.apply(result.actions, device)
            changes = f"kernel changes: {len(result.actions)}" if result.actions else "in place"
            request.log.info(f"shaping {want.describe()}; {changes}")
        ifb_link = sock.link(ifb) if want.ifb is not None else None
    return _report(_prev_result(request), placement, ifb_link, request.netns)


def _remove(sock: Rtnl, device: Link | None, owned: Ownership, ifb: str, alias: str) -> None:
    """Take away what the attachment owns on `device` (None: gone) and its ifb."""
    from bandwidth import plan

    observed = sock.observe(device, ifb, ifb_qdisc=False)
    result = plan.reconcile(plan.Plan(), observed, owned, ifb=ifb, alias=alias)
    sock.apply(result.actions, device)


def _report(prev: Result, placement: Placement, ifb: Link | None, netns: str) -> Result:
    """prevResult plus the ifb (upstream appends it with its name and MAC)."""
    if ifb is None:
        return prev
    from common.result import Interface

    sandbox = netns if placement.mode == CONTAINER else ""
    iface = Interface(name=ifb.name, mac=ifb.mac, sandbox=sandbox)
    at = prev.interface_index(ifb.name, in_sandbox=bool(sandbox))
    if at is None:
        prev.interfaces.append(iface)
    else:
        prev.interfaces[at].mac = ifb.mac
    return prev


# ---------------------------------------------------------------------------- DEL / GC


def _teardown(kernel: Kernel, host: Rtnl, att: Attachment, rec: Record | None, netns: str) -> None:
    """Remove what one attachment owns; fine when some or all of it is already gone.

    Where to look comes from its state file; without one (lost, or an attachment made by
    upstream's plugin), from the container interface as ADD would, and then only the ifb
    named after the attachment and the redirect to it are known to be its: when there is
    no such ifb (an attachment that shaped nothing, a second DEL) nothing is removed,
    found with link messages alone.
    """
    from bandwidth.plan import Ownership
    from common.netns import entered_if_present

    ifb, alias = _names(att)
    with ExitStack() as stack:
        sock, device = host, None
        owned = rec.ownership if rec is not None else Ownership()
        netns = rec.netns if rec is not None else netns  # ADD always has one (CNI_NETNS)
        ctr = None
        if rec is None or rec.mode == CONTAINER:
            ctr = stack.enter_context(entered_if_present(netns, kernel.rtnl))
        if rec is not None:
            if rec.mode == CONTAINER:
                if ctr is None:
                    return  # gone with the netns: the ifb and the qdiscs lived there
                sock = ctr
            link = sock.link(rec.device)
            device = link if link is not None and link.index == rec.device_index else None
        elif ctr is not None:
            container_if = ctr.link(att.ifname)
            if container_if is not None and container_if.kind != "veth":
                sock, device = ctr, container_if
            elif container_if is not None and container_if.peer_index:
                peer = host.link(index=container_if.peer_index)
                if peer is not None and peer.peer_index == container_if.index:
                    device = peer
        if rec is None and sock.link(ifb) is None:
            return
        _remove(sock, device, owned, ifb, alias)


def delete(request: Request) -> None:
    ifb = _names(request.attachment)[0]
    kernel = _kernel(request)

    def teardown(rec: Record | None) -> None:
        # Without a record only the ifb named after the attachment can be ours (see
        # _teardown); when neither netns has a device of that name, nothing is left.
        if rec is None and not any(kernel.has_device(ifb, ns) for ns in {"", request.netns}):
            return
        with kernel.rtnl() as host:
            _teardown(kernel, host, request.attachment, rec, request.netns)

    _engine(request).delete(request.attachment, teardown)


def gc(request: Request) -> None:
    """Remove the shaping of every attachment on this network that is not still valid."""
    from bandwidth import plan
    from common.gc import valid_attachments
    from common.identity import Attachment

    valid = valid_attachments(request.network, request.conf.body)
    network = request.network
    kernel = _kernel(request)
    with kernel.rtnl() as host:

        def teardown(rec: Record) -> None:
            _teardown(kernel, host, rec.attachment, rec, "")

        # Records nobody can use (damaged files; what they held cannot say whose) go too:
        # the ifbs they described are found by their aliases below.
        with _engine(request).collecting(network, valid, teardown, unusable="") as alive:
            # ifbs whose state file is gone still name their owner in their alias.
            for link in host.links():
                owner = plan.alias_owner(link.alias, network) if link.kind == "ifb" else None
                if owner is not None and Attachment(network, *owner) not in alive:
                    host.apply((plan.DeleteIfb(link.name, link.index),), None)
                    request.log.info(f"gc: deleted ifb {link.name} of {owner[0]}/{owner[1]}")


# ---------------------------------------------------------------------------- CHECK / STATUS


def check(request: Request) -> None:
    cfg = config.parse(request.conf)
    _prev_result(request)
    if not cfg.shapes_anything:
        return
    from bandwidth import plan

    ifb, _ = _names(request.attachment)
    with ExitStack() as stack:
        placement, want, sock = _locate_and_plan(request, cfg, stack, gone=CHECK_FAILED)
        problems = plan.differences(want, _observe_for_check(sock, placement, ifb))
    if problems:
        raise CniError(
            CHECK_FAILED,
            f"bandwidth shaping of {request.ifname} differs from the config",
            "; ".join(problems),
        )


def _observe_for_check(sock: Rtnl, placement: Placement, ifb: str) -> Observed:
    """The device's qdiscs and filters; a device that vanished while being read (the
    kernel destroys a veth pair after its netns went) is a CHECK finding, not a failure."""
    device = placement.device
    try:
        return sock.observe(device, ifb)
    except CniError:
        if sock.link(index=device.index) is not None:
            raise
    raise CniError(
        CHECK_FAILED,
        f"{placement.mode} device {device.name} vanished while CHECK read it",
        "it was deleted (with its netns?); the runtime should DEL the attachment",
    )


def status(request: Request) -> None:
    """Ready when pyroute2 is installed, the tc clock is readable, rtnetlink answers and
    the state directory can be made. Called on every runtime status poll, so nothing
    heavy is loaded: pyroute2's presence is looked up, not imported."""
    try:
        import importlib.util

        from bandwidth import record, tc

        if importlib.util.find_spec("pyroute2") is None:
            raise ImportError("pyroute2 is not installed")
        tc.read_psched()
        tc.netlink_answers()
        record.store().ensure()
    except Exception as e:  # whatever stops us from serving an ADD
        raise CniError(STATUS_UNAVAILABLE, "bandwidth cannot shape traffic here", str(e)) from e

"""What the kernel should hold for one attachment, and how to get there (pure).

`locate` decides where to shape (the host-side veth, or the container interface when it is
not a veth), `build` turns the config into a `Plan`, `reconcile` lists the `Action`s that
take the kernel from what it holds to the plan (for ADD, a second ADD and DEL alike), and
`differences` is CHECK, in words.
"""

from __future__ import annotations

from bandwidth.config import BandwidthConfig
from bandwidth.model import (
    CONTAINER,
    ETH_P_ALL,
    FILTER_PRIO,
    HOST,
    TBF_HANDLE,
    DeviceState,
    Filter,
    IfbState,
    Link,
    Observed,
    Qdisc,
    Tbf,
)
from common.digest import sha512_hex
from common.errors import CONFLICT, CniError, invalid_config
from common.result import Result
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from bandwidth.tbf import Psched

IFB_PREFIX = "bwp"
IFNAMSIZ = 15
ALIAS_PREFIX = "cni-meta-bandwidth"
# IFALIASZ is 256 with the terminating NUL, which the kernel's attribute policy counts
# (a 255-byte alias is refused with ERANGE): 254 bytes of text at most.
IFALIAS_MAX = 254


def ifb_name(network: str, container_id: str) -> str:
    """Upstream's name: "bwp" + the first 12 hex digits of sha512(network + container id)."""
    digest = sha512_hex((network + container_id).encode())
    return (IFB_PREFIX + digest)[:IFNAMSIZ]


def ifb_alias(network: str, container_id: str, ifname: str) -> str:
    """The owner, written on the ifb so that GC (and an operator) can tell whose it is."""
    alias = f"{ALIAS_PREFIX} {network}/{container_id}/{ifname}"
    return alias.encode()[:IFALIAS_MAX].decode(errors="ignore")


def alias_owner(alias: str, network: str) -> tuple[str, str] | None:
    """(container id, ifname) from an alias of ours on `network`, else None."""
    prefix = f"{ALIAS_PREFIX} {network}/"
    if not alias.startswith(prefix):
        return None
    parts = alias[len(prefix) :].split("/")
    if len(parts) != 2 or not all(parts):
        return None  # truncated: better to keep a device than to delete a stranger's
    return parts[0], parts[1]


# ---------------------------------------------------------------------------- where


class Placement(Value):
    mode: str  # HOST or CONTAINER
    device: Link  # the host veth, or the container interface


def locate(container_if: Link, peer: Link | None, prev: Result, ifname: str) -> Placement:
    """Where to shape, from the container interface and (for a veth) its host-side peer."""
    if container_if.kind != "veth":
        return Placement(CONTAINER, container_if)
    if peer is None or peer.kind != "veth" or peer.peer_index != container_if.index:
        raise invalid_config(
            f"the veth peer of container interface {ifname} is not in this network namespace",
            f"peer ifindex {container_if.peer_index}; bandwidth must run in the netns that "
            "holds the host side of the veth",
        )
    # Results older than 0.3.0 carry no interfaces at all; then the ifindex alone decides.
    if prev.interfaces and prev.interface_index(peer.name, in_sandbox=False) is None:
        raise invalid_config(
            f"host veth {peer.name} (peer of {ifname}) is not listed in prevResult.interfaces",
            "the plugin that created the veth must report its host side (without sandbox)",
        )
    return Placement(HOST, peer)


# ---------------------------------------------------------------------------- the plan


class IfbPlan(Value):
    name: str
    mtu: int
    alias: str
    tbf: Tbf


class Plan(Value):
    """The desired state. `device_tbf` shapes traffic leaving the device; the ifb's tbf
    shapes traffic arriving at it. On the host veth, leaving = container ingress; on the
    container interface, leaving = container egress. `Plan()` shapes nothing (DEL's)."""

    mode: str = HOST
    device: str = ""
    device_tbf: Tbf | None = None
    ifb: IfbPlan | None = None
    notes: tuple[str, ...] = ()  # for the log: bursts that had to be clamped

    def describe(self) -> str:
        """For the log, in the container's directions: "ingress 8000 bit/s burst 1515
        bytes on veth1234, egress ... on ifb bwp... (fed by veth1234)"."""
        leaving, arriving = ("ingress", "egress") if self.mode == HOST else ("egress", "ingress")
        shaped = []
        if self.device_tbf is not None:
            shaped.append(f"{leaving} {self.device_tbf.rate_and_burst()} on {self.device}")
        if self.ifb is not None:
            shaped.append(
                f"{arriving} {self.ifb.tbf.rate_and_burst()} on ifb {self.ifb.name} "
                f"(fed by {self.device})"
            )
        return ", ".join(shaped)


def build(cfg: BandwidthConfig, placement: Placement, ifb: str, alias: str, psched: Psched) -> Plan:
    """`ifb` and `alias`: the attachment's ifb name and owner (`ifb_name`, `ifb_alias`)."""
    from bandwidth.tbf import make_tbf  # not at the top: DEL and GC build no plan

    device = placement.device
    if placement.mode == HOST:
        leaving, arriving, where = cfg.ingress, cfg.egress, f"host veth {device.name}"
    else:
        leaving, arriving, where = cfg.egress, cfg.ingress, f"container interface {device.name}"
    device_tbf, leaving_note = (
        make_tbf(leaving, device.mtu, where, psched) if leaving else (None, "")
    )
    ifb_tbf, arriving_note = (
        make_tbf(arriving, device.mtu, where, psched) if arriving else (None, "")
    )
    ifb_plan = IfbPlan(ifb, device.mtu, alias, ifb_tbf) if ifb_tbf is not None else None
    notes = tuple(note for note in (leaving_note, arriving_note) if note)
    return Plan(placement.mode, device.name, device_tbf, ifb_plan, notes)


# ---------------------------------------------------------------------------- actions


class Action(Value):
    """One change to the kernel; `tc.Rtnl.apply` carries them out. `what` says it in a
    user's words (errors), filled in with the action's fields and the shaped `device`."""

    what = "changing {device}"

    def describe(self, device: str) -> str:
        return self.what.format(device=device, **self.fields())


class _IfbSettings(Action):
    name: str
    mtu: int
    alias: str


class CreateIfb(_IfbSettings):
    what = "creating the ifb {name}"  # with its alias, up


class UpdateIfb(_IfbSettings):
    what = "updating the ifb {name}"  # its MTU and alias, up


class DeleteIfb(Action):
    what = "deleting the ifb {name}"
    name: str
    index: int  # the ifindex it was observed at: deleted by it, with no lookup by name


class SetTbf(Action):
    ifb: str  # the ifb to put it on; "" for the shaped device
    tbf: Tbf

    def describe(self, device: str) -> str:
        return f"setting the rate limit (tbf) on {self.ifb or device}"


class DeleteRootQdisc(Action):
    what = "deleting the root qdisc of {device}"


class AddIngressQdisc(Action):
    what = "adding an ingress qdisc to {device}"


class DeleteIngressQdisc(Action):
    what = "deleting the ingress qdisc of {device}"


class DeleteFilters(Action):
    what = "deleting stale ingress filters of {device}"
    parent: int
    prio: int
    protocol: int
    kind: str


class AddRedirect(Action):
    what = "redirecting the ingress of {device} to the ifb {ifb}"
    parent: int
    ifb: str


# The order actions run in, whatever mix a reconciliation produces: the ifb and its tbf
# exist before traffic is redirected to it, and the redirect is gone before the ifb.
_ORDER: tuple[type[Action], ...] = (
    CreateIfb,
    UpdateIfb,
    AddIngressQdisc,
    DeleteFilters,
    DeleteIngressQdisc,
    DeleteIfb,
    SetTbf,
    AddRedirect,
    DeleteRootQdisc,
)


def _rank(action: Action) -> tuple[int, int]:
    # The ifb's tbf goes in right after the ifb is made, the device's at the end.
    if isinstance(action, SetTbf) and action.ifb:
        return (_ORDER.index(UpdateIfb), 1)
    return (_ORDER.index(type(action)), 0)


class Ownership(Value):
    """What this attachment created on a device it does not own (kept in a state file)."""

    device_tbf: bool = False
    ingress_qdisc: bool = False


class Reconciliation(Value):
    actions: tuple[Action, ...]
    ownership: Ownership
    kept: tuple[str, ...] = ()  # foreign objects left alone, for the log


# ---------------------------------------------------------------------------- reconcile


def _ifb_is_ours(ifb: IfbState | None, alias: str) -> bool:
    # No alias: made by upstream's plugin or by hand with our hash name; adopt it, as
    # upstream's DEL would delete it by name.
    return ifb is not None and ifb.link.kind == "ifb" and ifb.link.alias in ("", alias)


class _FilterGroup(Value):
    prio: int
    kind: str
    protocol: int
    rules: tuple[Filter, ...]


_UNREAD = "more, not read"  # what a device with more filters than are read has beyond them


def _groups(device: DeviceState) -> tuple[list[_FilterGroup], list[_FilterGroup]]:
    """(whole groups, the group the read stopped in): when the hook held more filters
    than were read (`complete` false), the group of the last entry read may go on beyond
    it, so it is not judged by the part seen (it is someone else's, as what follows)."""
    by_key: dict[tuple[int, str, int], list[Filter]] = {}
    for f in device.filters:
        by_key.setdefault((f.prio, f.kind, f.protocol), []).append(f)
    last = device.filters[-1] if device.filters and not device.complete else None
    cut = (last.prio, last.kind, last.protocol) if last is not None else None
    whole: list[_FilterGroup] = []
    partial: list[_FilterGroup] = []
    for key, fs in sorted(by_key.items()):
        group = _FilterGroup(*key, tuple(f for f in fs if f.is_rule))
        (partial if key == cut else whole).append(group)
    return whole, partial


def _group_is_ours(group: _FilterGroup, ifb_index: int | None, live: frozenset[int]) -> bool:
    """Ours: u32 rules that only redirect to our ifb, or to a device that no longer exists
    (a filter left behind by an earlier run of this attachment, which drops traffic)."""
    if group.kind != "u32" or not group.rules:
        return False
    for rule in group.rules:
        if rule.other_actions or rule.redirect_to is None:
            return False
        if rule.redirect_to != ifb_index and rule.redirect_to in live:
            return False
    return True


def _group_is_wanted(group: _FilterGroup, ifb_index: int | None) -> bool:
    return (
        group.prio == FILTER_PRIO
        and group.protocol == ETH_P_ALL
        and len(group.rules) == 1
        and group.rules[0].match_all
        and group.rules[0].redirect_to == ifb_index
    )


def reconcile(
    plan: Plan, observed: Observed, owned: Ownership, *, ifb: str, alias: str
) -> Reconciliation:
    """The actions that take the kernel from `observed` to `plan`.

    `ifb` and `alias` name this attachment's ifb even when the plan has none (DEL).
    Raises CONFLICT before any action when the plan needs a place someone else holds.
    """
    actions: list[Action] = []
    kept: list[str] = []
    conflicts: list[str] = []
    ours_ifb = observed.ifb if _ifb_is_ours(observed.ifb, alias) else None
    ifb_index = ours_ifb.link.index if ours_ifb is not None else None
    device_tbf_owned, ingress_owned = owned.device_tbf, owned.ingress_qdisc

    # -- the ifb
    if plan.ifb is not None:
        link = observed.ifb.link if observed.ifb is not None else None
        if link is None:
            actions.append(CreateIfb(ifb, plan.ifb.mtu, plan.ifb.alias))
        elif ours_ifb is None:
            conflicts.append(
                f"ifb {link.name} belongs to {link.alias!r}"
                if link.kind == "ifb"
                else f"a {link.kind or 'non-ifb'} device named {link.name} exists"
            )
        elif (link.mtu, link.alias, link.up) != (plan.ifb.mtu, plan.ifb.alias, True):
            actions.append(UpdateIfb(ifb, plan.ifb.mtu, plan.ifb.alias))
        root = observed.ifb.root if observed.ifb is not None else None
        if root is None or root.tbf != plan.ifb.tbf.params or root.handle != TBF_HANDLE:
            actions.append(SetTbf(ifb, plan.ifb.tbf))
    elif ours_ifb is not None:
        actions.append(DeleteIfb(ifb, ours_ifb.link.index))

    device = observed.device
    if device is not None:
        # -- the redirect of arriving traffic to the ifb
        groups, partial = _groups(device)
        ours = [g for g in groups if _group_is_ours(g, ifb_index, observed.live_indexes)]
        foreign = [g for g in groups if g.rules and g not in ours] + partial
        unread = [] if device.complete else [_UNREAD]
        parent = device.filter_parent
        if plan.ifb is not None:
            if foreign or unread:
                conflicts.append(
                    f"{plan.device} already has ingress filters bandwidth did not create ("
                    + ", ".join([f"{g.kind} filter prio {g.prio}" for g in foreign] + unread)
                    + "); redirecting all its traffic to the ifb would bypass them"
                )
            wanted = [g for g in ours if _group_is_wanted(g, ifb_index)][:1]
            stale = [g for g in ours if g not in wanted]
            if device.ingress is None:
                actions.append(AddIngressQdisc())
                ingress_owned = True
            if not wanted:
                actions.append(AddRedirect(parent, ifb))
        else:
            stale = ours
            ingress = device.ingress
            if ingress is not None and ingress_owned and ingress.kind == "ingress":
                if foreign or unread:
                    kept.append(f"ingress qdisc on {device.link.name}: others' filters use it")
                else:
                    actions.append(DeleteIngressQdisc())
                    stale = []  # the kernel deletes a qdisc's filters with it
            ingress_owned = False
        actions += [DeleteFilters(parent, g.prio, g.protocol, g.kind) for g in stale]

        # -- the tbf on the device itself
        root = device.root
        root_ours = root is not None and root.kind == "tbf" and root.handle == TBF_HANDLE
        if plan.device_tbf is not None:
            # The kernel's own root qdiscs (noqueue, pfifo_fast, fq_codel, mq) have handle 0.
            if root is not None and root.handle != 0 and not root_ours:
                conflicts.append(
                    f"{plan.device} already has root qdisc {root.describe()} that bandwidth "
                    "did not create; remove it or shape this attachment another way"
                )
            elif root is None or root.tbf != plan.device_tbf.params:
                actions.append(SetTbf("", plan.device_tbf))
        elif device_tbf_owned and root_ours:
            actions.append(DeleteRootQdisc())
        device_tbf_owned = plan.device_tbf is not None

    if conflicts:
        raise CniError(
            CONFLICT,
            "bandwidth cannot shape without changing what others configured",
            "; ".join(conflicts),
        )
    ordered = tuple(sorted(actions, key=_rank))
    return Reconciliation(ordered, Ownership(device_tbf_owned, ingress_owned), tuple(kept))


# ---------------------------------------------------------------------------- CHECK


def _tbf_differences(what: str, root: Qdisc | None, want: Tbf) -> list[str]:
    if root is None or root.kind != "tbf" or root.tbf is None:
        found = root.describe() if root is not None else "none"
        return [f"{what}: no tbf root qdisc (found {found}), want {want.describe()}"]
    have = root.tbf
    out = []
    if have.rate != want.rate:
        out.append(f"{what}: tbf rate is {have.rate * 8} bit/s, want {want.rate * 8} bit/s")
    if have.buffer != want.buffer:
        out.append(
            f"{what}: tbf buffer is {have.buffer} ticks, want {want.buffer} "
            f"(burst {want.burst} bytes)"
        )
    if have.limit != want.limit:
        out.append(f"{what}: tbf limit is {have.limit} bytes, want {want.limit}")
    return out


def _redirect_differences(plan: Plan, device: DeviceState, ifb: IfbState) -> list[str]:
    out = []
    if device.ingress is None:
        return [f"{plan.device}: no ingress qdisc, so nothing is redirected to {ifb.link.name}"]
    rules = [f for f in device.filters if f.is_rule]
    redirects = [f for f in rules if f.redirect_to == ifb.link.index and f.match_all]
    if not redirects:
        targets = sorted({f.redirect_to for f in rules if f.redirect_to is not None})
        found = f" (redirects found to ifindex {targets})" if targets else ""
        out.append(
            f"{plan.device}: no ingress filter redirects all traffic to {ifb.link.name}"
            f" (ifindex {ifb.link.index}){found}"
        )
    others = [f for f in rules if f not in redirects]
    if others or not device.complete:
        unread = [] if device.complete else [_UNREAD]
        out.append(
            f"{plan.device}: other ingress filters present ("
            + ", ".join([f"{f.kind} prio {f.prio}" for f in others] + unread)
            + ")"
        )
    return out


def differences(plan: Plan, observed: Observed) -> list[str]:
    """CHECK: everything that differs from the plan; empty when the kernel matches."""
    out: list[str] = []
    device = observed.device
    if device is None:  # CHECK observes the device it shapes, and only with something to shape
        return [f"{plan.device}: device not found"]
    if plan.device_tbf is not None:
        out += _tbf_differences(plan.device, device.root, plan.device_tbf)
    if plan.ifb is not None:
        ifb = observed.ifb
        if ifb is None or ifb.link.kind != "ifb":
            return [*out, f"ifb {plan.ifb.name} is missing"]
        if not ifb.link.up:
            out.append(f"ifb {plan.ifb.name} is down")
        if ifb.link.mtu != plan.ifb.mtu:
            out.append(f"ifb {plan.ifb.name} has MTU {ifb.link.mtu}, want {plan.ifb.mtu}")
        out += _tbf_differences(f"ifb {plan.ifb.name}", ifb.root, plan.ifb.tbf)
        out += _redirect_differences(plan, device, ifb)
    return out

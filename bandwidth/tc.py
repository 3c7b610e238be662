"""The one place bandwidth talks to the kernel: links, qdiscs and filters.

`Kernel`, the port the verbs are handed, opens an `Rtnl` in a network namespace, which
reads it into `bandwidth.model` values (`observe`) and carries out the actions of a
`plan.reconcile` (`apply`), deciding nothing. pyroute2's message classes encode and
decode; `common.rtnl` carries the messages.
"""

from __future__ import annotations

import errno
import sys
from _socket import htons, ntohs
from contextlib import nullcontext
from types import SimpleNamespace

from bandwidth import plan
from bandwidth.model import (
    ETH_P_ALL,
    FILTER_PRIO,
    FLOW_ID,
    INGRESS_HANDLE,
    TBF_HANDLE,
    TC_H_INGRESS,
    TC_H_ROOT,
    DeviceState,
    Filter,
    IfbState,
    Link,
    Observed,
    Qdisc,
    TbfParams,
)
from common import rtnl
from common.errors import KERNEL_FAILURE, CniError
from common.rtnl import IFF_UP, NetlinkError, RtnlSocket

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from bandwidth.tbf import Psched

PSCHED = "/proc/net/psched"
SIOCGIFINDEX = 0x8933  # linux/sockios.h: a device's ifindex by its name
TCA_EGRESS_REDIR = 1
MATCH_ALL = ["0x0/0x0+0"]  # u32: 0 under mask 0 at offset 0, i.e. every packet
CREATE = rtnl.NLM_F_CREATE | rtnl.NLM_F_EXCL
# How many entries of an ingress hook's filter dump are read. Ours are one u32 filter at
# prio 1 (three entries: the classifier, its hash table, the rule), listed first; more
# than this are someone else's (in container mode the container's own, which it can grow
# without bound), and reading them would make every call on the device, held under the
# attachment's lock, as slow as they are many.
MAX_FILTER_ENTRIES = 64
# What the kernel answers when the object a request names is not there (any more): the
# device (ENODEV: a host veth the kernel destroys a moment after its netns went), the
# qdisc or filter (ENOENT; EINVAL for a qdisc the device never had). For a read that is
# "none", for a delete "done". A create meeting them fails: it cannot do its job.
GONE = (errno.ENODEV, errno.ENOENT, errno.EINVAL)

# tbf's attributes (linux/pkt_sched.h). pyroute2 maps only the first four; rates of
# 2^32 bytes/s and more need TCA_TBF_RATE64 both ways (the kernel takes the larger of
# it and tc_ratespec.rate, and dumps it for such rates, with U32_MAX in the ratespec).
TBF_OPTIONS = (
    (0, "TCA_TBF_UNSPEC", "none"),
    (1, "TCA_TBF_PARMS", "tbf_parms"),
    (2, "TCA_TBF_RTAB", "rtab"),
    (3, "TCA_TBF_PTAB", "ptab"),
    (4, "TCA_TBF_RATE64", "uint64"),
    (5, "TCA_TBF_PRATE64", "uint64"),
    (6, "TCA_TBF_BURST", "uint32"),
    (7, "TCA_TBF_PBURST", "uint32"),
    (8, "TCA_TBF_PAD", "hex"),
)
_tc_modules: SimpleNamespace | None = None


def read_psched(path: str = PSCHED) -> Psched:
    from bandwidth.tbf import Psched  # not at the top: DEL and GC need no tc clock

    try:
        with open(path) as f:
            return Psched.parse(f.read())
    except (OSError, ValueError, IndexError) as e:
        raise CniError(
            KERNEL_FAILURE, f"cannot read the kernel's tc clock from {path}", str(e)
        ) from None


def tc_modules() -> SimpleNamespace:
    """A tc message class (`tcmsg`) and pyroute2's `cls_u32` module, loaded without the
    `tcmsg` package's __init__, which imports every qdisc and classifier module pyroute2
    has (with `dataclasses` and `inspect`). The class decodes the options of the kinds
    bandwidth sends (tbf, ingress, u32); any other kind's stay undecoded: of someone
    else's qdisc or filter only its kind, handle and parent are read."""
    global _tc_modules
    if _tc_modules is not None:
        return _tc_modules
    rtnl.pyroute2()  # the pyroute2 package, registered without its __init__
    if "pyroute2.netlink.rtnl.tcmsg" not in sys.modules:
        rtnl.register_package_without_init("pyroute2.netlink.rtnl.tcmsg")
    from pyroute2.netlink import nlmsg
    from pyroute2.netlink.rtnl.tcmsg import cls_u32, sched_ingress, sched_tbf, sched_template

    class TbfOptions(sched_tbf.options):  # type: ignore[misc,name-defined]
        # A subclass, so that other users of pyroute2 in the process see sched_tbf
        # unchanged. pyroute2 compiles a class's nla_map once and flags it in this
        # (name-mangled) attribute, which a subclass would inherit: compile ours separately.
        _nlmsg_base__compiled_nla = False
        nla_map = TBF_OPTIONS

    options = {"tbf": TbfOptions, "ingress": sched_ingress.options, "u32": cls_u32.options}

    class TcMsg(nlmsg):  # type: ignore[misc,valid-type]
        """struct tcmsg (linux/rtnetlink.h) with its attributes (TCA_*)."""

        prefix = "TCA_"
        fields = (("family", "B"), ("pad1", "B"), ("pad2", "H"), ("index", "i"),
                  ("handle", "I"), ("parent", "I"), ("info", "I"))  # fmt: skip
        nla_map = (
            ("TCA_UNSPEC", "none"),
            ("TCA_KIND", "asciiz"),
            ("TCA_OPTIONS", "get_options"),
            ("TCA_STATS", "hex"),
            ("TCA_XSTATS", "hex"),
            ("TCA_RATE", "hex"),
            ("TCA_FCNT", "hex"),
            ("TCA_STATS2", "hex"),
            ("TCA_STAB", "hex"),
        )

        @staticmethod
        def get_options(msg: Any, *args: Any, **kwargs: Any) -> Any:
            # Called with the message being decoded (or encoded): the class for its options.
            return options.get(msg.get_attr("TCA_KIND"), sched_template.options)

    _tc_modules = SimpleNamespace(tcmsg=TcMsg, cls_u32=cls_u32)
    return _tc_modules


def tbf_options(rate: int, buffer: int, limit: int) -> dict[str, Any]:
    """TCA_OPTIONS of a tbf: the buffer and limit as computed by `bandwidth.tbf`, the rate
    in tc_ratespec when it fits in 32 bits, else U32_MAX there and the rate in RATE64
    (what tc does; Go sends the same RATE64). The rate table pyroute2 adds only serves
    the kernel's link-layer detection."""
    from bandwidth.tbf import U32_MAX

    parms = {"rate": min(rate, U32_MAX), "buffer": buffer, "limit": limit}
    attrs: list[list[Any]] = [["TCA_TBF_PARMS", parms], ["TCA_TBF_RTAB", True]]
    if rate > U32_MAX:
        attrs.append(["TCA_TBF_RATE64", rate])
    return {"attrs": attrs}


# ---------------------------------------------------------------------------- decoding


def _link(msg: Any) -> Link:
    info = msg.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    return Link(
        index=int(msg["index"]),
        name=str(msg.get_attr("IFLA_IFNAME") or ""),
        kind=str(kind or ""),
        mtu=int(msg.get_attr("IFLA_MTU") or 0),
        up=bool(msg["flags"] & IFF_UP),
        alias=str(msg.get_attr("IFLA_IFALIAS") or ""),
        mac=str(msg.get_attr("IFLA_ADDRESS") or ""),
        peer_index=msg.get_attr("IFLA_LINK"),
    )


def _qdisc(msg: Any) -> Qdisc:
    kind = str(msg.get_attr("TCA_KIND") or "")
    tbf = None
    if kind == "tbf":
        options = msg.get_attr("TCA_OPTIONS")
        parms = options.get_attr("TCA_TBF_PARMS") if options is not None else None
        if parms is not None:
            rate = max(int(parms["rate"]), int(options.get_attr("TCA_TBF_RATE64") or 0))
            tbf = TbfParams(rate, int(parms["buffer"]), int(parms["limit"]))
    return Qdisc(kind, int(msg["handle"]), int(msg["parent"]), tbf)


def _redirect_target(act: Any) -> int | None:
    """The ifindex a mirred egress redirect action sends to, or None for any other action."""
    if act.get_attr("TCA_ACT_KIND") != "mirred":
        return None
    options = act.get_attr("TCA_ACT_OPTIONS")
    parms = options.get_attr("TCA_MIRRED_PARMS") if options is not None else None
    if parms is None or parms["eaction"] != TCA_EGRESS_REDIR:
        return None
    return int(parms["ifindex"])


def _actions(acts: Any) -> tuple[int | None, bool]:
    """(redirect target, whether there is any other action) of a filter's action list."""
    entries = [value for name, value in acts.get("attrs", []) if name.startswith("TCA_ACT_PRIO")]
    targets = [_redirect_target(act) for act in entries]
    redirect = next((t for t in targets if t is not None), None)
    return redirect, len(entries) != 1 or redirect is None


def _filter(msg: Any) -> Filter:
    kind = str(msg.get_attr("TCA_KIND") or "")
    info = int(msg["info"])
    options = msg.get_attr("TCA_OPTIONS")
    is_rule = match_all = other = False
    redirect = None
    if kind == "u32" and options is not None:
        selector = options.get_attr("TCA_U32_SEL")
        if selector is not None:
            is_rule = True
            match_all = all(key["key_mask"] == 0 for key in selector["keys"])
        acts = options.get_attr("TCA_U32_ACT")
        if acts is not None:
            is_rule = True
            redirect, other = _actions(acts)
    elif options is not None:
        is_rule = other = True  # a classifier we do not model: someone else's
    return Filter(
        parent=int(msg["parent"]),
        prio=info >> 16,
        kind=kind,
        protocol=ntohs(info & 0xFFFF),
        handle=int(msg["handle"]),
        is_rule=is_rule,
        match_all=match_all,
        redirect_to=redirect,
        other_actions=other,
    )


class Kernel:
    """bandwidth's kernel port (`bandwidth.ports.Kernel`) on the host."""

    def rtnl(self, netns: str = "") -> Rtnl:
        """pyroute2's tc modules load with its first tc message: they cost more than the
        rest of a call, and a DEL that finds nothing to remove sends none."""
        return Rtnl(RtnlSocket(netns=netns))

    def has_device(self, name: str, netns: str = "") -> bool:
        """Asked with the ioctl if_nametoindex(3) makes: a DEL without a record learns that
        there is no ifb to remove before it loads pyroute2's message classes, which cost
        more than the rest of such a call. The ioctl goes to the netns of the socket it is
        made on. Any answer but "no such device" is True, and rtnetlink then looks."""
        import fcntl
        import struct

        from common.netns import entered

        try:
            with entered(netns) if netns else nullcontext():
                nl = rtnl.NetlinkSocket(rtnl.NETLINK_ROUTE)
        except CniError:
            return False
        with nl:
            try:
                fcntl.ioctl(nl.sock.fileno(), SIOCGIFINDEX, struct.pack("16si", name.encode(), 0))
            except OSError as e:
                return e.errno != errno.ENODEV
        return True


class Rtnl:
    """bandwidth's requests on one rtnetlink socket, in the netns it was opened in; the
    socket is closed when the `with` block that opened it ends."""

    def __init__(self, nl: RtnlSocket) -> None:
        self.nl = nl
        self.m = self.nl.modules
        # ifindex of the devices this socket's actions have resolved: the ifb just made is
        # named by three actions in a row (alias, tbf, redirect), one lookup serves them.
        self.indexes: dict[str, int] = {}

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *_: object) -> None:
        self.nl.close()

    def _tcmsg(self, index: int, parent: int = 0, handle: int = 0, info: int = 0) -> Any:
        msg = tc_modules().tcmsg()  # pyroute2's tc modules load with the first tc message
        msg["index"], msg["parent"], msg["handle"], msg["info"] = index, parent, handle, info
        return msg

    # -- reading

    def link(self, name: str = "", index: int = 0) -> Link | None:
        """The device named `name`, or else the one with ifindex `index`."""
        if not name and index <= 0:  # e.g. a mirred action whose target was deleted
            return None
        found = self.nl.link(name, index)
        return _link(found) if found is not None else None

    def links(self) -> list[Link]:
        found = self.nl.request(self.m.ifinfmsg(), rtnl.RTM_GETLINK, rtnl.NLM_F_DUMP)
        return [_link(m) for m in found]

    def _get_qdisc(self, index: int, parent: int) -> Qdisc | None:
        # A GET for one parent rather than a dump: a dump lists every qdisc of every
        # device, hundreds on a busy node. The kernel answers a GET only with ECHO.
        msg = self._tcmsg(index, parent)
        found = self.nl.request(msg, rtnl.RTM_GETQDISC, rtnl.NLM_F_ECHO, tolerate=GONE)
        return _qdisc(found[0]) if found else None

    def device_state(self, link: Link) -> DeviceState:
        qdiscs = tuple(
            q for q in (self._get_qdisc(link.index, p) for p in (TC_H_ROOT, TC_H_INGRESS)) if q
        )
        state = DeviceState(link, qdiscs)
        if state.ingress is None:
            return state
        msg = self._tcmsg(link.index, state.filter_parent)
        filters, more = self.nl.dump(msg, rtnl.RTM_GETTFILTER, MAX_FILTER_ENTRIES, tolerate=GONE)
        return DeviceState(link, qdiscs, tuple(_filter(m) for m in filters), complete=not more)

    def observe(self, device: Link | None, ifb: str, *, ifb_qdisc: bool = True) -> Observed:
        """What `device` and the ifb named `ifb` have. `ifb_qdisc` false: the ifb's root
        qdisc is not read (a DEL deletes the ifb, and its qdisc with it, whatever it is)."""
        try:
            state = self.device_state(device) if device is not None else None
            ifb_link = self.link(ifb)
            ifb_state = None
            if ifb_link is not None:
                root = self._get_qdisc(ifb_link.index, TC_H_ROOT) if ifb_qdisc else None
                ifb_state = IfbState(ifb_link, root)
            targets = {f.redirect_to for f in state.filters if f.redirect_to} if state else set()
            # A redirect to the ifb just read needs no lookup to know it is alive.
            known = {ifb_link.index} if ifb_link is not None else set()
            live = frozenset(t for t in targets if t in known or self.link(index=t) is not None)
        except (NetlinkError, TimeoutError) as e:
            raise CniError(KERNEL_FAILURE, "reading links and qdiscs failed", str(e)) from None
        return Observed(state, ifb_state, live)

    # -- changing

    def _index(self, name: str) -> int:
        if name in self.indexes:
            return self.indexes[name]
        link = self.link(name)
        if link is None:
            raise CniError(KERNEL_FAILURE, f"device {name} vanished while being configured")
        self.indexes[name] = link.index
        return link.index

    def apply(self, actions: tuple[plan.Action, ...], device: Link | None) -> None:
        for action in actions:
            try:
                self._apply_one(action, device)
            except (NetlinkError, TimeoutError) as e:
                what = action.describe(device.name if device is not None else "the device")
                raise CniError(KERNEL_FAILURE, f"{what} failed", str(e)) from None

    def _set_link(self, index: int, **attrs: Any) -> None:
        msg = self.m.ifinfmsg()
        msg["index"], msg["flags"], msg["change"] = index, IFF_UP, IFF_UP  # and bring it up
        msg["attrs"] = [[name, value] for name, value in attrs.items()]
        self.nl.request(msg, rtnl.RTM_NEWLINK)

    def _apply_one(self, action: plan.Action, device: Link | None) -> None:
        # reconcile plans changes of the device only when it observed one (`device`)
        device_index = device.index if device is not None else 0
        if isinstance(action, plan.CreateIfb):
            self.indexes.pop(action.name, None)
            msg = self.m.ifinfmsg()
            msg["attrs"] = [
                ["IFLA_IFNAME", action.name],
                ["IFLA_MTU", action.mtu],
                ["IFLA_LINKINFO", {"attrs": [["IFLA_INFO_KIND", "ifb"]]}],
            ]
            self.nl.request(msg, rtnl.RTM_NEWLINK, CREATE)
            # The kernel ignores IFLA_IFALIAS when it creates a link: set it afterwards.
            self._set_link(self._index(action.name), IFLA_IFALIAS=action.alias)
        elif isinstance(action, plan.UpdateIfb):
            self._set_link(self._index(action.name), IFLA_MTU=action.mtu, IFLA_IFALIAS=action.alias)
        elif isinstance(action, plan.DeleteIfb):
            # By the ifindex it was observed (and found ours) at: ifindexes are not reused
            # soon, so this deletes that device or, when it is gone already, nothing.
            self.indexes.pop(action.name, None)
            msg = self.m.ifinfmsg()
            msg["index"] = action.index
            self.nl.request(msg, rtnl.RTM_DELLINK, tolerate=GONE)
        elif isinstance(action, plan.SetTbf):
            target = self._index(action.ifb) if action.ifb else device_index
            options = tbf_options(action.tbf.rate, action.tbf.buffer, action.tbf.limit)
            msg = self._tcmsg(target, TC_H_ROOT, TBF_HANDLE)
            msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", options]]
            self.nl.request(msg, rtnl.RTM_NEWQDISC, rtnl.NLM_F_CREATE | rtnl.NLM_F_REPLACE)
        elif isinstance(action, plan.DeleteRootQdisc):
            msg = self._tcmsg(device_index, TC_H_ROOT)
            self.nl.request(msg, rtnl.RTM_DELQDISC, tolerate=GONE)
        elif isinstance(action, plan.AddIngressQdisc):
            msg = self._tcmsg(device_index, TC_H_INGRESS, INGRESS_HANDLE)
            msg["attrs"] = [["TCA_KIND", "ingress"]]
            self.nl.request(msg, rtnl.RTM_NEWQDISC, CREATE, tolerate=(errno.EEXIST,))
        elif isinstance(action, plan.DeleteIngressQdisc):
            msg = self._tcmsg(device_index, TC_H_INGRESS, INGRESS_HANDLE)
            self.nl.request(msg, rtnl.RTM_DELQDISC, tolerate=GONE)
        elif isinstance(action, plan.DeleteFilters):
            info = (action.prio << 16) | htons(action.protocol)
            msg = self._tcmsg(device_index, action.parent, info=info)
            self.nl.request(msg, rtnl.RTM_DELTFILTER, tolerate=GONE)
        elif isinstance(action, plan.AddRedirect):
            redirect = {"kind": "mirred", "direction": "egress", "action": "redirect",
                        "ifindex": self._index(action.ifb)}  # fmt: skip
            options = tc_modules().cls_u32.get_parameters(
                {"target": FLOW_ID, "keys": MATCH_ALL, "action": redirect}
            )
            info = (FILTER_PRIO << 16) | htons(ETH_P_ALL)
            msg = self._tcmsg(device_index, action.parent, info=info)
            msg["attrs"] = [["TCA_KIND", "u32"], ["TCA_OPTIONS", options]]
            self.nl.request(msg, rtnl.RTM_NEWTFILTER, CREATE)


def netlink_answers() -> None:
    """STATUS: rtnetlink answers a GET of `lo` (ifindex 1 in every netns), asked in plain
    bytes so that a status poll does not load pyroute2's message classes (the bulk of a
    poll's cost). Raises OSError when it does not."""
    import struct

    with rtnl.NetlinkSocket(rtnl.NETLINK_ROUTE) as nl:
        ifinfomsg = struct.pack("=BxHiII", 0, 0, 1, 0, 0)  # family, type, index 1, flags, change
        kinds = nl.call(rtnl.RTM_GETLINK, 0, ifinfomsg)
    if kinds != [rtnl.RTM_NEWLINK]:
        raise OSError(errno.EPROTO, f"unexpected rtnetlink answer (types {kinds})")

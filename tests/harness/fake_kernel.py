"""A kernel in memory, for running bandwidth's and tuning's verbs without root.

The plugins reach the kernel through the port their verbs are handed: `bandwidth.tc.Kernel`
(opens the rtnetlink socket every tc and link request goes through, and asks whether a
device is there before any rtnetlink) and `tuning.apply.Kernel` (the container namespace:
entering it, its rtnetlink socket, its sysctl files and its IPv6 address list).
`FakeKernel.run` hands them this module's implementations, whose sockets and files this
kernel answers. The plugins'
own code still builds and encodes every message with pyroute2; the fake decodes what was
sent, as the kernel would, changes its model of namespaces, links, qdiscs, filters and
sysctls, and answers with messages encoded the same way. So a unit test can run ADD, DEL,
CHECK and GC and compare exact text: `dump()` of the model and `sent()`, the changes that
were requested (reads are not listed). The root netns tests prove that the real kernel
agrees with what is assumed here.

Faults: `on(words, errno_or_callable)` lets the next request whose description contains
`words` fail with that errno, or runs the callable first (e.g. a device vanishing).
"""

from __future__ import annotations

import errno
import io
import json
import os
from _socket import ntohs
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from bandwidth import tc
from bandwidth.model import INGRESS_HANDLE, TC_H_INGRESS, TC_H_ROOT
from common import rtnl
from common.errors import INVALID_NETNS, CniError
from common.rtnl import IFF_UP, NetlinkError, pyroute2
from tuning import apply

# A link's flags in dump() and sent(): up, and each flag tuning sets (tuning.apply.FLAGS)
# by its option's name.
FLAG_WORDS = ((IFF_UP, "up"), *((getattr(rtnl, bit), word) for word, bit in apply.FLAGS.items()))
# A fake link's attributes as rtnetlink carries them: its word in dump(), and what a new
# link has (None: the MAC address 02:00:00:00:00:<ifindex>). _newlink sets each from a
# request, _link_msg reports each, line() shows each that differs from what a new link
# has (the MTU always, the alias after the flags). Every attribute tuning sets
# (tuning.apply.ATTRIBUTES) is one of them: a new tuning link option is one line here.
LINK_ATTRIBUTES: dict[str, tuple[str, Any]] = {
    "IFLA_MTU": ("mtu", 1500),
    "IFLA_TXQLEN": ("txqlen", 1000),
    "IFLA_ADDRESS": ("mac", None),
    "IFLA_IFALIAS": ("alias", ""),  # bandwidth's ifb names its owner there
}
OWN_PLACE = ("IFLA_MTU", "IFLA_IFALIAS")
RTM_NAMES = {v: k for k, v in vars(rtnl).items() if k.startswith("RTM_")}
PROC_SYS = "/proc/sys/"


class FakeLink:
    def __init__(self, ns: FakeNetns, index: int, name: str, kind: str, **attrs: Any) -> None:
        self.ns, self.index, self.name, self.kind = ns, index, name, kind
        self.attrs: dict[str, Any] = {
            nla: attrs.get(word, self.default(nla)) for nla, (word, _) in LINK_ATTRIBUTES.items()
        }
        self.flags: int = attrs.get("flags", IFF_UP)
        self.min_mtu: int = attrs.get("min_mtu", 68)
        self.max_mtu: int = attrs.get("max_mtu", 65535)
        self.peer: FakeLink | None = None

    def default(self, nla: str) -> Any:
        """What a new link has."""
        default = LINK_ATTRIBUTES[nla][1]
        return f"02:00:00:00:00:{self.index:02x}" if default is None else default

    @property
    def mtu(self) -> int:
        return int(self.attrs["IFLA_MTU"])

    @mtu.setter
    def mtu(self, value: int) -> None:
        self.attrs["IFLA_MTU"] = value

    def line(self) -> str:
        words = [str(self.index), self.name, self.kind or "-", f"mtu {self.mtu}"]
        words += [f"{word} {self.attrs[nla]}" for nla, (word, _) in LINK_ATTRIBUTES.items()
                  if nla not in OWN_PLACE and self.attrs[nla] != self.default(nla)]  # fmt: skip
        words += [word for bit, word in FLAG_WORDS if self.flags & bit]
        if self.attrs["IFLA_IFALIAS"]:
            words.append(f"alias {self.attrs['IFLA_IFALIAS']}")
        if self.peer is not None:
            words.append(f"peer {self.peer.ns.name}:{self.peer.index}")
        return " ".join(words)


class FakeNetns:
    def __init__(self, name: str, path: str) -> None:
        self.name, self.path = name, path
        self.links: dict[int, FakeLink] = {}
        self.qdiscs: dict[tuple[int, int], Any] = {}  # (ifindex, parent) -> decoded tcmsg
        self.filters: list[Any] = []  # decoded tcmsgs, in the order they were added
        self.sysctls: dict[str, str] = {}  # path below /proc/sys -> value
        self.if_inet6 = ""  # /proc/net/if_inet6

    def by_name(self, name: str) -> FakeLink | None:
        return next((link for link in self.links.values() if link.name == name), None)


class FakeKernel:
    def __init__(self, netns_dir: Path) -> None:
        self.netns_dir = netns_dir
        self.host = FakeNetns("host", "")
        self.namespaces = {"": self.host}
        self.next_index = 2
        self.requests: list[str] = []  # every change, as described by `_describe`
        self.replies_read = 0  # replies the plugin took from its sockets (reads included)
        self.reopened = 0  # sockets replaced after a dump left unfinished (RtnlSocket.dump)
        self.faults: list[tuple[str, int | Callable[[], None]]] = []
        self.add_link(self.host, "lo", "", index=1, mtu=65536, mac="00:00:00:00:00:00")

    # -- building the world a test starts from

    def add_netns(self, name: str) -> str:
        """A container namespace. Its path is a symlink to this process's UTS namespace
        file: the CNI_NETNS check (a namespace file, not the plugin's own network
        namespace) passes without root, and removing the link makes the path vanish."""
        path = self.netns_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to("/proc/self/ns/uts")
        ns = FakeNetns(name, str(path))
        self.namespaces[str(path)] = ns
        self.add_link(ns, "lo", "", index=1, mtu=65536, mac="00:00:00:00:00:00")
        return str(path)

    def remove_netns(self, path: str) -> None:
        ns = self.namespaces.pop(path)
        for link in list(ns.links.values()):
            self._delete_link(link)
        os.unlink(path)

    def ns(self, path: str) -> FakeNetns:
        return self.namespaces[path]

    def add_link(self, ns: FakeNetns, name: str, kind: str, **attrs: Any) -> FakeLink:
        index = attrs.pop("index", 0) or self._new_index()
        link = FakeLink(ns, index, name, kind, **attrs)
        ns.links[index] = link
        return link

    def run(self, plugin: str, command: str, conf: dict[str, Any], *, netns: str,
            container_id: str = "ctr1", ifname: str = "eth0",
            kernel: Any = None) -> tuple[int, Any]:  # fmt: skip
        """Run one verb through common.skel in this process, as the plugin's executable
        would: (exit code, the JSON it printed or None). `kernel`: the port to hand the
        verbs instead of this kernel's (portmap's netfilter, tests/harness/fake_portmap)."""
        from common.skel import Plugin, run

        environ = {
            **os.environ,
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": container_id,
            "CNI_IFNAME": ifname,
            "CNI_NETNS": netns,
            "CNI_PATH": "/nonexistent",
        }
        out = io.BytesIO()
        table = Plugin(plugin)
        stdin = io.BytesIO(json.dumps(conf).encode())
        code = run(table, environ=environ, stdin=stdin, stdout=out, stderr=io.StringIO(),
                   kernel=kernel or self.port(plugin))  # fmt: skip
        text = out.getvalue().decode()
        return code, json.loads(text) if text.strip() else None

    def add_veth(self, host_name: str, netns: str, name: str, **attrs: Any) -> FakeLink:
        host = self.add_link(self.host, host_name, "veth", **attrs)
        ctr = self.add_link(self.ns(netns), name, "veth", **attrs)
        host.peer, ctr.peer = ctr, host
        return ctr

    def delete_link(self, netns: str, name: str) -> None:
        link = self.ns(netns).by_name(name)
        assert link is not None, name
        self._delete_link(link)

    def on(self, words: str, fault: int | Callable[[], None]) -> None:
        """The next request whose description contains `words` fails with errno `fault`,
        or has `fault()` run just before it."""
        self.faults.append((words, fault))

    def _new_index(self) -> int:
        self.next_index += 1
        return self.next_index

    # -- what the tests compare

    def dump(self) -> str:
        lines = []
        for ns in self.namespaces.values():
            lines.append(ns.name)
            for link in sorted(ns.links.values(), key=lambda k: k.index):
                if link.name == "lo":
                    continue
                lines.append("  " + link.line())
                for (index, _), q in sorted(ns.qdiscs.items()):
                    if index == link.index:
                        lines.append("    qdisc " + _tc_words(ns, q))
                lines += ["    filter " + _tc_words(ns, f) for f in ns.filters
                          if f["index"] == link.index]  # fmt: skip
            lines += [f"  sysctl {key} = {value}" for key, value in sorted(ns.sysctls.items())]
        return "\n".join(lines) + "\n"

    def sent(self) -> str:
        """The changes requested since the last call, one a line."""
        out, self.requests = self.requests, []
        return "".join(line + "\n" for line in out)

    # -- the kernel ports the verbs are handed

    @classmethod
    def for_test(cls, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
        """A fake kernel for one test, with its state and log under tmp_path."""
        monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
        monkeypatch.setenv("CNI_META_LOG_FILE", str(tmp_path / "plugins.log"))
        return cls(tmp_path / "netns")

    def port(self, plugin: str) -> Any:
        """`plugin`'s kernel port answered by this kernel (None: the plugin's own)."""
        return {"bandwidth": FakeBandwidthKernel, "tuning": FakeTuningKernel}.get(
            plugin, lambda kernel: None
        )(self)

    def open_socket(self, netns: str = "") -> FakeSocket:
        return FakeSocket(self, self._entered(netns) if netns else self.host)

    def has_device(self, name: str, netns: str = "") -> bool:
        ns = self.namespaces.get(netns)
        return ns is not None and ns.by_name(name) is not None

    def _entered(self, path: str) -> FakeNetns:
        if path not in self.namespaces:  # what common.netns.entered says
            raise CniError(INVALID_NETNS, f"cannot open network namespace {path}", "ENOENT")
        return self.namespaces[path]

    def _fault(self, description: str) -> None:
        for at, (words, fault) in enumerate(self.faults):
            if words in description:
                del self.faults[at]
                if isinstance(fault, int):
                    raise NetlinkError(fault, f"{os.strerror(fault)} (injected)")
                fault()
                return

    def _sysctl(self, ns: FakeNetns, file: str, value: str | None) -> str:
        assert file.startswith(PROC_SYS), file
        key = file[len(PROC_SYS) :]
        description = f"{ns.name}: sysctl {key}" + (f" = {value}" if value is not None else "")
        try:
            self._fault(description)
        except NetlinkError as e:
            # a NetlinkError always has its errno; OSError types it int | None
            self.requests.append(f"{description} -> {errno.errorcode[cast(int, e.errno)]}")
            raise OSError(e.errno, e.strerror) from None
        if key not in ns.sysctls:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), file)
        if value is None:
            return ns.sysctls[key]
        self.requests.append(description)
        ns.sysctls[key] = value
        return value

    # -- rtnetlink

    def request(self, ns: FakeNetns, msg: Any, msg_type: int, flags: int) -> Iterator[Any]:
        """The replies, made as they are read (a dump the plugin stops reading is not
        made to its end), after the request's fault and description."""
        kind = RTM_NAMES[msg_type]
        description = f"{ns.name}: {kind} {_describe(ns, msg, flags)}"
        try:
            self._fault(description)
        except NetlinkError as e:
            # a NetlinkError always has its errno; OSError types it int | None
            self.requests.append(f"{description} -> {errno.errorcode[cast(int, e.errno)]}")
            raise
        if not kind.startswith("RTM_GET"):
            self.requests.append(description)
        handler = getattr(self, "_" + kind[4:].lower())
        replies: Iterator[Any] = handler(ns, msg, flags)
        return replies

    def _find(self, ns: FakeNetns, msg: Any) -> FakeLink:
        name = msg.get_attr("IFLA_IFNAME")
        link = ns.links.get(msg["index"]) if msg["index"] else ns.by_name(name or "")
        if link is None:
            raise _error(errno.ENODEV)
        return link

    def _getlink(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        if flags & rtnl.NLM_F_DUMP == rtnl.NLM_F_DUMP:
            yield from (_link_msg(link) for link in ns.links.values())
        else:
            yield _link_msg(self._find(ns, msg))

    def _newlink(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        if flags & rtnl.NLM_F_CREATE:
            name = msg.get_attr("IFLA_IFNAME")
            if ns.by_name(name) is not None:
                raise _error(errno.EEXIST)
            info = msg.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info is not None else ""
            # a new link is down, and the kernel ignores IFLA_IFALIAS on creation
            self.add_link(ns, name, kind, mtu=msg.get_attr("IFLA_MTU") or 1500, flags=0)
            return
        link = self._find(ns, msg)
        mtu = msg.get_attr("IFLA_MTU")
        if mtu is not None and not link.min_mtu <= mtu <= link.max_mtu:
            raise _error(errno.EINVAL)
        for nla in LINK_ATTRIBUTES:
            value = msg.get_attr(nla)
            link.attrs[nla] = value if value is not None else link.attrs[nla]
        link.flags = (link.flags & ~msg["change"]) | (msg["flags"] & msg["change"])
        yield from ()

    def _dellink(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        self._delete_link(self._find(ns, msg))
        yield from ()

    def _delete_link(self, link: FakeLink) -> None:
        for gone in (link, link.peer) if link.peer is not None else (link,):
            ns = gone.ns
            del ns.links[gone.index]
            ns.qdiscs = {k: q for k, q in ns.qdiscs.items() if k[0] != gone.index}
            ns.filters = [f for f in ns.filters if f["index"] != gone.index]
            ns.sysctls = {k: v for k, v in ns.sysctls.items() if f"/{gone.name}/" not in k}

    def _device(self, ns: FakeNetns, msg: Any) -> FakeLink:
        link = ns.links.get(msg["index"])
        if link is None:
            raise _error(errno.ENODEV)
        return link

    def _getqdisc(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        link = self._device(ns, msg)
        found = ns.qdiscs.get((link.index, msg["parent"]))
        if found is not None:
            yield _copy(found)
        elif msg["parent"] == TC_H_ROOT:  # every device has a root qdisc of handle 0
            default = type(msg)()
            default["index"], default["parent"] = link.index, TC_H_ROOT
            default["attrs"] = [["TCA_KIND", "noqueue"]]
            yield _encoded(default)
        else:
            raise _error(errno.ENOENT)

    def _newqdisc(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        link = self._device(ns, msg)
        key = (link.index, msg["parent"])
        if key in ns.qdiscs and flags & rtnl.NLM_F_EXCL:
            raise _error(errno.EEXIST)
        ns.qdiscs[key] = msg
        yield from ()

    def _delqdisc(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        link = self._device(ns, msg)
        if ns.qdiscs.pop((link.index, msg["parent"]), None) is None:
            raise _error(errno.ENOENT if msg["parent"] == TC_H_ROOT else errno.EINVAL)
        if msg["parent"] == TC_H_INGRESS:  # its filters go with it
            ns.filters = [f for f in ns.filters if f["index"] != link.index]
        yield from ()

    def _gettfilter(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        link = self._device(ns, msg)
        for f in ns.filters:
            if f["index"] == link.index and f["parent"] == msg["parent"]:
                yield _copy(f)

    def _newtfilter(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        link = self._device(ns, msg)
        if msg["parent"] == INGRESS_HANDLE and (link.index, TC_H_INGRESS) not in ns.qdiscs:
            raise _error(errno.EINVAL)
        ns.filters.append(msg)
        yield from ()

    def _deltfilter(self, ns: FakeNetns, msg: Any, flags: int) -> Iterator[Any]:
        link = self._device(ns, msg)
        same = [f for f in ns.filters if (f["index"], f["parent"], f["info"]) ==
                (link.index, msg["parent"], msg["info"])]  # fmt: skip
        if not same:
            raise _error(errno.ENOENT)
        ns.filters = [f for f in ns.filters if f not in same]
        yield from ()


class FakeBandwidthKernel:
    """bandwidth's port (bandwidth.ports.Kernel): its sockets are answered by a FakeKernel."""

    def __init__(self, kernel: FakeKernel) -> None:
        self.kernel = kernel

    def rtnl(self, netns: str = "") -> tc.Rtnl:
        return tc.Rtnl(self.kernel.open_socket(netns))

    def has_device(self, name: str, netns: str = "") -> bool:
        return self.kernel.has_device(name, netns)


class FakeTuningKernel:
    """tuning's port (tuning.ports.Kernel): a container netns whose socket and files are a
    FakeKernel's."""

    def __init__(self, kernel: FakeKernel) -> None:
        self.kernel = kernel

    def netns(self, path: str) -> FakeContainerNetns:
        return FakeContainerNetns(self.kernel, path)


class FakeContainerNetns:
    """tuning.ports.ContainerNetns in one of a FakeKernel's namespaces."""

    def __init__(self, kernel: FakeKernel, path: str) -> None:
        self.kernel, self.path = kernel, path

    def __enter__(self) -> FakeContainerNetns:
        self.fake = self.kernel._entered(self.path)
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def rtnl(self) -> FakeSocket:
        return FakeSocket(self.kernel, self.fake)

    def read_sysctl(self, file: str) -> str:
        return self.kernel._sysctl(self.fake, file, None)

    def write_sysctl(self, file: str, value: str) -> None:
        self.kernel._sysctl(self.fake, file, value)

    def if_inet6(self) -> str:
        return self.fake.if_inet6


class FakeSocket(rtnl.RtnlSocket):
    """common.rtnl.RtnlSocket, answered by a FakeKernel in one namespace."""

    def __init__(self, kernel: FakeKernel, ns: FakeNetns) -> None:
        self.kernel, self.ns, self.modules = kernel, ns, pyroute2()
        self.netns = ns.path

    def close(self) -> None:
        pass

    def reopen(self) -> None:
        self.kernel.reopened += 1

    def replies(self, msg: Any, msg_type: int, flags: int) -> Generator[Any]:
        dump = flags & rtnl.NLM_F_DUMP == rtnl.NLM_F_DUMP
        flags |= rtnl.NLM_F_REQUEST | (0 if dump else rtnl.NLM_F_ACK)
        msg["header"]["type"], msg["header"]["flags"] = msg_type, flags
        for reply in self.kernel.request(self.ns, _encoded(msg), msg_type, flags):
            self.kernel.replies_read += 1
            yield reply


# ---------------------------------------------------------------------------- messages


def _error(code: int) -> NetlinkError:
    return NetlinkError(code, os.strerror(code))


def _encoded(msg: Any) -> Any:
    """`msg` as the other side of the socket sees it: encoded, then decoded afresh."""
    msg.encode()
    return _copy(msg)


def _copy(msg: Any) -> Any:
    copy = type(msg)(msg.data)
    copy.decode()
    return copy


def _link_msg(link: FakeLink) -> Any:
    msg = pyroute2().ifinfmsg()
    msg["index"], msg["flags"] = link.index, link.flags
    msg["attrs"] = [
        ["IFLA_IFNAME", link.name],
        *([nla, value] for nla, value in link.attrs.items()),
        ["IFLA_MIN_MTU", link.min_mtu],
        ["IFLA_MAX_MTU", link.max_mtu],
        ["IFLA_LINKINFO", {"attrs": [["IFLA_INFO_KIND", link.kind]]}],
    ]
    if link.peer is not None:
        msg["attrs"].append(["IFLA_LINK", link.peer.index])
    return _encoded(msg)


def _handle(value: int) -> str:
    return {TC_H_ROOT: "root", TC_H_INGRESS: "ingress"}.get(value, f"{value >> 16:x}:")


def _flag_words(flags: int) -> list[str]:
    names = (("CREATE", rtnl.NLM_F_CREATE), ("EXCL", rtnl.NLM_F_EXCL),
             ("REPLACE", rtnl.NLM_F_REPLACE))  # fmt: skip
    return [name.lower() for name, bit in names if flags & bit]


def _describe(ns: FakeNetns, msg: Any, flags: int) -> str:
    """A request in words: the message type's own fields, then its attributes."""
    words = _flag_words(flags)
    if "info" in msg:  # tcmsg
        words.append(_tc_words(ns, msg))
        return " ".join(words)
    if msg["index"]:
        link = ns.links.get(msg["index"])
        words.append(f"dev {link.name if link else '#' + str(msg['index'])}")
    if msg["change"]:
        set_words = [w if msg["flags"] & bit else "no" + w for bit, w in FLAG_WORDS
                     if msg["change"] & bit]  # fmt: skip
        words += set_words
    for name, value in msg["attrs"]:
        if name == "IFLA_LINKINFO":
            words.append(f"kind {value.get_attr('IFLA_INFO_KIND')}")
        elif name != "IFLA_EXT_MASK":
            words.append(f"{name[5:].lower()} {value}")
    return " ".join(words)


def _tc_words(ns: FakeNetns, msg: Any) -> str:
    """A qdisc or filter as `tc` would list it, roughly."""
    link = ns.links.get(msg["index"])
    kind = str(msg.get_attr("TCA_KIND") or "")
    words = [kind] if kind else []
    words.append(f"dev {link.name if link else '#' + str(msg['index'])}")
    words.append(f"parent {_handle(msg['parent'])}")
    if msg["handle"]:
        words.append(f"handle {_handle(msg['handle'])}")
    if msg["info"]:
        protocol = ntohs(msg["info"] & 0xFFFF)
        words.append(f"prio {msg['info'] >> 16} protocol {'all' if protocol == 3 else protocol}")
    options = msg.get_attr("TCA_OPTIONS")
    parms = options.get_attr("TCA_TBF_PARMS") if options is not None and kind == "tbf" \
        else None  # fmt: skip
    if parms is not None:
        rate = max(parms["rate"], options.get_attr("TCA_TBF_RATE64") or 0)
        words.append(f"rate {rate} buffer {parms['buffer']} limit {parms['limit']}")
    if options is not None and kind == "u32":
        keys = options.get_attr("TCA_U32_SEL")["keys"]
        words.append("match " + ("all" if all(k["key_mask"] == 0 for k in keys) else "some"))
        for _, act in options.get_attr("TCA_U32_ACT")["attrs"]:
            parms = act.get_attr("TCA_ACT_OPTIONS").get_attr("TCA_MIRRED_PARMS")
            target = ns.links.get(parms["ifindex"])
            words.append(f"{act.get_attr('TCA_ACT_KIND')} to "
                         f"{target.name if target else '#' + str(parms['ifindex'])}")  # fmt: skip
    return " ".join(words)

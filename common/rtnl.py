"""The netlink transport (`NetlinkSocket`, any protocol, builtin modules only), and
pyroute2's rtnetlink message classes on it (`RtnlSocket`), without pyroute2's IPRoute:
every plugin call is a fresh process, and IPRoute's imports and asyncio round trips cost
more than the call itself (docs/bandwidth.md#measured). portmap's conntrack and nftables
messages and bandwidth's STATUS probe go on the same socket as plain bytes.
"""

from __future__ import annotations

import _socket  # not `socket`: that imports enum and selectors
import errno
import os
import struct
import sys
from contextlib import nullcontext
from functools import cache
from types import SimpleNamespace

from common.errors import CniError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Generator, Iterator
    from typing import Any

NETLINK_ROUTE = 0
NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_EXT_ACK = 11  # errors carry the kernel's explanation (NLMSGERR_ATTR_MSG)
TIMEOUT = 10.0  # seconds; the kernel answers in microseconds, this only prevents a hang
RECV_BYTES = 1 << 17  # a dump datagram is at most 32 KiB

# netlink flags and message types (linux/netlink.h, linux/rtnetlink.h)
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_ECHO = 0x8
NLM_F_DUMP = 0x300
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_CAPPED = 0x100  # in an error: the request's body is not echoed
NLM_F_ACK_TLVS = 0x200  # in an error: extended ACK attributes follow
NLMSGERR_ATTR_MSG = 1
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWQDISC, RTM_DELQDISC, RTM_GETQDISC = 36, 37, 38
RTM_NEWTFILTER, RTM_DELTFILTER, RTM_GETTFILTER = 44, 45, 46
IFF_UP, IFF_PROMISC, IFF_ALLMULTI = 0x1, 0x100, 0x200  # a link's flags (linux/if.h)
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
NLMSG_HDRLEN = _HEADER.size
_NLA = struct.Struct("=HH")  # nlattr: length, type


def register_package_without_init(name: str) -> None:
    """Put package `name` in sys.modules without running its __init__ (pyroute2's imports
    everything, and loading a submodule runs the package's __init__ first). The __init__
    still runs, lazily, the moment anyone asks the package for a top-level name (e.g.
    `from pyroute2 import IPRoute`), so other code is unaffected."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return  # let the ordinary import below fail or succeed on its own
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    where = list(spec.submodule_search_locations)
    pending = [True]

    def is_submodule(attr: str) -> bool:
        return any(
            os.path.exists(os.path.join(d, attr + ".py")) or os.path.isdir(os.path.join(d, attr))
            for d in where
        )

    def run_init_on_demand(attr: str) -> Any:
        # PEP 562: called only for names the module does not have (yet). `from pyroute2
        # import config` asks for submodules this way first: those go to the importer.
        if pending and not attr.startswith("__") and not is_submodule(attr):
            pending.clear()
            loader.exec_module(package)
            if attr in package.__dict__:
                return package.__dict__[attr]
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    package.__dict__["__getattr__"] = run_init_on_demand
    sys.modules[name] = package


@cache
def pyroute2() -> SimpleNamespace:
    """The pyroute2 pieces every rtnetlink user here needs: the link messages
    (`ifinfmsg`). A plugin that sends tc messages loads those itself (bandwidth.tc)."""
    if "pyroute2" not in sys.modules:
        register_package_without_init("pyroute2")
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    return SimpleNamespace(ifinfmsg=ifinfmsg)


def nla(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    return _NLA.pack(_NLA.size + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def nlas(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type without flags, payload) of each netlink attribute in `data`."""
    pos = 0
    while pos + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, pos)
        if length < _NLA.size:
            return
        yield kind & NLA_TYPE_MASK, data[pos + _NLA.size : pos + length]
        pos += (length + 3) & ~3


class NetlinkError(OSError):
    """The kernel refused a request; `errno` is its error code."""


class NetlinkSocket:
    """A blocking netlink socket of one protocol (NETLINK_ROUTE, NETLINK_NETFILTER, ...),
    bound to the netns current when it is made."""

    def __init__(self, protocol: int) -> None:
        self.sock = _socket.socket(
            _socket.AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, protocol
        )
        self.sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        self.sock.settimeout(TIMEOUT)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> NetlinkSocket:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request(self, msg_type: int, flags: int, body: bytes) -> Iterator[bytes]:
        """Send one message (nlmsghdr + `body`); yield each reply whole, header included,
        until DONE or the ACK (asked for by every request but a dump, so that an answer
        ends even when the kernel has nothing else to say: a GET of an invisible qdisc).
        Raises NetlinkError with the kernel's explanation."""
        self.seq += 1
        seq = self.seq
        if flags & NLM_F_DUMP != NLM_F_DUMP:
            flags |= NLM_F_ACK
        header = _HEADER.pack(NLMSG_HDRLEN + len(body), msg_type, flags | NLM_F_REQUEST, seq, 0)
        self.sock.send(header + body)
        while True:
            data = self.sock.recv(RECV_BYTES)
            offset = 0
            while offset + NLMSG_HDRLEN <= len(data):
                length, kind, _, reply_seq, _ = _HEADER.unpack_from(data, offset)
                chunk = data[offset : offset + length]
                offset += max((length + 3) & ~3, NLMSG_HDRLEN)
                if reply_seq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    _raise_for(chunk)
                    return  # error 0 is the ACK
                yield chunk

    def call(self, msg_type: int, flags: int, body: bytes) -> list[int]:
        """request() read to its end: the message type of each reply (none for a bare ACK)."""
        return [_HEADER.unpack_from(reply)[1] for reply in self.request(msg_type, flags, body)]


def nla_string(kind: int, text: str) -> bytes:
    """A NUL-terminated string attribute (NLA_NUL_STRING / NLA_STRING)."""
    return nla(kind, text.encode() + b"\0")


def _raise_for(chunk: bytes) -> None:
    """Raise the error of an NLMSG_ERROR reply (error 0 is the ACK), with the kernel's
    explanation when it gave one: its attributes follow the error code and the request's
    header (and body, unless capped)."""
    (code,) = struct.unpack_from("=i", chunk, NLMSG_HDRLEN)
    if code == 0:
        return
    detail = os.strerror(-code)
    flags = _HEADER.unpack_from(chunk)[2]
    if flags & NLM_F_ACK_TLVS:
        start = NLMSG_HDRLEN + 4
        echoed = NLMSG_HDRLEN if flags & NLM_F_CAPPED else _HEADER.unpack_from(chunk, start)[0]
        text = next(
            (v for k, v in nlas(chunk[start + ((echoed + 3) & ~3) :]) if k == NLMSGERR_ATTR_MSG),
            b"",
        ).split(b"\0", 1)[0]
        if text:
            detail += ": " + text.decode("utf-8", "replace")
    raise NetlinkError(-code, detail)


class RtnlSocket:
    """pyroute2's rtnetlink messages on a NetlinkSocket in the netns at path `netns`
    ("": the current one). A socket keeps the netns it was opened in: this enters the
    netns only to open it (CniError INVALID_NETNS when it cannot, as common.netns says)."""

    def __init__(self, netns: str = "") -> None:
        self.netns = netns
        self.nl = self._open()  # a bad netns fails before pyroute2 is loaded
        self.modules = pyroute2()

    def _open(self) -> NetlinkSocket:
        from common.netns import entered  # looked up at each call: crash points wrap it

        with entered(self.netns) if self.netns else nullcontext():
            return NetlinkSocket(NETLINK_ROUTE)

    def close(self) -> None:
        self.nl.close()

    def reopen(self) -> None:
        """A fresh socket in the same netns in place of this one (see `dump`). When the
        netns cannot be entered any more, the old one stays: only another dump on it is
        refused (the dump's leftovers carry another sequence number and are skipped)."""
        try:
            fresh = self._open()
        except CniError:
            return
        self.nl.close()
        self.nl = fresh

    def request(
        self, msg: Any, msg_type: int, flags: int = 0, *, tolerate: tuple[int, ...] = ()
    ) -> list[Any]:
        """Send `msg` and return the decoded replies. Raises NetlinkError, but for an errno
        in `tolerate` (what the request names is not there): then there are no replies."""
        try:
            return self.exchange(msg, msg_type, flags)
        except NetlinkError as e:
            if e.errno in tolerate:
                return []
            raise

    def dump(
        self, msg: Any, msg_type: int, limit: int, *, tolerate: tuple[int, ...] = ()
    ) -> tuple[list[Any], bool]:
        """The first `limit` replies of a dump of `msg`, and whether the kernel had more.
        The rest is never read: what a dump lists may be someone else's to grow (a
        container with NET_ADMIN adds filters in its own netns), and a call's work must
        not grow with it. The kernel would go on with the unfinished dump at every later
        read (and refuse another dump), so the socket is replaced by a fresh one."""
        found: list[Any] = []
        replies = self.replies(msg, msg_type, NLM_F_DUMP)
        try:
            for reply in replies:
                if len(found) == limit:
                    break
                found.append(reply)
            else:
                return found, False
        except NetlinkError as e:
            if e.errno in tolerate:
                return [], False
            raise
        finally:
            replies.close()
        self.reopen()
        return found, True

    def exchange(self, msg: Any, msg_type: int, flags: int) -> list[Any]:
        return list(self.replies(msg, msg_type, flags))

    def replies(self, msg: Any, msg_type: int, flags: int) -> Generator[Any]:
        """`msg` to the kernel, each reply decoded as it is read (where the fake answers)."""
        msg.encode()
        for chunk in self.nl.request(msg_type, flags, msg.data[NLMSG_HDRLEN:]):
            reply = type(msg)(chunk)
            reply.decode()
            yield reply

    def link(self, name: str = "", index: int = 0) -> Any:
        """The ifinfmsg of the device named `name`, or else of the one with ifindex
        `index`; None when there is none (ENODEV; EINVAL: a name the kernel cannot even
        look up, too long, names no device either)."""
        msg = self.modules.ifinfmsg()
        msg["index"] = index
        if name:
            msg["attrs"] = [["IFLA_IFNAME", name]]
        found = self.request(msg, RTM_GETLINK, tolerate=(errno.ENODEV, errno.EINVAL))
        return found[0] if found else None

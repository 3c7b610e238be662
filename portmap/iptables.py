"""The iptables backend: the reference's rules, through python-iptables (libiptc).

nat table, per family (iptables and ip6tables):

    PREROUTING, OUTPUT  -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
    CNI-HOSTPORT-DNAT   one jump per forward to the attachment's chain, commented with
                        its owner; jumps for a specific hostIP are inserted first, the
                        wildcard ones appended, so a specific address wins
    CNI-DN-<hash>       per host port: [-s <subnet>|127.0.0.0/8 -j CNI-HOSTPORT-SETMARK]
                        then -j DNAT --to-destination <container>:<port>
    CNI-HOSTPORT-SETMARK  -j MARK --set-xmark <bit>/<bit>   (or externalSetMarkChain)
    POSTROUTING         -j CNI-HOSTPORT-MASQ (first), which masquerades marked packets

libiptc reads the whole table, we change it in memory and commit it in one replace per
family: an ADD or DEL is atomic per table. The table is read once per call, and libiptc's
raw copy of it is freed as soon as it is parsed (`release_blob`), so a call holds two
copies of the table at most, not three. Like the iptables command we hold
/run/xtables.lock while doing so, plus our own lock for read-modify-write.

libiptc writes the *legacy* xtables. Where `iptables` is iptables-nft (Debian 12's
default) these rules exist and work but `iptables -t nat -S` does not show them: use
`iptables-legacy -t nat -S`. The plugin logs a warning saying so.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import sys
from contextlib import contextmanager
from functools import cache, partial

from common import jsontext as json
from common.digest import sha512_hex
from common.errors import (
    CHECK_FAILED,
    CONFLICT,
    KERNEL_FAILURE,
    STATUS_UNAVAILABLE,
    CniError,
    invalid_config,
)
from common.log import Log
from common.state import StateDir, flock_with_deadline
from common.values import Value
from portmap import state
from portmap.config import PROTOCOL_NAMES, Attachment
from portmap.plan import MASQ_ALL, MASQ_NONE, FamilyPlan, Forward, Plan, UdpTargets

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from common.gc import Stamps

NAME = "iptables"
TOP = "CNI-HOSTPORT-DNAT"
SETMARK = "CNI-HOSTPORT-SETMARK"
MASQ = "CNI-HOSTPORT-MASQ"
LOCK = "iptables.lock"
XTABLES_LOCK = os.environ.get("XTABLES_LOCKFILE", "/run/xtables.lock")
COMMENT_PREFIX = "portmap "

_iptc: Any = None


def import_iptc() -> Any:
    """python-iptables, imported the fast way (~15 ms instead of ~270 ms).

    By default it imports setuptools' distutils shim and runs ldconfig/gcc to find
    libraries; the stdlib distutils, known library directories and sonames avoid both.
    """
    global _iptc
    if _iptc is not None:
        return _iptc
    import ctypes.util
    import sysconfig
    import warnings

    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for d in (f"/usr/lib/{multiarch}/xtables", "/usr/lib64/xtables", "/usr/lib/xtables"):
        if os.path.isdir(d):
            os.environ.setdefault("XTABLES_LIBDIR", d)
            break
    os.environ.setdefault("SETUPTOOLS_USE_DISTUTILS", "stdlib")
    sonames = {"c": "libc.so.6", "xtables": "libxtables.so.12", "ip4tc": "libip4tc.so.2",
               "ip6tc": "libip6tc.so.2"}  # fmt: skip
    # python-iptables' own helper library sits beside the package, where it loads it from
    # once the system search fails: that search (ldconfig -p, gcc and ld for each of the
    # four names it tries, ~40 ms) can never find it.
    wrapper = "libxtwrapper" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")
    shipped = any(os.path.isfile(os.path.join(p, wrapper)) for p in sys.path if p)
    original = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        if name in sonames:
            try:
                ctypes.CDLL(sonames[name])
                return sonames[name]
            except OSError:
                pass
        if shipped and "xtwrapper" in name:
            return None
        return original(name)

    ctypes.util.find_library = find_library
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import iptc
    except Exception as e:  # python-iptables raises plain Exceptions when libs are missing
        raise CniError(STATUS_UNAVAILABLE, "python-iptables cannot be loaded", str(e)) from None
    finally:
        ctypes.util.find_library = original
    # python-iptables tells a jump to a chain from a target extension by opening every
    # table of the family (Rule.tables): the kernel then creates the legacy filter,
    # mangle, raw and security tables in the namespace, and python-iptables commits them
    # back. Every chain we jump to lives in nat, so let it look there only.
    for table in (iptc.Table, iptc.Table6):
        for name in table.ALL:
            if name != "nat":
                table.existing_table_names[name] = False
    _iptc = iptc
    return iptc


def in_family_process(family: int, op: Callable[[], Any], *, isolate: bool = False) -> Any:
    """Run `op` for `family`: IPv4 in this process (in a child too with `isolate`), IPv6
    in a forked child.

    libxtables registers an extension only for the family current when its shared object
    is loaded, and DNAT/MASQUERADE share one object (libxt_NAT.so): once loaded for IPv4
    in a process, they can never be found for IPv6 there (and a second init aborts the
    process). So IPv6 work always runs first, in a child forked before this process has
    loaded any extension; callers order their families (6, 4) for that reason, and isolate
    IPv4 work that may still be followed by IPv6 work (undoing an ADD).
    """
    if family == 4 and not isolate:
        try:
            return op()
        except CniError:
            raise
        except Exception as e:  # python-iptables raises plain Exceptions (as in the child)
            raise CniError(KERNEL_FAILURE, f"IPv{family} iptables failed", repr(e)) from None
    import_iptc()  # loads libxtables and libiptc only, no extension: the child stays clean
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, report as JSON, never return into the caller
        os.close(read_fd)
        try:
            out: dict[str, Any] = {"ok": op()}
        except CniError as e:
            out = {"error": [e.code, e.msg, e.details]}
        except BaseException as e:
            out = {"error": [KERNEL_FAILURE, f"IPv{family} iptables failed", repr(e)]}
        with os.fdopen(write_fd, "w") as f:
            f.write(json.dumps(out))
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        raw = f.read()
    os.waitpid(pid, 0)
    try:
        answer = json.loads(raw)
    except ValueError:
        raise CniError(KERNEL_FAILURE, f"the IPv{family} iptables worker died") from None
    if "error" in answer:
        code, msg, details = answer["error"]
        raise CniError(int(code), str(msg), str(details))
    return answer["ok"]


def nat_table_info(family: int, table: str = "nat") -> None:
    """Ask the kernel for the header of one of the family's legacy tables (STATUS)."""
    import ctypes
    import socket

    level, sock_family = (41, socket.AF_INET6) if family == 6 else (0, socket.AF_INET)
    get_info = 64  # IPT_SO_GET_INFO == IP6T_SO_GET_INFO; SOL_IP 0, SOL_IPV6 41
    info = ctypes.create_string_buffer(table.encode(), 84)  # struct ipt_getinfo: name[32] + 52
    size = ctypes.c_uint(84)
    libc = ctypes.CDLL(None, use_errno=True)
    with socket.socket(sock_family, socket.SOCK_RAW, socket.IPPROTO_RAW) as sock:
        if libc.getsockopt(sock.fileno(), level, get_info, info, ctypes.byref(size)) != 0:
            err = ctypes.get_errno()
            raise CniError(
                STATUS_UNAVAILABLE,
                f"the kernel has no usable IPv{family} iptables {table} table (legacy xtables)",
                os.strerror(err),
            )


def chain_name(att: Attachment) -> str:
    """CNI-DN- + 21 hex digits, like the reference (28 characters, iptables' limit)."""
    return "CNI-DN-" + sha512_hex(att.tag.encode())[:21]


def _family_of(table: Any) -> int:
    return 6 if table.__class__.__name__ == "Table6" else 4


@contextmanager
def xtables_lock() -> Iterator[None]:
    """The lock the iptables commands take, so we never interleave with them.

    With the same deadline as our own locks: iptables (or kube-proxy's iptables-restore)
    holding it for longer is error 11, not a hang of the runtime.
    """
    with flock_with_deadline(XTABLES_LOCK, holder="another iptables user (iptables-restore?)"):
        yield


# ---------------------------------------------------------------------------- rule building


class Rules:
    """Builds python-iptables rules for one family."""

    def __init__(self, iptc: Any, family: int) -> None:
        self.iptc = iptc
        self.family = family

    def rule(self) -> Any:
        return self.iptc.Rule6() if self.family == 6 else self.iptc.Rule()

    def ports_rule(self, fw: Forward, port: str) -> Any:
        r = self.rule()
        r.protocol = fw.protocol
        if fw.host_ip:
            r.dst = fw.host_ip
        m = r.create_match(fw.protocol)
        m.dport = port
        return r

    def jump(self, fw: Forward, chain: str, comment: str, conditions: tuple[str, ...]) -> Any:
        last = fw.host_port + fw.count - 1
        r = self.ports_rule(fw, f"{fw.host_port}:{last}" if fw.count > 1 else str(fw.host_port))
        apply_conditions(r, conditions)
        r.create_match("comment").comment = comment
        r.create_target(chain)
        return r

    def per_port(self, fp: FamilyPlan, fw: Forward, mark_chain: str) -> list[Any]:
        out = []
        any_src = "0.0.0.0/0" if self.family == 4 else "::/0"
        for hp, cp in fw.ports():
            if fp.masquerade != MASQ_NONE:
                sources = [any_src] if fp.masquerade == MASQ_ALL else [fp.subnet_cidr]
                if fp.localhost and fp.masquerade != MASQ_ALL:
                    sources.append("127.0.0.0/8")
                for src in sources:
                    r = self.ports_rule(fw, str(hp))
                    r.src = src
                    r.create_target(mark_chain)
                    out.append(r)
            r = self.ports_rule(fw, str(hp))
            target = r.create_target("DNAT")
            ip = fp.container_ip if self.family == 4 else f"[{fp.container_ip}]"
            target.to_destination = f"{ip}:{cp}"
            out.append(r)
        return out

    def setmark(self, bit: int) -> Any:
        r = self.rule()
        r.create_match("comment").comment = "CNI portfwd masquerade mark"
        r.create_target("MARK").set_xmark = f"{1 << bit:#x}/{1 << bit:#x}"
        return r

    def masq(self, bit: int) -> Any:
        r = self.rule()
        r.create_match("mark").mark = f"{1 << bit:#x}/{1 << bit:#x}"
        r.create_target("MASQUERADE")
        return r

    def entry(self, target: str) -> Any:
        r = self.rule()
        if target == TOP:
            r.create_match("addrtype").dst_type = "LOCAL"
        else:
            r.create_match("comment").comment = "CNI portfwd requiring masquerade"
        r.create_target(target)
        return r


def apply_conditions(rule: Any, tokens: tuple[str, ...]) -> None:
    """iptables argv conditions (`[!] -s/-d/-i/-o X`, `-p P`, `-m NAME [!] --opt V`)."""
    i = 0
    match = None
    while i < len(tokens):
        neg = tokens[i] == "!"
        if neg:
            i += 1
        if i + 1 >= len(tokens) and not (i < len(tokens) and tokens[i] == "-m"):
            raise CniError(7, f"incomplete iptables condition near {' '.join(tokens[i - 1 :])!r}")
        opt = tokens[i]
        value = tokens[i + 1] if i + 1 < len(tokens) else ""
        prefix = "!" if neg else ""
        try:
            if opt in ("-s", "--source", "--src"):
                rule.src = prefix + value
            elif opt in ("-d", "--destination", "--dst"):
                rule.dst = prefix + value
            elif opt in ("-i", "--in-interface"):
                rule.in_interface = prefix + value
            elif opt in ("-o", "--out-interface"):
                rule.out_interface = prefix + value
            elif opt == "-m":
                match = rule.create_match(value)
            elif opt.startswith("--") and match is not None:
                setattr(match, opt[2:].replace("-", "_"), prefix + value)
            else:
                raise ValueError(f"unsupported option {opt}")
        except Exception as e:
            raise CniError(
                7, f"cannot use iptables condition {' '.join(tokens)!r}", str(e)
            ) from None
        i += 2


def render(rule: Any) -> str:
    """A canonical text of a rule, to compare what is live with what is wanted."""
    parts = [str(rule.protocol), str(rule.src), str(rule.dst)]
    parts += [str(rule.in_interface or ""), str(rule.out_interface or "")]
    parts += [f"{m.name}{sorted(m.get_all_parameters().items())}" for m in rule.matches]
    target = rule.target
    parts.append(f"{target.name}{sorted(target.get_all_parameters().items())}")
    return " ".join(parts)


def dport_range(rule: Any) -> tuple[int, int] | None:
    for m in rule.matches:
        if m.name in ("tcp", "udp", "sctp"):
            value = m.get_all_parameters().get("dport", [""])[0]
            first, _, last = str(value).partition(":")
            if first.isdigit():
                return int(first), int(last or first)
    return None


def host_ip_of(rule: Any, family: int) -> str | None:
    dst = str(rule.dst).split("/")[0]
    if dst in ("0.0.0.0", "::"):  # noqa: S104
        return None
    import ipaddress

    return ipaddress.ip_address(dst).compressed


# ---------------------------------------------------------------------------- the jump chain

_PORT_MATCHES = (b"tcp", b"udp", b"sctp")
_MATCH_HEADER = 32  # xt_entry_match: u16 size, char name[29], u8 revision; then the data


class Jump(Value):
    """One rule of CNI-HOSTPORT-DNAT, decoded straight from libiptc's entry.

    That chain holds a rule per forward of every attachment of the node, and ADD (for
    conflicts), DEL, CHECK and GC read all of it. python-iptables' Rule objects cost ~7 KB
    and ~0.2 ms each (35 MB and over a second at 5000 attachments); these read the few
    fields we need from the entry's bytes.
    """

    __slots__ = ("comment", "dports", "host_ip", "number", "protocol", "target")

    number: int  # 0-based position in the chain (libiptc deletes by number)
    protocol: str
    host_ip: str | None  # the rule's destination address; None for the wildcard
    dports: tuple[int, int] | None
    comment: str
    target: str  # the chain it jumps to

    def __init__(
        self,
        number: int,
        protocol: str,
        host_ip: str | None,
        dports: tuple[int, int] | None,
        comment: str,
        target: str,
    ) -> None:
        self.number = number
        self.protocol = protocol
        self.host_ip = host_ip
        self.dports = dports
        self.comment = comment
        self.target = target

    @property
    def owner(self) -> str:
        """The owning attachment's tag, or "" for a rule that is not ours."""
        if not self.comment.startswith(COMMENT_PREFIX):
            return ""
        return self.comment[len(COMMENT_PREFIX) :].split(" ", 1)[0]


@cache
def _entry_layout(family: int) -> tuple[int, int, int, int, int]:
    """(sizeof entry, dst offset, address length, proto offset, target_offset offset),
    from python-iptables' own ctypes declarations of ipt_entry / ip6t_entry."""
    import ctypes

    import iptc.ip4tc as v4
    import iptc.ip6tc as v6

    if family == 6:
        ip, entry, base = v6.ip6t_ip6, v6.ip6t_entry, v6.ip6t_entry.ipv6.offset
        addr_len = 16
    else:
        ip, entry, base = v4.ipt_ip, v4.ipt_entry, v4.ipt_entry.ip.offset
        addr_len = 4
    return (ctypes.sizeof(entry), base + ip.dst.offset, addr_len, base + ip.proto.offset,
            entry.target_offset.offset)  # fmt: skip


def _decode_jump(number: int, raw: bytes, target: str, family: int) -> Jump:
    size, dst_at, addr_len, proto_at, target_offset_at = _entry_layout(family)
    (proto,) = struct.unpack_from("=H", raw, proto_at)
    (target_offset,) = struct.unpack_from("=H", raw, target_offset_at)
    dst = raw[dst_at : dst_at + addr_len]
    host_ip = ipaddress.ip_address(dst).compressed if any(dst) else None
    dports, comment = None, ""
    at = size
    while at + _MATCH_HEADER <= target_offset:
        (match_size,) = struct.unpack_from("=H", raw, at)
        name = raw[at + 2 : at + 31].split(b"\0", 1)[0]
        data = raw[at + _MATCH_HEADER : at + match_size]
        if name in _PORT_MATCHES and dports is None and len(data) >= 8:
            dports = struct.unpack_from("=HH", data, 4)  # spts[2], then dpts[2]
        elif name == b"comment":
            comment = data.split(b"\0", 1)[0].decode(errors="replace")
        if match_size < _MATCH_HEADER:
            break  # malformed: never loop forever on it
        at += match_size
    return Jump(number, PROTOCOL_NAMES.get(proto, str(proto)), host_ip, dports, comment, target)


def jumps(table: Any) -> Iterator[Jump]:
    """Every rule of CNI-HOSTPORT-DNAT as a `Jump`, one at a time (so only one is in
    memory at once); none without the chain. Change the chain only after the iteration
    has finished."""
    import ctypes

    if not table.is_chain(TOP):
        return
    family = _family_of(table)
    number = 0
    entry = table.first_rule(TOP)
    while entry:
        raw = ctypes.string_at(ctypes.addressof(entry), entry.next_offset)
        target = table.get_target(entry)
        name = target.decode(errors="replace") if isinstance(target, bytes) else ""
        yield _decode_jump(number, raw, name, family)
        number += 1
        entry = table.next_rule(entry)


def delete_jumps(table: Any, numbers: list[int]) -> None:
    """Delete the rules at these positions of CNI-HOSTPORT-DNAT (highest first, so none
    shifts)."""
    for number in sorted(set(numbers), reverse=True):
        if table._iptc.iptc_delete_num_entry(TOP.encode(), number, table._handle) != 1:
            raise CniError(
                KERNEL_FAILURE, f"cannot delete rule {number + 1} of {TOP}", table.strerror()
            )


# ---------------------------------------------------------------------------- libiptc's memory

# struct xtc_handle (libiptc.c; LP64, as iptc_free of libip4tc/libip6tc 1.8.9 reads it):
# the table's info at 64 (name[32], valid_hooks, hook_entry[5], underflow[5], num_entries,
# size), `entries` at 152. release_blob checks all of it before trusting it.
_HANDLE_INFO_NAME = 64
_HANDLE_INFO_SIZE = 64 + 80
_HANDLE_ENTRIES = 152
_GET_ENTRIES_SIZE = 32  # struct ipt_get_entries / ip6t_get_entries: name[32], size


@cache
def _libc() -> Any:
    import ctypes

    from common.netns import libc as c_library

    libc = c_library()
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free.restype = None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def release_blob(table: Any) -> bool:
    """Free libiptc's copy of the kernel's table once it has been parsed.

    iptc_init reads the whole table into one blob (`entries`), then copies every rule of
    it into its own cache; after that only iptc_free (and the debugging dump) look at the
    blob. iptc_commit builds a second blob of the same size, so freeing the first one
    before it lowers the peak by a whole table (7 MB at 5,000 attachments). The handle's
    layout is checked first (the table name in its info and in the blob, and the blob's
    size in both); where it does not match, nothing is done. Returns whether it freed.
    """
    import ctypes

    handle = ctypes.cast(table._handle, ctypes.c_void_p).value
    if not handle or ctypes.sizeof(ctypes.c_void_p) != 8:  # the offsets are LP64's
        return False
    name = table.name.encode() + b"\0"
    if ctypes.string_at(handle + _HANDLE_INFO_NAME, len(name)) != name:
        return False
    (size,) = struct.unpack("=I", ctypes.string_at(handle + _HANDLE_INFO_SIZE, 4))
    slot = ctypes.c_void_p.from_address(handle + _HANDLE_ENTRIES)
    blob = slot.value
    if not blob or blob % 8:
        return False
    header = ctypes.string_at(blob, _GET_ENTRIES_SIZE + 4)
    if header[: len(name)] != name or struct.unpack_from("=I", header, 32)[0] != size:
        return False
    slot.value = None  # iptc_free frees NULL: nothing
    libc = _libc()
    libc.free(blob)
    libc.malloc_trim(0)  # the blob may sit in the heap, not in its own mapping
    return True


# ---------------------------------------------------------------------------- the backend


class IptablesBackend:
    name = NAME

    def __init__(self, sd: StateDir, log: Log) -> None:
        self.sd = sd
        self.log = log

    def _table(self, family: int) -> Any:
        iptc = import_iptc()
        cls = iptc.Table6 if family == 6 else iptc.Table
        try:
            # python-iptables keeps one Table per name and class, reading the table when
            # it is made: only one made earlier in this process needs reading again (and
            # any table, should a later python-iptables keep no such cache).
            cached = cls.NAT in getattr(cls, "_cache", (cls.NAT,))
            table = cls(cls.NAT, autocommit=False)
            table.autocommit = False
            if cached:
                table.refresh()
        except Exception as e:
            raise CniError(
                KERNEL_FAILURE, f"cannot open the IPv{family} nat table (libiptc)", str(e)
            ) from None
        release_blob(table)
        return table

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # python-iptables' import (~50 ms) happens before the locks, not while every other
        # portmap call of the node waits for them.
        import_iptc()
        with self.sd.lock(LOCK), xtables_lock():
            yield

    @staticmethod
    def _commit(table: Any, what: str) -> None:
        try:
            table.commit()
        except Exception as e:
            raise CniError(KERNEL_FAILURE, f"iptables refused to {what}", str(e)) from None

    # -- helpers over one table ------------------------------------------------------------

    def _ensure_chain(self, table: Any, name: str) -> Any:
        if not table.is_chain(name):
            table.create_chain(name)
        return self._iptc().Chain(table, name)

    def _iptc(self) -> Any:
        return import_iptc()

    def _ensure_rule(self, chain: Any, rule: Any, first: bool = False) -> None:
        wanted = render(rule)
        if any(render(r) == wanted for r in chain.rules):
            return
        if first:
            chain.insert_rule(rule)
        else:
            chain.append_rule(rule)

    def _remove_attachment(self, table: Any, chain: str) -> list[tuple[str | None, int]]:
        """Delete the jumps to `chain` and the chain; return its UDP (host ip, port)s."""
        udp: list[tuple[str | None, int]] = []
        if not table.is_chain(chain):
            return udp
        family = _family_of(table)
        iptc = self._iptc()
        for rule in iptc.Chain(table, chain).rules:  # a few rules: python-iptables is fine
            rng = dport_range(rule)
            if rule.protocol == "udp" and rng and rule.target.name == "DNAT":
                udp.append((host_ip_of(rule, family), rng[0]))
        delete_jumps(table, [j.number for j in jumps(table) if j.target == chain])
        iptc.Chain(table, chain).flush()
        table.delete_chain(chain)
        return udp

    def _conflicts(self, table: Any, fp: FamilyPlan, att: Attachment) -> None:
        for jump in jumps(table):
            tag = jump.owner
            if not tag or tag == att.tag or jump.dports is None:
                continue
            first, last_taken = jump.dports
            for fw in fp.forwards:
                last = fw.host_port + fw.count - 1
                if (
                    jump.protocol == fw.protocol
                    and jump.host_ip == fw.host_ip
                    and first <= last
                    and fw.host_port <= last_taken
                ):
                    owner = state.owner_name(self.sd, tag, jump.comment.split(" ", 2)[-1])
                    raise CniError(
                        CONFLICT,
                        f"host port {fw.describe(fp.family)} is already mapped by "
                        f"attachment {owner}",
                        "remove that mapping first (or use another host port); nothing was changed",
                    )

    def _install(self, table: Any, fp: FamilyPlan, plan: Plan) -> None:
        att, external, bit = plan.attachment, plan.external_mark_chain, plan.mark_bit
        rules = Rules(self._iptc(), fp.family)
        mark_chain = external or SETMARK
        if fp.masquerade != MASQ_NONE and external and not table.is_chain(external):
            raise invalid_config(
                f"externalSetMarkChain {external} does not exist in the IPv{fp.family} nat table",
                "create it first (kube-proxy makes KUBE-MARK-MASQ), or leave the option out",
            )
        if fp.masquerade != MASQ_NONE and not external:
            self._ensure_rule(self._ensure_chain(table, SETMARK), rules.setmark(bit))
            self._ensure_rule(self._ensure_chain(table, MASQ), rules.masq(bit))
            self._ensure_rule(self._iptc().Chain(table, "POSTROUTING"), rules.entry(MASQ), True)
        top = self._ensure_chain(table, TOP)
        for hook in ("PREROUTING", "OUTPUT"):
            self._ensure_rule(self._iptc().Chain(table, hook), rules.entry(TOP))
        name = chain_name(att)
        chain = self._ensure_chain(table, name)
        for fw in fp.forwards:
            for r in rules.per_port(fp, fw, mark_chain):
                chain.append_rule(r)
        comment = COMMENT_PREFIX + att.comment
        for fw in fp.forwards:
            jump = rules.jump(fw, name, comment, fp.conditions)
            if fw.host_ip:
                top.insert_rule(jump)  # specific addresses before every wildcard
            else:
                top.append_rule(jump)

    # -- verbs --------------------------------------------------------------------------

    def add(self, plan: Plan) -> None:
        att = plan.attachment
        name = chain_name(att)
        with self._locked():
            state.write(self.sd, att, NAME, [[fp.family, name] for fp in plan.families])
            families = sorted(plan.families, key=lambda f: -f.family)
            done: list[int] = []
            try:
                if len(families) > 1:
                    # Rehearse IPv4 (everything but the commit) before IPv6 is changed: a
                    # conflict or a bad condition there must fail the ADD with nothing
                    # installed, not after IPv6 (and its shared chains) already were.
                    rehearsal = partial(self._add_family, families[1], plan, commit=False)
                    in_family_process(4, rehearsal, isolate=True)
                for fp in families:
                    # IPv4 after IPv6 in a child: if it fails, undoing IPv6 needs a
                    # process that has not loaded IPv4's extensions.
                    work = partial(self._add_family, fp, plan)
                    in_family_process(fp.family, work, isolate=bool(done))
                    done.append(fp.family)
                # Rewritten once done: a GC that started meanwhile sees a new file and
                # leaves this attachment to the next GC (see common/gc.py).
                state.write(self.sd, att, NAME, [[fp.family, name] for fp in plan.families])
            except CniError:
                for family in done:  # undo the family already committed
                    in_family_process(family, partial(self._delete_family, family, name))
                state.remove(self.sd, att)
                raise

    def _add_family(self, fp: FamilyPlan, plan: Plan, commit: bool = True) -> None:
        att = plan.attachment
        table = self._table(fp.family)
        self._conflicts(table, fp, att)
        self._remove_attachment(table, chain_name(att))
        if fp.forwards:
            self._install(table, fp, plan)
        if commit:
            self._commit(table, f"install the IPv{fp.family} port mappings of {att}")

    def _delete_family(self, family: int, name: str) -> list[tuple[str | None, int]]:
        table = self._table(family)
        if not table.is_chain(name):
            return []
        udp = self._remove_attachment(table, name)
        self._commit(table, f"delete the IPv{family} port mappings ({name})")
        return udp

    def delete(self, att: Attachment, plan: Plan | None) -> UdpTargets:
        name = chain_name(att)
        targets: UdpTargets = []
        recorded = state.read(self.sd, att)
        families = {4, 6}
        if recorded and recorded.get("backend") == NAME:
            families = {int(f) for f, _ in recorded.get("objects", []) if f in (4, 6)}
        with self._locked():
            for family in sorted(families, reverse=True):
                udp = in_family_process(family, partial(self._delete_family, family, name))
                targets += [(family, ip, port) for ip, port in udp]
            state.remove(self.sd, att)
        return targets

    def check(self, plan: Plan) -> None:
        problems: list[str] = []
        for fp in sorted(plan.families, key=lambda f: -f.family):
            if fp.forwards:
                problems += in_family_process(fp.family, partial(self._check_family, fp, plan))
        if problems:
            raise CniError(
                CHECK_FAILED,
                f"port mappings of {plan.attachment} differ from the config",
                "; ".join(problems[:8]),
            )

    def _check_family(self, fp: FamilyPlan, plan: Plan) -> list[str]:
        name = chain_name(plan.attachment)
        iptc = self._iptc()
        table = self._table(fp.family)
        if not table.is_chain(name):
            return [f"IPv{fp.family}: chain {name} is missing"]
        rules = Rules(iptc, fp.family)
        mark_chain = plan.external_mark_chain or SETMARK
        wanted = [render(r) for fw in fp.forwards for r in rules.per_port(fp, fw, mark_chain)]
        live = [render(r) for r in iptc.Chain(table, name).rules]
        problems = [f"IPv{fp.family} {name} lacks: {w}" for w in wanted if w not in live]
        problems += [f"IPv{fp.family} {name} has unexpected: {x}" for x in live if x not in wanted]
        found = sum(1 for j in jumps(table) if j.target == name)
        if found != len(fp.forwards):
            problems.append(
                f"IPv{fp.family}: {TOP} has {found} jumps to {name}, expected {len(fp.forwards)}"
            )
        return problems

    def gc(self, network_tag: str, valid_tags: set[str], before: Stamps) -> UdpTargets:
        targets: UdpTargets = []
        with self._locked():
            valid_tags = valid_tags | state.in_flight_tags(self.sd, before)
            for family in (6, 4):
                udp = in_family_process(
                    family, partial(self._gc_family, family, network_tag, valid_tags)
                )
                targets += [(family, ip, port) for ip, port in udp]
            for tag in state.tags_of_network(self.sd, network_tag):
                data = self.sd.read_json(f"{tag}.json")
                if tag not in valid_tags and isinstance(data, dict) and data.get("backend") == NAME:
                    state.remove_tag(self.sd, tag)
        return targets

    def _gc_family(
        self, family: int, network_tag: str, valid_tags: set[str]
    ) -> list[tuple[str | None, int]]:
        table = self._table(family)
        doomed = {
            j.target
            for j in jumps(table)
            if j.owner.startswith(network_tag + "-") and j.owner not in valid_tags
        }
        udp = []
        for chain in sorted(doomed):
            udp += self._remove_attachment(table, chain)
        if doomed:
            self._commit(table, f"delete stale IPv{family} port mappings")
        return udp

    def status(self) -> None:
        """What an ADD needs, asked cheaply (a runtime polls STATUS every few seconds):
        python-iptables installed, the libraries it loads, and each family's legacy nat
        table in the kernel (its header only, IPT_SO_GET_INFO, which loads iptable_nat
        like libiptc does). Importing python-iptables and reading both tables, as an ADD
        does, cost a poll ~10x more CPU and ~13 MiB more memory."""
        import ctypes
        import importlib.util

        if importlib.util.find_spec("iptc") is None:
            raise CniError(STATUS_UNAVAILABLE, "python-iptables is not installed")
        for lib in ("libxtables.so.12", "libip4tc.so.2", "libip6tc.so.2"):
            try:
                ctypes.CDLL(lib)
            except OSError as e:
                raise CniError(STATUS_UNAVAILABLE, f"{lib} cannot be loaded", str(e)) from None
        for family in (4, 6):
            nat_table_info(family)

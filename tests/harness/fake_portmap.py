"""A host's netfilter in memory, for running portmap's verbs without root.

`FakeNetfilter` is the other implementation of portmap's kernel ports (declared in
`portmap.ports`; it inherits nothing from the host's, `portmap.kernel`, so a port method
it lacks fails mypy and tests/fake/test_ports.py and never reaches the kernel), handed to
the verbs as `FakeKernel.run(..., kernel=)`:

* nftables backend (`FakeNft`, a `portmap.ports.NftKernel`): its contexts' `run(text)`
  carry every nft command portmap sends. It keeps the one table portmap makes: its sets
  and maps with their elements (key, comment, data) and its chains with their rules as
  text. A buffer of several commands is one transaction (all or nothing, as libnftables
  does); `get element`, `list tables`, `list set`, `list chain` and `list table` answer in
  libnftables' text format for what portmap asks. Its netlink looks: `has` sees the
  iptables-nft chains of `FakeXtables` (the Go portmap's nftables table is absent),
  `may_have_element` one element of the table (or a set). The localhost guard's lines
  (`ip cni_meta_localnet`, the change a DEL's transaction carries) set the host's guard
  as `guard_localnet` does, in the same all-or-nothing transaction.
* iptables backend (`FakeXtables`, a `portmap.ports.XtablesKernel`): `run` answers every
  iptables-save, iptables -S and iptables-restore call; the tools are all installed, the
  host's `iptables` is iptables-nft and there is no legacy nat table. It keeps each
  (variant, family)'s nat table: chains and rules as `iptables-save -t nat` prints them
  (matches in its order), and applies `iptables-restore --noflush` transactions (-N -A
  -I -D -F -X, all or nothing).
* host extras: route_localnet's sysctls, every container address routed through `cni0`
  (unless `routes` says otherwise), the localhost guard (`guarded`: the interfaces it
  holds; `guard_error` makes the next changes fail) and the UDP conntrack flush
  (recorded, deletes nothing).

Tests compare exact text: `dump()` of the model and `sent()`, the changes requested
since the last call, in order (nft's reads too with `sent(reads=True)`). The root tests
in tests/kernel/test_portmap.py prove that the real kernel agrees.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
from collections.abc import Callable, Iterable
from typing import Any

from portmap.kernel import GUARD_NAME, Route, guard_nft_text

TABLE = "cni_meta_portmap"
ROUTE_LOCALNET = "/proc/sys/net/ipv4/conf/cni0/route_localnet"
# the localhost guard's line in dump() and sent(): route_localnet's companion (tests that
# set route_localnet's lines aside set it aside too)
GUARD = "route_localnet guard: "


def _nothing() -> None:
    pass


def _unguarded(interfaces: list[str]) -> None:
    raise AssertionError("a FakeNft without a host has no localhost guard")


class NftError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


ENOENT, EEXIST, EBUSY = "No such file or directory", "File exists", "Device or resource busy"


# ---------------------------------------------------------------------------- nftables


class FakeNft:
    """The table `inet cni_meta_portmap` (None: absent)."""

    def __init__(self, record: list[str], xtables: FakeXtables) -> None:
        self.record = record
        self.xtables = xtables
        self.table: dict[str, Any] | None = None
        self.before_change: Callable[[], None] = _nothing  # what a test looks at then
        self.guard: Callable[[list[str]], None] = _unguarded  # FakeNetfilter's guard_localnet

    def usable(self) -> bool:
        return True

    def context(self) -> FakeNftContext:
        return FakeNftContext(self)

    def has(self, family: int, table: str, chain: str | None = None) -> bool:
        """The iptables-nft chains are the fake's; Go's nftables table is never there."""
        tables = self.xtables.tables
        return table == "nat" and chain is not None and chain in tables.get(("nft", family), {})

    def may_have_element(self, table: str, set_name: str, key: bytes | None = None) -> bool:
        """The netlink lookup of one element (key: raw bytes; the fake knows the owners
        set's IPv6 keys) or of the set (key None); recorded as a read."""
        assert table == TABLE, table
        sets = self.table["sets"] if self.table is not None else {}
        if key is None:
            self.record.append(f"nft lookup: set {set_name}")
            return set_name in sets
        text = ":".join(key.hex()[i : i + 4] for i in range(0, len(key) * 2, 4))
        self.record.append(f"nft lookup: element {set_name} {text}")
        return set_name in sets and text in sets[set_name]["elems"]

    def run(self, text: str) -> tuple[int, str, str]:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if len(lines) == 1 and lines[0].split()[0] in ("get", "list"):
            try:
                out = self._read(lines[0])
                self.record.append(f"nft read: {lines[0]}")
                return 0, out, ""
            except NftError as e:
                self.record.append(f"nft read: {lines[0]} -> {e.reason}")
                return 1, "", f"Error: Could not process rule: {e.reason}\n{lines[0]}\n"
        self.before_change()
        saved = copy.deepcopy(self.table)
        ours = [line for line in lines if line.split()[2:4] != ["ip", GUARD_NAME]]
        for line in ours:
            try:
                self._write(line)
            except NftError as e:
                self.table = saved
                self.record += [f"nft: {line_}" for line_ in ours]
                self.record.append(f"nft: -> {e.reason} ({line.split('{')[0].strip()})")
                return 1, "", f"Error: Could not process rule: {e.reason}\n{line}\n"
        self.record += [f"nft: {line}" for line in ours]
        if len(ours) < len(lines):  # the guard's lines: last, so that all or nothing holds
            sets = [line for line in lines if line.startswith(f"add set ip {GUARD_NAME} ")]
            try:
                self.guard(
                    re.findall(r'"([^"]*)"', sets[-1].partition("elements")[2]) if sets else []
                )
            except OSError as e:
                self.table = saved
                return 1, "", f"Error: {e}\n"
        return 0, "", ""

    # -- writes

    def _write(self, line: str) -> None:
        words = line.split(None, 5)
        verb, kind = words[0], words[1]
        if words[2:4] != ["inet", TABLE]:
            raise AssertionError(f"portmap touched another table: {line}")
        if kind == "table":
            if verb == "add":
                self.table = self.table or {"sets": {}, "chains": {}}
            elif verb == "delete":
                self._table()
                self.table = None
            return
        table, name = self._table(), words[4]
        if kind in ("set", "map") and verb == "add":
            spec = line.split("type ", 1)[1].split(";")[0]
            table["sets"].setdefault(name, {"kind": kind, "type": spec, "elems": {}})
        elif kind == "chain" and verb == "add":
            table["chains"].setdefault(name, [])
        elif kind == "chain" and verb == "flush":
            self._chain(name).clear()
        elif kind == "rule":
            rules = self._chain(name)
            rules.insert(0, words[5]) if verb == "insert" else rules.append(words[5])
        elif kind == "element":
            elems = self._set(name)["elems"]
            for key, comment, data in _items(line):
                if verb == "delete":
                    if key not in elems:
                        raise NftError(ENOENT)
                    del elems[key]
                elif key in elems:
                    if verb == "create":
                        raise NftError(EEXIST)
                    if elems[key][1] != data:
                        raise NftError(EBUSY)
                else:
                    verdict = data.split()
                    if verdict[:1] in (["goto"], ["jump"]):
                        self._chain(verdict[1])  # as the kernel: no verdict to a missing chain
                    elems[key] = (comment, data)
        else:
            raise AssertionError(f"the fake does not know: {line}")

    def _table(self) -> dict[str, Any]:
        if self.table is None:
            raise NftError(ENOENT)
        return self.table

    def _chain(self, name: str) -> list[str]:
        chains: dict[str, list[str]] = self._table()["chains"]
        if name not in chains:
            raise NftError(ENOENT)
        return chains[name]

    def _set(self, name: str) -> dict[str, Any]:
        sets: dict[str, Any] = self._table()["sets"]
        if name not in sets:
            raise NftError(ENOENT)
        return sets[name]  # type: ignore[no-any-return]

    # -- reads

    def _read(self, line: str) -> str:
        words = line.split(None, 5)
        if words[:2] == ["list", "tables"]:
            return f"table inet {TABLE}\n" if self.table is not None else ""
        assert words[2:4] == ["inet", TABLE], line
        if words[:2] == ["list", "table"]:
            sets = self._table()["sets"]
            return _table_text(self._set_text(name, s["elems"].items()) for name, s in sets.items())
        if words[:2] == ["list", "chain"]:
            rules = "".join(f"\t\t{rule}\n" for rule in self._chain(words[4]))
            return _table_text([f"\tchain {words[4]} {{\n{rules}\t}}\n"])
        s = self._set(words[4])
        if words[:2] == ["list", "set"]:
            return _table_text([self._set_text(words[4], s["elems"].items())])
        assert words[:2] == ["get", "element"], line
        found = []
        for key, _, _ in _items(line):
            if key not in s["elems"]:
                raise NftError(ENOENT)
            found.append((key, s["elems"][key]))
        return _table_text([self._set_text(words[4], found)])

    def _set_text(self, name: str, elems: Any) -> str:
        s = self._set(name)
        items = [_item_text(key, comment, data) for key, (comment, data) in elems]
        body = f"\t\telements = {{ {', '.join(items)} }}\n" if items else ""
        return f"\t{s['kind']} {name} {{\n\t\ttype {s['type']}\n{body}\t}}\n"

    def dump(self) -> str:
        if self.table is None:
            return ""
        lines = [f"table inet {TABLE}"]
        for name, s in self.table["sets"].items():
            lines.append(f"  {s['kind']} {name}")
            lines += [f"    {_item_text(k, c, d)}" for k, (c, d) in s["elems"].items()]
        for name, rules in self.table["chains"].items():
            lines.append(f"  chain {name}")
            lines += [f"    {rule}" for rule in rules]
        return "\n".join(lines) + "\n"


class FakeNftContext:
    """A libnftables context (portmap.ports.NftContext) on the fake table."""

    def __init__(self, fake: FakeNft) -> None:
        self.fake = fake

    def set_json_output(self, on: bool) -> None:
        pass  # only go_takeover reads JSON, from tables this fake does not hold

    def run(self, text: str) -> tuple[int, str, str]:
        return self.fake.run(text)


_ITEM = re.compile(r'^(?P<key>.*?)(?: comment "(?P<comment>[^"]*)")?(?: : (?P<data>.*))?$')


def _items(line: str) -> list[tuple[str, str, str]]:
    """The elements of `... { KEY [comment "C"] [: DATA], ... }` as (key, comment, data)."""
    body = line[line.index("{") + 1 : line.rindex("}")]
    out, part, quoted = [], "", False
    for ch in body + ",":
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            match = _ITEM.match(part.strip())
            assert match, part
            out.append((match["key"], match["comment"] or "", match["data"] or ""))
            part = ""
        else:
            part += ch
    return out


def _item_text(key: str, comment: str, data: str) -> str:
    return key + (f' comment "{comment}"' if comment else "") + (f" : {data}" if data else "")


def _table_text(sets: Iterable[str]) -> str:
    return f"table inet {TABLE} {{\n{''.join(sets)}}}\n"


# ---------------------------------------------------------------------------- iptables

BUILTIN_CHAINS = ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING")
TARGETS = {"ACCEPT", "DROP", "RETURN", "DNAT", "SNAT", "MASQUERADE", "MARK"}
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/[]!,+=@")


def _saved_word(word: str) -> str:
    if word and set(word) <= _SAFE:
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


# iptables-save prints the address, interface and protocol matches first, in this order,
# whatever order they were given in, and an address without a prefix length as a /32
# (/128); the other matches follow as given.
_FRONT = {"-s": "-s", "--source": "-s", "-d": "-d", "--destination": "-d",
          "-i": "-i", "--in-interface": "-i", "-o": "-o", "--out-interface": "-o",
          "-p": "-p", "--protocol": "-p"}  # fmt: skip


def _canonical(words: list[str], family: int) -> list[str]:
    front: dict[str, list[str]] = {}
    rest: list[str] = []
    i = 0
    while i < len(words):
        negated = words[i] == "!" and i + 1 < len(words) and words[i + 1] in _FRONT
        opt = words[i + negated]
        if opt in _FRONT and i + negated + 1 < len(words):
            short, value = _FRONT[opt], words[i + negated + 1]
            if short in ("-s", "-d"):
                value = ",".join(
                    a if "/" in a else f"{a}/{128 if family == 6 else 32}" for a in value.split(",")
                )
            front[short] = ["!"] * negated + [short, value]
            i += negated + 2
        else:
            rest.append(words[i])
            i += 1
    return [w for opt in ("-s", "-d", "-i", "-o", "-p") for w in front.get(opt, [])] + rest


def _target(rule: str) -> str:
    words = shlex.split(rule)
    return words[words.index("-j") + 1] if "-j" in words else ""


class FakeXtables:
    """Each (variant, family)'s nat table: {chain: [rule lines as iptables-save prints]}."""

    def __init__(self, record: list[str]) -> None:
        self.record = record
        self.tables: dict[tuple[str, int], dict[str, list[str]]] = {}
        self.before_change: Callable[[], None] = _nothing  # what a test looks at then

    def tool(self, variant: str, family: int, kind: str) -> str:
        return f"/fake/{'ip6tables' if family == 6 else 'iptables'}-{variant}-{kind}"

    def host_variant(self) -> str:
        return "nft"

    def legacy_nat_exists(self, family: int) -> bool:
        return False

    def may_have(self, variant: str, family: int, chain: str) -> bool:
        """As the host's port: iptables-nft's chains are nftables objects (what FakeNft.has
        sees), and the legacy nat table is absent."""
        if variant == "nft":
            return chain in self.tables.get(("nft", family), {})
        return self.legacy_nat_exists(family)

    def table(self, variant: str, family: int) -> dict[str, list[str]]:
        return self.tables.setdefault((variant, family), {c: [] for c in BUILTIN_CHAINS})

    def run(self, argv: list[str], data: bytes = b"") -> tuple[int, str]:
        name = os.path.basename(argv[0])
        family = 6 if name.startswith("ip6") else 4
        variant = "legacy" if "-legacy" in name else "nft"
        table = self.table(variant, family)
        if name.endswith("-save"):
            assert argv[1:] == ["-t", "nat"], argv
            return 0, self._save(table)
        if name.endswith("-restore"):
            assert argv[1] == "--noflush", argv
            return self._restore(variant, family, data.decode())
        assert argv[-2] == "-S", argv  # iptables -w N -t nat -S CHAIN
        chain = argv[-1]
        if chain not in table:
            return 1, "iptables: No chain/target/match by that name.\n"
        head = f"-P {chain} ACCEPT" if chain in BUILTIN_CHAINS else f"-N {chain}"
        return 0, "".join(f"{line}\n" for line in [head, *table[chain]])

    def _save(self, table: dict[str, list[str]]) -> str:
        lines = ["*nat"]
        lines += [f":{c} {'ACCEPT' if c in BUILTIN_CHAINS else '-'} [0:0]" for c in table]
        lines += [rule for c in table for rule in table[c]]
        return "\n".join([*lines, "COMMIT"]) + "\n"

    def _restore(self, variant: str, family: int, text: str) -> tuple[int, str]:
        lines = text.splitlines()
        assert lines[0] == "*nat" and lines[-1] == "COMMIT", text
        where = f"{variant} ipv{family}"
        if all(x.startswith("-C ") for x in lines[1:-1]):  # checks only: a read
            table = self.table(variant, family)
            bad = [
                n
                for n, x in enumerate(lines[1:-1], 2)
                if not self._apply(table, shlex.split(x), family)
            ]
            return (1, f"iptables-restore: line {bad[0]} failed\n") if bad else (0, "")
        self.before_change()
        table = copy.deepcopy(self.table(variant, family))
        for number, line in enumerate(lines[1:-1], start=2):
            if not self._apply(table, shlex.split(line), family):
                self.record += [f"{where}: {x}" for x in lines[1:-1]]
                self.record.append(f"{where}: -> line {number} failed")
                return 1, f"iptables-restore: line {number} failed\n"
        self.tables[(variant, family)] = table
        self.record += [f"{where}: {x}" for x in lines[1:-1]]
        return 0, ""

    def _apply(self, table: dict[str, list[str]], words: list[str], family: int) -> bool:
        verb, chain, rest = words[0], words[1], words[2:]
        if verb == "-N":
            if chain in table:
                return False
            table[chain] = []
            return True
        if chain not in table:
            return False
        rules = table[chain]
        if verb == "-F":
            rules.clear()
        elif verb == "-X":
            used = any(_target(r) == chain for c in table.values() for r in c)
            if chain in BUILTIN_CHAINS or rules or used:
                return False
            del table[chain]
        elif verb in ("-A", "-I"):
            at = int(rest.pop(0)) - 1 if verb == "-I" and rest[0].isdigit() else 0
            target = _target(" ".join(rest))
            if target not in TARGETS and target not in table:
                return False
            rule = " ".join(["-A", chain, *map(_saved_word, _canonical(rest, family))])
            rules.append(rule) if verb == "-A" else rules.insert(at, rule)
        elif verb in ("-D", "-C"):
            rule = " ".join(["-A", chain, *map(_saved_word, _canonical(rest, family))])
            if rule not in rules:
                return False
            if verb == "-D":
                rules.remove(rule)
        else:
            raise AssertionError(f"the fake does not know: {words}")
        return True

    def dump(self) -> str:
        out = []
        for (variant, family), table in sorted(self.tables.items()):
            rules = [rule for c in table for rule in table[c]]
            users = [f":{c}" for c in table if c not in BUILTIN_CHAINS]
            if rules or users:
                out += [f"{variant} ipv{family}", *users, *rules]
        return "".join(f"{line}\n" for line in out)


# ---------------------------------------------------------------------------- the host


class FakeNetfilter:
    def __init__(self) -> None:
        self.requests: list[str] = []
        self.xtables = FakeXtables(self.requests)
        self.nft = FakeNft(self.requests, self.xtables)
        self.nft.guard = self.guard_localnet
        self.sysctls = {ROUTE_LOCALNET: "0"}
        self.routes: dict[str, Route | None] = {}  # prefix -> the route to it
        self.guarded: list[str] = []  # the interfaces the localhost guard holds
        self.guard_error = ""  # set: the guard cannot be changed (this is why)

    def route_v4(self, ip: str) -> Route | None:
        """`routes`: the longest prefix holding `ip` (a kernel's answer, policy included);
        every other address is on cni0."""
        import ipaddress

        address = ipaddress.ip_address(ip)
        if address.is_loopback:
            return Route(2, "lo")  # RTN_LOCAL, as the local table says
        best = max(
            (ipaddress.ip_network(p) for p in self.routes if address in ipaddress.ip_network(p)),
            key=lambda n: n.prefixlen,
            default=None,
        )
        route = self.routes[str(best)] if best is not None else Route(1, "cni0", "", "bridge")
        return route.replace(link_kind="") if route is not None else None  # link_kind's

    def link_kind(self, name: str) -> str:
        """The kind `routes` gives the device (cni0: a bridge)."""
        kinds = {r.oif: r.link_kind for r in self.routes.values() if r is not None}
        return kinds.get(name, "bridge" if name == "cni0" else "")

    def read_sysctl(self, path: str) -> str:
        if path not in self.sysctls:
            raise FileNotFoundError(2, "No such file or directory", path)
        return self.sysctls[path] + "\n"

    def write_sysctl(self, path: str, value: str) -> None:
        self.read_sysctl(path)
        self.requests.append(f"sysctl {path} = {value}")
        self.sysctls[path] = value

    def guard_localnet(self, interfaces: Iterable[str]) -> None:
        names = sorted(set(interfaces))
        line = f"{GUARD}{' '.join(names) or '(none)'}"
        if self.guard_error:
            self.requests.append(f"{line} -> {self.guard_error}")
            raise OSError(self.guard_error)
        self.requests.append(line)
        self.guarded = names

    def guard_text(self, interfaces: Iterable[str]) -> str:
        return guard_nft_text(sorted(set(interfaces)))

    def localnet_guarded(self, ifname: str) -> bool:
        return ifname in self.guarded

    def flush_udp_conntrack(self, family: int, targets: Iterable[tuple[str | None, int]]) -> int:
        ports = ", ".join(f"{ip or '*'}:{port}" for ip, port in targets)
        self.requests.append(f"conntrack: flush IPv{family} UDP to {ports}")
        return 0

    def dump(self) -> str:
        sysctls = [f"sysctl {k} = {v}\n" for k, v in sorted(self.sysctls.items())]
        guard = f"{GUARD}{' '.join(self.guarded)}\n" if self.guarded else ""
        return self.nft.dump() + self.xtables.dump() + guard + "".join(sysctls)

    def sent(self, reads: bool = False) -> str:
        """The changes requested since the last call, one a line (and nft's reads)."""
        out = [
            r for r in self.requests if reads or not r.startswith(("nft read: ", "nft lookup: "))
        ]
        self.requests.clear()
        return "".join(line + "\n" for line in out)

"""The iptables backend: the Go portmap's nat rules, chains and names, written with
iptables-restore on the host's variant (legacy or nf_tables), so that Go's DEL removes
what ours added and ours what Go's added. Rules, names, transactions, locking and the
choice of variant: docs/portmap.md#iptables-backend.
"""

from __future__ import annotations

import os

from common.digest import sha512_hex
from common.errors import (
    CONFLICT,
    KERNEL_FAILURE,
    STATUS_UNAVAILABLE,
    TRY_AGAIN_LATER,
    CniError,
    invalid_config,
)
from common.lock import LOCK_TIMEOUT_ENV, lock_timeout
from common.log import Log
from common.values import Value
from portmap import state
from portmap.config import (
    CHAIN_PREFIX,
    IPT_ADDRESS_OPTIONS,
    Conditions,
    go_chain_name,
)
from portmap.plan import MASQ_ALL, MASQ_NONE, FamilyPlan, Forward, Plan, UdpTargets
from portmap.state import Chain, XtablesRecord

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from common.identity import Attachment
    from common.store import Stamps
    from portmap.localnet import Rider
    from portmap.ports import XtablesKernel
    from portmap.state import Store

NAME = "iptables"
TOP = "CNI-HOSTPORT-DNAT"
SETMARK = "CNI-HOSTPORT-SETMARK"
MASQ = "CNI-HOSTPORT-MASQ"
LOCK = "iptables.lock"
GO_COMMENT = 'dnat name: "{}" id: "{}"'
MULTIPORT_PORTS = 15  # what one multiport match holds (a range takes two)
VARIANTS = state.VARIANTS
VARIANT_ENV = "CNI_META_IPTABLES"
Words = list[str]


def second_chain_name(att: Attachment) -> str:
    """The chain of a second attachment of one container to one network (another
    ifname), whose Go name the first one has. "/" is in no network name or container
    id, so this hash input is never Go's for any pair."""
    raw = f"{att.network}/{att.container_id}/{att.ifname}"
    return (CHAIN_PREFIX + sha512_hex(raw.encode()))[:28]


def chain_name(att: Attachment) -> str:
    """The chain an ADD gives `att` unless Go's name is taken (see second_chain_name)."""
    return go_chain_name(att.network, att.container_id)


def go_comment(network: str, container_id: str) -> str:
    """The comment of Go's jumps, cut as Go cuts it (iptables keeps 255 bytes)."""
    text = GO_COMMENT.format(network, container_id)
    raw = text.encode()
    return text if len(raw) <= 255 else raw[:253].decode(errors="ignore") + "..."


def parse_go_comment(comment: str) -> tuple[str, str] | None:
    """(network, container id) of a comment in Go's format, or None."""
    head, sep, rest = comment.partition('dnat name: "')
    network, sep2, rest = rest.partition('" id: "')
    if head or not sep or not sep2 or not rest.endswith('"'):
        return None
    return network, rest[:-1]


# ---------------------------------------------------------------------------- the tools


class Tools(Value):
    """The iptables tools of this host, reached through the backend's kernel port."""

    port: XtablesKernel

    def tool(self, variant: str, family: int, kind: str) -> str:
        """Path of e.g. ip6tables-nft-save; error 50 when it is not installed."""
        path = self.port.tool(variant, family, kind)
        if path is None:
            name = f"{'ip6tables' if family == 6 else 'iptables'}-{variant}-{kind}"
            raise CniError(
                STATUS_UNAVAILABLE,
                f"{name} is not installed",
                "install the iptables package, or use the nftables backend",
            )
        return path

    def save(self, variant: str, family: int) -> str:
        """`iptables-save -t nat` of that variant; "" when it has no nat table (the legacy
        tool creates the table it is asked for, so it is only asked when the kernel lists
        one)."""
        if variant == "legacy" and not self.port.legacy_nat_exists(family):
            return ""
        code, text = self.port.run([self.tool(variant, family, "save"), "-t", "nat"])
        if code != 0:
            raise CniError(
                KERNEL_FAILURE, f"cannot read the IPv{family} nat table (iptables-{variant})", text
            )
        return text

    def listing(self, variant: str, family: int, chains: tuple[str, ...]) -> str:
        """`iptables -t nat -S CHAIN` of each chain (those that exist), for NatTable: DEL
        and CHECK look at two chains only, which iptables-nft translates alone, where
        iptables-nft-save translates the whole table."""
        if variant == "legacy" and not self.port.legacy_nat_exists(family):
            return ""
        out = []
        exe = self.tool(variant, family, "save").removesuffix("-save")
        for chain in chains:
            code, text = self._waiting([exe], ["-t", "nat", "-S", chain])
            if code == 0:
                out.append(text)
            # (iptables-nft 1.8.9 calls a chain that does not exist "incompatible")
            elif "No chain" not in text and "incompatible" not in text:
                raise CniError(KERNEL_FAILURE, f"cannot list {chain} (iptables-{variant})", text)
        return "\n".join(out)

    def _waiting(self, head: list[str], tail: list[str], data: bytes = b"") -> tuple[int, str]:
        """`head -w N tail`: the tool waits up to our lock timeout for the xtables lock,
        like every other iptables user; error 11 when it stayed taken."""
        wait = str(max(1, int(lock_timeout())))
        code, out = self.port.run([*head, "-w", wait, *tail], data)
        if code != 0 and "xtables lock" in out:
            lock = os.environ.get("XTABLES_LOCKFILE", "/run/xtables.lock")
            raise CniError(
                TRY_AGAIN_LATER,
                f"another iptables user (iptables-restore?) holds {lock}",
                f"waited {wait}s ({LOCK_TIMEOUT_ENV}); try again later",
            )
        return code, out

    def restore(self, variant: str, family: int, lines: list[str]) -> str:
        """Commit `lines` to the nat table in one transaction; "" or the tool's complaint
        (with the text of the line it names: iptables-legacy-restore gives only its
        number)."""
        text = "*nat\n" + "\n".join(lines) + "\nCOMMIT\n"
        restore = [self.tool(variant, family, "restore"), "--noflush"]
        code, out = self._waiting(restore, [], text.encode())
        if code == 0:
            return ""
        complaint = out.strip() or "failed"
        _, found, rest = complaint.partition("line ")
        number = rest.split(" ", 1)[0].rstrip(":")
        if found and number.isdigit() and 2 <= int(number) <= len(lines) + 1:
            complaint += f" (line {number}: {lines[int(number) - 2]})"
        return complaint

    def commit(self, variant: str, family: int, lines: list[str], what: str) -> None:
        """restore(), failing the call when the tool refuses (no lines: nothing is run)."""
        if not lines:
            return
        complaint = self.restore(variant, family, lines)
        if complaint:
            raise CniError(
                KERNEL_FAILURE, f"iptables-{variant}-restore refused to {what}", complaint
            )

    def delete_chains(self, variant: str, family: int, chains: tuple[str, ...]) -> UdpTargets:
        """Delete `chains` and the jumps to them from CNI-HOSTPORT-DNAT, those there (the
        caller holds LOCK); their UDP mappings."""
        table = NatTable(self.listing(variant, family, (*chains, TOP)))
        lines: list[str] = []
        udp: UdpTargets = []
        for chain in chains:
            more, found = removal(table, chain, family)
            lines += more
            udp += found
        what = f"delete the IPv{family} port mappings ({', '.join(chains)})"
        self.commit(variant, family, lines, what)
        return udp

    def choose_variant(self, log: Log) -> tuple[str, str]:
        """(variant, its IPv4 nat table as saved) for this call: the one whose nat table
        holds more rules, as kube-proxy's iptables-wrapper decides (there the nat table
        holds most of kube-proxy's rules too); a tie, an empty host included, goes to the
        host's `iptables`. The table read for counting is the one the call then works
        on, so the choice costs one extra read at most."""
        forced = os.environ.get(VARIANT_ENV, "")
        if forced in VARIANTS:
            return forced, self.save(forced, 4)
        texts: dict[str, str] = {}
        for variant in VARIANTS:
            try:
                texts[variant] = self.save(variant, 4)
            except CniError:
                texts[variant] = ""  # not installed, or not usable here: nothing of ours
        count = {v: texts[v].count("\n-A ") for v in VARIANTS}
        if count["nft"] != count["legacy"]:
            chosen = "nft" if count["nft"] > count["legacy"] else "legacy"
        else:
            chosen = self.port.host_variant()
        if count["nft"] and count["legacy"]:
            log.warning(
                f"both iptables variants have nat rules (nft {count['nft']}, legacy "
                f"{count['legacy']}): using iptables-{chosen}"
            )
        return chosen, texts[chosen] or self.save(chosen, 4)


# ---------------------------------------------------------------------------- rule text

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/[]!,+=@")


def quote(word: str) -> str:
    if word and all(c in _SAFE for c in word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def split_words(text: str) -> Words:
    """The words of a saved rule. iptables-save quotes ("...") only words that need it,
    and inside the quotes puts a backslash before \\, " and ' (and nowhere else)."""
    escaped = "\\" in text
    if escaped:  # out of the way of the split on quotes; put back after it
        text = text.replace("\\\\", "\0").replace('\\"', "\1").replace("\\'", "'")
    words: Words = []
    for i, part in enumerate(text.split('"')):
        words += [part] if i % 2 else part.split()
    if escaped:
        words = [word.replace("\1", '"').replace("\0", "\\") for word in words]
    return words


def line(verb: str, chain: str, words: Words) -> str:
    return " ".join([verb, chain, *map(quote, words)])


class NatTable:
    """One family's nat table as iptables-save printed it: chains and raw rule lines."""

    __slots__ = ("_words", "chains", "lines")

    def __init__(self, text: str) -> None:
        self.chains = {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}  # even with no table
        self.lines: dict[str, list[str]] = {}
        self._words: dict[str, list[Words]] = {}
        for raw in text.splitlines():
            if raw.startswith((":", "-N ")):  # iptables-save / iptables -S
                self.chains.add(raw.split(" ", 2)[raw[0] == "-"].lstrip(":"))
            elif raw.startswith("-A "):
                chain = raw[3:].split(" ", 1)[0]
                self.lines.setdefault(chain, []).append(raw)

    def words(self, chain: str) -> list[Words]:
        """The rules of `chain`, each as its words after `-A <chain>`."""
        if chain not in self._words:
            self._words[chain] = [split_words(r)[2:] for r in self.lines.get(chain, [])]
        return self._words[chain]

    def jumps(self) -> list[Jump]:
        return [Jump(raw) for raw in self.lines.get(TOP, [])]

    def ensure(self, chain: str, words: Words, first: bool = False) -> list[str]:
        """Lines that make `chain` exist and hold this rule (nothing if it does)."""
        out = []
        if chain not in self.chains:
            out.append(f"-N {chain}")
            self.chains.add(chain)
        if words not in self.words(chain):
            out.append(line("-I", f"{chain} 1", words) if first else line("-A", chain, words))
            self.words(chain).append(words)
        return out


class Jump(Value):
    """One saved rule: the fields conflicts, DEL and GC look at (a jump of
    CNI-HOSTPORT-DNAT, or a DNAT rule of an attachment's chain)."""

    raw: str
    protocol: str = ""
    comment: str = ""
    target: str = ""
    host_ip: str | None = None
    dports: tuple[int, int] | None = None

    def __init__(self, raw: str) -> None:
        super().__init__(raw)
        words = split_words(raw)
        for i, word in enumerate(words[:-1]):
            value = words[i + 1]
            if word == "-p":
                self.protocol = value
            elif word == "-d" and words[i - 1] != "!":
                self.host_ip = value.split("/")[0]
            elif word == "--dport" and self.dports is None:
                first, _, last = value.partition(":")
                if first.isdigit() and (last or first).isdigit():
                    self.dports = (int(first), int(last or first))
            elif word == "--comment":
                self.comment = value
            elif word == "-j":
                self.target = value

    def delete(self) -> str:
        """The line that deletes exactly this rule (iptables -D with its full text)."""
        return "-D" + self.raw[2:]


# ---------------------------------------------------------------------------- rules


def _ports(fw: Forward, family: int, port: int) -> Words:
    """The destination part of a chain rule, in the order iptables-save prints it."""
    words = ["-d", f"{fw.host_ip}/{128 if family == 6 else 32}"] if fw.host_ip else []
    return [*words, "-p", fw.protocol, "-m", fw.protocol, "--dport", str(port)]


def per_port(fp: FamilyPlan, fw: Forward, mark_chain: str) -> list[Words]:
    """The attachment chain's rules for one forward, as iptables-save prints them: per
    port Go's hairpin mark (container subnet; every source with masqAll), its localhost
    mark (IPv4, 127.0.0.1) and the DNAT."""
    out = []
    for hp, cp in fw.ports():
        dest = _ports(fw, fp.family, hp)
        if fp.masquerade == MASQ_ALL:
            out.append([*dest, "-j", mark_chain])
        elif fp.masquerade != MASQ_NONE:
            sources = [fp.subnet_cidr] + (["127.0.0.1/32"] if fp.localhost else [])
            out += [["-s", src, *dest, "-j", mark_chain] for src in sources]
        ip = fp.container_ip if fp.family == 4 else f"[{fp.container_ip}]"
        out.append([*dest, "-j", "DNAT", "--to-destination", f"{ip}:{cp}"])
    return out


def chain_order(forwards: tuple[Forward, ...]) -> list[Forward]:
    """Go's order of the chain's rules (config order), except that a specific host
    address goes before a wildcard of this attachment that would shadow it."""
    out: list[Forward] = []
    for fw in sorted(forwards, key=lambda f: f.mapping):
        last = fw.host_port + fw.count - 1
        shadows = [
            i
            for i, o in enumerate(out)
            if fw.host_ip and o.host_ip is None and o.overlaps(fw.protocol, fw.host_port, last)
        ]
        out.insert(shadows[0] if shadows else len(out), fw)
    return out


def condition_words(conditions: Conditions) -> Words:
    """The conditions as iptables arguments, as written (Go puts them in its jumps; parse
    refused nft expressions for this backend)."""
    return [word for match in conditions.matches for word in match.iptables]


def _rules_per_jump(conditions: Conditions) -> int:
    """iptables makes one rule per combination of the -s and -d addresses of a list."""
    words = condition_words(conditions)
    n = 1
    for i, option in enumerate(words[:-1]):
        if option in IPT_ADDRESS_OPTIONS:
            n *= words[i + 1].count(",") + 1
    return n


def jumps(plan: Plan, fp: FamilyPlan, chain: str) -> list[Words]:
    """Go's jumps to the attachment's chain: per protocol (sorted), multiport lists of
    every mapping's host port in config order (those of the other family's hostIP too,
    as Go), at most 15 ports each; the family's conditions after them."""
    att = plan.attachment
    comment = go_comment(att.network, att.container_id)
    conditions = condition_words(fp.conditions)
    lists: dict[str, list[list[str]]] = {}
    for protocol, port, count in plan.host_ports:
        spec = f"{port}:{port + count - 1}" if count > 1 else str(port)
        groups = lists.setdefault(protocol, [[]])
        used = sum(1 + (":" in p) for p in groups[-1])
        if used + 1 + (":" in spec) > MULTIPORT_PORTS:
            groups.append([])
        groups[-1].append(spec)
    head = ["-m", "comment", "--comment", comment, "-m", "multiport", "-p"]
    return [
        [*head, protocol, "--dports", ",".join(ports), *conditions, "-j", chain]
        for protocol in sorted(lists)
        for ports in lists[protocol]
    ]


# ---------------------------------------------------------------------------- changes


def removal(table: NatTable, chain: str, family: int) -> tuple[list[str], UdpTargets]:
    """Lines deleting the jumps to `chain` and the chain; its UDP mappings."""
    if chain not in table.chains:
        return [], []
    lines = [j.delete() for j in table.jumps() if j.target == chain]
    lines += [f"-F {chain}", f"-X {chain}"]
    udp: UdpTargets = []
    for raw in table.lines.get(chain, []):
        rule = Jump(raw)
        if rule.protocol == "udp" and rule.target == "DNAT" and rule.dports:
            udp.append((family, rule.host_ip, rule.dports[0]))
    return lines, udp


def sweep(
    table: NatTable, family: int, stale: Callable[[Jump], bool]
) -> tuple[list[str], UdpTargets]:
    """Lines deleting the jumps `stale` picks and the chains they go to (a chain that
    another rule still jumps to stays: only the picked jumps go); their UDP mappings."""
    jumps = table.jumps()
    doomed = [j for j in jumps if stale(j)]
    lines: list[str] = []
    udp: UdpTargets = []
    for chain in sorted({j.target for j in doomed}):
        if any(j.target == chain and not stale(j) for j in jumps):
            lines += [j.delete() for j in doomed if j.target == chain]
        else:
            more, found = removal(table, chain, family)
            lines += more
            udp += found
    return lines, udp


def recorded_owner(sd: Store, network: str, container_id: str, chain: str) -> str:
    """'network/container/ifname' of our attachment whose record names `chain`, or ""."""
    for entry in sd.entries(network).values():
        if not isinstance(entry, XtablesRecord) or entry.container_id != container_id:
            continue
        if any(c.name == chain for c in entry.chains):
            return str(entry.attachment)
    return ""


def _owner(sd: Store, j: Jump) -> str:
    """Who owns the chain `j` jumps to, for a conflict's message."""
    go = parse_go_comment(j.comment)
    if go is None:
        return f"of chain {j.target}"
    return recorded_owner(sd, go[0], go[1], j.target) or f"{go[0]}/{go[1]}"


def placement(table: NatTable, fp: FamilyPlan, chain: str, sd: Store) -> int | None:
    """Where in CNI-HOSTPORT-DNAT the jumps of this attachment go: a 1-based position to
    insert them at, or None to append them (as Go does). Error 101 when a host port of the
    plan is DNATed by another chain already.

    Go's jumps name ports, not addresses: a packet enters the chain of every jump whose
    ports it matches, in order, until a DNAT rule of one matches its address. So for a
    specific host address to beat a wildcard on the same port, as the nftables backend's
    lookups do, the chain holding the specific rule must come first. This attachment's
    jumps therefore go below every chain with a specific address on a port it maps as a
    wildcard, and above every chain with a wildcard on a port it maps to a specific
    address: appended unless the latter exists, else just above the first such chain.
    When both cannot hold (a chain with a wildcard on one of our specific ports sits
    above a chain with a specific address on one of our wildcard ports), no order gives
    every address its owner: error 101 rather than a shadowed mapping."""
    above: tuple[int, Jump] | None = None  # the last jump that must stay above ours
    below: tuple[int, Jump] | None = None  # the first jump that must stay below ours
    rules: dict[str, list[Jump]] = {}
    position = 0
    for j in table.jumps():
        if j.target == chain:
            continue  # ours: deleted before the new ones go in
        position += 1
        if j.target not in rules:
            rules[j.target] = [Jump(raw) for raw in table.lines.get(j.target, [])]
        for rule in rules[j.target]:
            if j.protocol and rule.protocol != j.protocol:
                continue  # this jump never sends that rule's packets there
            if rule.target != "DNAT" or rule.dports is None:
                continue
            for fw in fp.forwards:
                if not fw.overlaps(rule.protocol, *rule.dports):
                    continue
                if rule.host_ip == fw.host_ip:
                    raise state.port_taken(fw.describe(fp.family), _owner(sd, j))
                if fw.host_ip is None:
                    above = (position, j)
                elif rule.host_ip is None and below is None:
                    below = (position, j)
    if below is None:
        return None
    if above is not None and above[0] > below[0]:
        raise CniError(
            CONFLICT,
            f"the IPv{fp.family} host ports of this attachment cannot be ordered against "
            f"attachments {_owner(sd, below[1])} and {_owner(sd, above[1])}",
            "a specific hostIP of ours shares a port with the first one's wildcard, and a "
            "wildcard of ours with the second one's specific hostIP, and the first comes "
            "before the second; use other host ports; nothing was changed",
        )
    return below[0]


def installation(
    table: NatTable, fp: FamilyPlan, plan: Plan, name: str, at: int | None = None
) -> list[str]:
    """Lines replacing this attachment's rules of one family with the plan's, in chain
    `name`: Go's rules, in Go's order of creation; its jumps appended, or inserted at
    position `at` of CNI-HOSTPORT-DNAT (placement)."""
    external, bit = plan.external_mark_chain, plan.mark_bit
    lines: list[str] = []
    if fp.masquerade != MASQ_NONE and external and external not in table.chains:
        raise invalid_config(
            f"externalSetMarkChain {external} does not exist in the IPv{fp.family} nat table",
            "create it first (kube-proxy makes KUBE-MARK-MASQ), or leave the option out",
        )
    if fp.masquerade != MASQ_NONE and not external:
        mark = f"{1 << bit:#x}/{1 << bit:#x}"
        setmark = ["-m", "comment", "--comment", "CNI portfwd masquerade mark", "-j", "MARK"]
        lines += table.ensure(SETMARK, [*setmark, "--set-xmark", mark])
        lines += table.ensure(MASQ, ["-m", "mark", "--mark", mark, "-j", "MASQUERADE"])
        to_masq = ["-m", "comment", "--comment", "CNI portfwd requiring masquerade", "-j", MASQ]
        lines += table.ensure("POSTROUTING", to_masq, first=True)
    if TOP not in table.chains:
        lines.append(f"-N {TOP}")
        table.chains.add(TOP)
    for hook in ("PREROUTING", "OUTPUT"):
        lines += table.ensure(hook, ["-m", "addrtype", "--dst-type", "LOCAL", "-j", TOP])
    if name in table.chains:  # a repeated ADD: replace what is there
        lines += [j.delete() for j in table.jumps() if j.target == name]
        lines.append(f"-F {name}")
    else:
        lines.append(f"-N {name}")
    mark_chain = external or SETMARK
    for fw in chain_order(fp.forwards):
        lines += [line("-A", name, words) for words in per_port(fp, fw, mark_chain)]
    entries = jumps(plan, fp, name)
    if at is None:
        lines += [line("-A", TOP, words) for words in entries]
    else:
        lines += [line("-I", f"{TOP} {i}", words) for i, words in enumerate(entries, at)]
    return lines


# ---------------------------------------------------------------------------- the backend


class XtablesBackend:
    name = NAME

    def __init__(self, sd: Store, log: Log, port: XtablesKernel) -> None:
        from common.attachment import Engine

        self.sd = sd
        self.log = log
        self.tools = Tools(port)
        self.port = port
        self.engine = Engine(sd, log, LOCK)
        self._chosen: tuple[str, str] | None = None

    def owns(self, recorded: state.Recorded | None) -> bool:
        return isinstance(recorded, XtablesRecord)

    def may_hold(self) -> bool:
        """Wherever CNI-HOSTPORT-DNAT may be (a cheap look per variant and family): its
        chains are the Go portmap's too, made perhaps before ours was installed."""
        return any(self.port.may_have(v, f, TOP) for v in VARIANTS for f in (4, 6))

    def _variant(self) -> str:
        """The variant of this call, decided once; its IPv4 table is kept for the first
        read (call under the lock when it is to be written)."""
        if self._chosen is None:
            self._chosen = self.tools.choose_variant(self.log)
        return self._chosen[0]

    def _table(self, variant: str, family: int) -> NatTable:
        if self._chosen and self._chosen[0] == variant and family == 4 and self._chosen[1]:
            text, self._chosen = self._chosen[1], (variant, "")
            return NatTable(text)
        return NatTable(self.tools.save(variant, family))

    def _where(self, recorded: state.Recorded | None) -> list[Chain] | None:
        """The chains a previous ADD recorded, or None."""
        return list(recorded.chains) if isinstance(recorded, XtablesRecord) else None

    def _name(self, att: Attachment, previous: list[Chain], tables: dict[int, NatTable]) -> str:
        """Go's name, unless another attachment (ours or Go's) of this container and
        network has it: then second_chain_name. A repeated ADD keeps its name."""
        go, second = chain_name(att), second_chain_name(att)
        names = {c.name for c in previous}
        if go in names or second in names:
            return go if go in names else second
        return second if any(go in t.chains for t in tables.values()) else go

    def _record(self, att: Attachment, chains: list[Chain]) -> XtablesRecord:
        return XtablesRecord(att.network, att.container_id, att.ifname, chains=tuple(chains))

    # -- verbs --------------------------------------------------------------------------

    def add(self, plan: Plan) -> None:
        att = plan.attachment
        with self.engine.add(att) as change:
            variant = self._variant()
            previous = self._where(change.previous) or []
            tables = {fp.family: self._table(variant, fp.family) for fp in plan.families}
            name = self._name(att, previous, tables)
            chains = [Chain(fp.family, name, variant) for fp in plan.families]
            done: list[int] = []

            def undo() -> None:
                for family in done:
                    self.tools.delete_chains(variant, family, (name,))

            for old in previous:
                # a repeated ADD after the host changed variant: the previous record
                # still covers these until the intent below replaces it
                if (old.name, old.variant) != (name, variant):
                    self.tools.delete_chains(old.variant, old.family, (old.name,))
                    tables.clear()  # read again: they held that chain
            change.intend(self._record(att, chains + previous), undo)
            for attempt in (1, 2):
                try:
                    self._add_families(variant, plan, name, done, tables)
                    break
                except CniError as e:
                    # somebody changed the table between our read and write (another
                    # iptables user made a chain): read it again, once
                    if e.code != KERNEL_FAILURE or attempt == 2:
                        raise
                    tables.clear()
            change.confirm(self._record(att, chains))

    def _add_families(
        self, variant: str, plan: Plan, name: str, done: list[int], tables: dict[int, NatTable]
    ) -> None:
        """Read every family first: a conflict or a bad option in any of them fails the
        ADD before anything is written."""
        changes = []
        for fp in plan.families:
            if fp.family in done:
                continue
            table = tables.pop(fp.family, None) or self._table(variant, fp.family)
            at = placement(table, fp, name, self.sd)
            if fp.forwards:
                changes.append((fp.family, installation(table, fp, plan, name, at)))
            else:
                changes.append((fp.family, removal(table, name, fp.family)[0]))
        for family, lines in changes:
            what = f"install the IPv{family} port mappings of {plan.attachment}"
            self.tools.commit(variant, family, lines, what)
            done.append(family)

    def delete(self, att: Attachment, plan: Plan | None, rider: Rider | None = None) -> UdpTargets:
        """The recorded chains. Without a record: the names only this attachment can
        have (Go's name is go_takeover.release's: a sibling attachment may own it). The
        localhost guard's change is not carried (`rider`): no nft transaction here."""

        def teardown(recorded: state.Recorded | None) -> UdpTargets:
            where = self._where(recorded)
            if where is None:  # usually a repeated DEL: cheap looks, no tool run
                own = (second_chain_name(att),)
                where = [Chain(f, c, v) for v in VARIANTS for f in (4, 6) for c in own]
                where = [c for c in where if self.port.may_have(c.variant, c.family, c.name)]
            targets: UdpTargets = []
            for variant, family in sorted({(c.variant, c.family) for c in where}):
                here = [c.name for c in where if (c.variant, c.family) == (variant, family)]
                targets += self.tools.delete_chains(variant, family, tuple(dict.fromkeys(here)))
            return targets

        return self.engine.delete(att, teardown)

    def check(self, plan: Plan) -> list[str]:
        att = plan.attachment
        where = self._where(self.sd.load(att)) or []
        recorded = {c.family: (c.name, c.variant) for c in where}
        go = chain_name(att)
        mark_chain = plan.external_mark_chain or SETMARK
        problems: list[str] = []
        for fp in plan.families:
            if not fp.forwards:
                continue
            # no record: a pod the Go portmap set up has Go's name
            name, variant = recorded.get(fp.family) or (go, self._variant())
            table = NatTable(self.tools.listing(variant, fp.family, (name, TOP)))
            if name not in table.chains:
                problems.append(f"IPv{fp.family}: chain {name} is missing (iptables-{variant})")
                continue
            wanted = [w for fw in chain_order(fp.forwards) for w in per_port(fp, fw, mark_chain)]
            live = table.words(name)
            show = " ".join
            problems += [f"IPv{fp.family} {name} lacks: {show(w)}" for w in wanted if w not in live]
            problems += [
                f"IPv{fp.family} {name} has unexpected: {show(x)}" for x in live if x not in wanted
            ]
            # The jumps carry the conditions, which iptables-save rewrites (match order,
            # address prefixes): let iptables itself compare them (-C, a read; legacy
            # restore commits nothing when nothing changed). It stops at the first missing.
            entries = jumps(plan, fp, name)
            checks = [line("-C", TOP, w) for w in entries]
            complaint = self.tools.restore(variant, fp.family, checks)
            if complaint:
                problems.append(
                    f"IPv{fp.family}: {TOP} lacks a jump the config asks for: {complaint}"
                )
            found = sum(1 for j in table.jumps() if j.target == name)
            expected = len(entries) * _rules_per_jump(fp.conditions)
            if found != expected:
                problems.append(
                    f"IPv{fp.family}: {TOP} has {found} jumps to {name}, expected {expected}"
                )
        return problems

    def gc(self, network: str, valid: set[Attachment], before: Stamps) -> UdpTargets:
        """Both variants, both families (an attachment may have been added before the host
        switched), wherever CNI-HOSTPORT-DNAT may be: the jumps of `network` in Go's
        format (ours and the Go portmap's alike) whose container is neither valid nor in
        an ADD in flight; then their chains, unless another rule still jumps there."""
        targets: UdpTargets = []
        unusable = state.unusable_prefix(self.sd, network)
        with self.engine.collecting(
            network, valid, owns=self.owns, unusable=unusable, before=before
        ) as alive:
            keep = {go_chain_name(network, a.container_id) for a in alive}
            keep |= {second_chain_name(a) for a in alive}

            def stale(j: Jump) -> bool:
                if not j.target.startswith(CHAIN_PREFIX):
                    return False
                go = parse_go_comment(j.comment)
                return go is not None and go[0] == network and j.target not in keep

            for variant in VARIANTS:
                for family in (4, 6):
                    if self.port.may_have(variant, family, TOP):
                        targets += self._gc_family(variant, family, stale)
        return targets

    def _gc_family(self, variant: str, family: int, stale: Callable[[Jump], bool]) -> UdpTargets:
        try:
            top = self.tools.listing(variant, family, (TOP,))
        except CniError as e:
            if e.code != STATUS_UNAVAILABLE:
                raise
            return []  # that variant's tools are not installed: nothing to remove with
        doomed = [j for j in NatTable(top).jumps() if stale(j)]
        if not doomed:
            return []
        chains = tuple(sorted({j.target for j in doomed}))
        table = NatTable(top + "\n" + self.tools.listing(variant, family, chains))
        lines, udp = sweep(table, family, stale)
        self.tools.commit(variant, family, lines, f"delete stale IPv{family} port mappings")
        self.log.info(f"GC removed iptables-{variant} IPv{family} chains {', '.join(chains)}")
        return udp

    def status(self) -> None:
        """The tools of the variant an ADD would use are there. Polled often (containerd
        2.1+ on every status poll): no table is read, the host's `iptables` decides."""
        forced = os.environ.get(VARIANT_ENV, "")
        variant = forced if forced in VARIANTS else self.port.host_variant()
        for family in (4, 6):
            for kind in ("save", "restore"):
                self.tools.tool(variant, family, kind)

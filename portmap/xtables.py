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
from common.log import Log
from common.state import LOCK_TIMEOUT_ENV, AttachmentStore, lock_timeout
from common.values import Value
from portmap import state
from portmap.config import IPT_ADDRESS_OPTIONS, Attachment, Conditions, network_tag
from portmap.plan import MASQ_ALL, MASQ_NONE, FamilyPlan, Forward, Plan, UdpTargets

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from common.gc import AttachmentId
    from common.state import Stamps

NAME = "iptables"
TOP = "CNI-HOSTPORT-DNAT"
SETMARK = "CNI-HOSTPORT-SETMARK"
MASQ = "CNI-HOSTPORT-MASQ"
LOCK = "iptables.lock"
CHAIN_PREFIX = "CNI-DN-"
OLD_COMMENT_PREFIX = "portmap "  # the jumps of our naming before Go's: "portmap <tag> ..."
GO_COMMENT = 'dnat name: "{}" id: "{}"'
MULTIPORT_PORTS = 15  # what one multiport match holds (a range takes two)
VARIANTS = ("nft", "legacy")
VARIANT_ENV = "CNI_META_IPTABLES"
# The only directories a tool is run from (absolute, root's own), never PATH: runtimes
# exec plugins with all sorts of PATHs (or none, or relative entries).
TOOL_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/local/bin")
Words = list[str]


def go_chain_name(network: str, container_id: str) -> str:
    """Go's per-attachment chain: CNI-DN- and the start of sha512(network + container id)
    in hex, 28 characters in all (iptables' limit)."""
    return (CHAIN_PREFIX + sha512_hex((network + container_id).encode()))[:28]


def second_chain_name(att: Attachment) -> str:
    """The chain of a second attachment of one container to one network (another
    ifname), whose Go name the first one has. "/" is in no network name or container
    id, so this hash input is never Go's for any pair."""
    raw = f"{att.network}/{att.container_id}/{att.ifname}"
    return (CHAIN_PREFIX + sha512_hex(raw.encode()))[:28]


def old_chain_name(att: Attachment) -> str:
    """The chain name of our releases before Go's naming (hash of the tag): attachments
    added then are still deleted by it."""
    return CHAIN_PREFIX + sha512_hex(att.tag.encode())[:21]


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


def tool(variant: str, family: int, kind: str) -> str:
    """Path of e.g. ip6tables-nft-save; error 50 when it is not installed."""
    name = f"{'ip6tables' if family == 6 else 'iptables'}-{variant}-{kind}"
    for d in TOOL_DIRS:
        path = os.path.join(d, name)
        if os.access(path, os.X_OK):
            return path
    raise CniError(
        STATUS_UNAVAILABLE,
        f"{name} is not installed",
        "install the iptables package, or use the nftables backend",
    )


def run(argv: list[str], data: bytes = b"") -> tuple[int, str]:
    """Run argv with `data` on its stdin; (exit status, its stdout and stderr).

    posix_spawn and pipes, not subprocess (~10 ms of imports on every call). stdin is
    written whole first: iptables-restore reads all of it before it answers, and the
    save tools read none. stdout and stderr share one pipe, so neither can fill up while
    the other is read.
    """
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe() if data else (os.open(os.devnull, os.O_RDONLY), -1)
    actions = [
        (os.POSIX_SPAWN_DUP2, in_r, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, out_w, 2),
    ]
    env = {"PATH": ":".join(TOOL_DIRS), "LC_ALL": "C"}
    if "XTABLES_LOCKFILE" in os.environ:
        env["XTABLES_LOCKFILE"] = os.environ["XTABLES_LOCKFILE"]
    try:
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
    finally:
        for fd in (in_r, out_w):
            os.close(fd)
    if in_w >= 0:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(in_w, view) :]
        except BrokenPipeError:
            pass  # it stopped reading (a parse error): its message says why
        finally:
            os.close(in_w)
    with os.fdopen(out_r, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def save(variant: str, family: int) -> str:
    """`iptables-save -t nat` of that variant; "" when it has no nat table.

    The legacy tool creates the table it is asked for, so it is only asked when the
    kernel lists one.
    """
    if variant == "legacy" and not legacy_nat_exists(family):
        return ""
    code, text = run([tool(variant, family, "save"), "-t", "nat"])
    if code != 0:
        raise CniError(
            KERNEL_FAILURE, f"cannot read the IPv{family} nat table (iptables-{variant})", text
        )
    return text


def listing(variant: str, family: int, chains: tuple[str, ...]) -> str:
    """`iptables -t nat -S CHAIN` of each chain (those that exist), for NatTable.

    DEL and CHECK look at two chains only: iptables-nft translates just those (5 and
    13 ms at 1,000 attachments where iptables-nft-save of the table takes 50 ms).
    """
    if variant == "legacy" and not legacy_nat_exists(family):
        return ""
    out = []
    exe = tool(variant, family, "save").removesuffix("-save")
    for chain in chains:
        code, text = _waiting([exe], ["-t", "nat", "-S", chain])
        if code == 0:
            out.append(text)
        # (iptables-nft 1.8.9 calls a chain that does not exist "incompatible")
        elif "No chain" not in text and "incompatible" not in text:
            raise CniError(KERNEL_FAILURE, f"cannot list {chain} (iptables-{variant})", text)
    return "\n".join(out)


def _waiting(head: list[str], tail: list[str], data: bytes = b"") -> tuple[int, str]:
    """run() of `head -w N tail`: the tool waits up to our lock timeout for the xtables
    lock, like every other iptables user; error 11 when it stayed taken."""
    wait = str(max(1, int(lock_timeout())))
    code, out = run([*head, "-w", wait, *tail], data)
    if code != 0 and "xtables lock" in out:
        lock = os.environ.get("XTABLES_LOCKFILE", "/run/xtables.lock")
        raise CniError(
            TRY_AGAIN_LATER,
            f"another iptables user (iptables-restore?) holds {lock}",
            f"waited {wait}s ({LOCK_TIMEOUT_ENV}); try again later",
        )
    return code, out


def legacy_nat_exists(family: int) -> bool:
    names = "/proc/net/ip6_tables_names" if family == 6 else "/proc/net/ip_tables_names"
    try:
        with open(names) as f:
            return "nat" in f.read().split()
    except OSError:
        return False


def restore(variant: str, family: int, lines: list[str]) -> str:
    """Commit `lines` to the nat table in one transaction; "" or the tool's complaint
    (with the text of the line it names: iptables-legacy-restore gives only its number)."""
    text = "*nat\n" + "\n".join(lines) + "\nCOMMIT\n"
    code, out = _waiting([tool(variant, family, "restore"), "--noflush"], [], text.encode())
    if code == 0:
        return ""
    complaint = out.strip() or "failed"
    _, found, rest = complaint.partition("line ")
    number = rest.split(" ", 1)[0].rstrip(":")
    if found and number.isdigit() and 2 <= int(number) <= len(lines) + 1:
        complaint += f" (line {number}: {lines[int(number) - 2]})"
    return complaint


def host_default() -> str:
    """The variant of the host's `iptables` command (Debian/RHEL alternatives).

    Looked up in TOOL_DIRS only, never in PATH: PATH is whatever the runtime had, and an
    entry in it that is relative (or empty: the working directory) or writable by others
    would make root run the `iptables` it names."""
    for d in TOOL_DIRS:
        path = os.path.join(d, "iptables")
        if not os.access(path, os.X_OK):
            continue
        real = os.path.basename(os.path.realpath(path))
        for variant in VARIANTS:
            if variant in real:
                return variant
        _, out = run([path, "-V"])
        return "legacy" if "legacy" in out else "nft"
    return "nft"


def choose_variant(log: Log) -> tuple[str, str]:
    """(variant, its IPv4 nat table as saved) for this call.

    The one whose nat table holds more rules, as kube-proxy's iptables-wrapper decides
    (there the nat table holds most of kube-proxy's rules too); a tie, an empty host
    included, goes to the host's `iptables`. The table read for counting is the one the
    call then works on, so the choice costs one extra read at most.
    """
    forced = os.environ.get(VARIANT_ENV, "")
    if forced in VARIANTS:
        return forced, save(forced, 4)
    texts: dict[str, str] = {}
    for variant in VARIANTS:
        try:
            texts[variant] = save(variant, 4)
        except CniError:
            texts[variant] = ""  # not installed, or not usable here: nothing of ours there
    count = {v: texts[v].count("\n-A ") for v in VARIANTS}
    if count["nft"] != count["legacy"]:
        chosen = "nft" if count["nft"] > count["legacy"] else "legacy"
    else:
        chosen = host_default()
    if count["nft"] and count["legacy"]:
        log.warning(
            f"both iptables variants have nat rules (nft {count['nft']}, legacy "
            f"{count['legacy']}): using iptables-{chosen}"
        )
    return chosen, texts[chosen] or save(chosen, 4)


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

    @property
    def old_owner(self) -> str:
        """The owning attachment's tag in a jump of our former naming, else ""."""
        if not self.comment.startswith(OLD_COMMENT_PREFIX):
            return ""
        return self.comment[len(OLD_COMMENT_PREFIX) :].split(" ", 1)[0]

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
            if fw.host_ip and o.host_ip is None and o.protocol == fw.protocol
            and o.host_port <= last and fw.host_port <= o.host_port + o.count - 1
        ]  # fmt: skip
        out.insert(shadows[0] if shadows else len(out), fw)
    return out


def condition_words(conditions: Conditions) -> Words:
    """The conditions as iptables arguments, as written (Go puts them in its jumps)."""
    if conditions.matches and not conditions.iptables_style:
        raise invalid_config(
            f"{conditions.key} are nft expressions, but the backend is iptables",
            'give iptables arguments (e.g. ["-s", "10.0.0.0/8"]) or use "backend": "nftables"',
        )
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


def commit(variant: str, family: int, lines: list[str], what: str) -> None:
    """restore(), failing the call when the tool refuses (no lines: nothing is run)."""
    if not lines:
        return
    complaint = restore(variant, family, lines)
    if complaint:
        raise CniError(KERNEL_FAILURE, f"iptables-{variant}-restore refused to {what}", complaint)


def delete_chains(variant: str, family: int, chains: tuple[str, ...]) -> UdpTargets:
    """Delete `chains` and the jumps to them from CNI-HOSTPORT-DNAT, those there (the
    caller holds LOCK); their UDP mappings."""
    table = NatTable(listing(variant, family, (*chains, TOP)))
    lines: list[str] = []
    udp: UdpTargets = []
    for chain in chains:
        more, found = removal(table, chain, family)
        lines += more
        udp += found
    commit(variant, family, lines, f"delete the IPv{family} port mappings ({', '.join(chains)})")
    return udp


def recorded_owner(sd: AttachmentStore, network: str, container_id: str, chain: str) -> str:
    """'network/container/ifname' of our attachment whose record names `chain`, or ""."""
    for entry in sd.entries(network).values():
        if entry.backend != NAME or entry.container_id != container_id:
            continue
        if any(isinstance(o, list) and len(o) > 1 and o[1] == chain for o in entry.objects):
            return f"{entry.network}/{entry.container_id}/{entry.ifname}"
    return ""


def _owner(sd: AttachmentStore, j: Jump) -> str:
    """Who owns the chain `j` jumps to, for a conflict's message."""
    if j.old_owner:
        return state.owner_name(sd, j.comment.removeprefix(OLD_COMMENT_PREFIX))
    go = parse_go_comment(j.comment)
    if go is None:
        return f"of chain {j.target}"
    return recorded_owner(sd, go[0], go[1], j.target) or f"{go[0]}/{go[1]}"


def _taken(rule: Jump, fp: FamilyPlan) -> Forward | None:
    """The plan's forward whose host ports the DNAT `rule` maps already, if any."""
    if rule.target != "DNAT" or rule.dports is None:
        return None
    first, last_taken = rule.dports
    for fw in fp.forwards:
        same = rule.protocol == fw.protocol and rule.host_ip == fw.host_ip
        if same and first <= fw.host_port + fw.count - 1 and fw.host_port <= last_taken:
            return fw
    return None


def conflicts(table: NatTable, fp: FamilyPlan, chain: str, sd: AttachmentStore) -> None:
    """A host port of the plan that another chain in CNI-HOSTPORT-DNAT DNATs already is
    error 101. Go's jumps name no address: the DNAT rules of the chains do."""
    seen = {chain}
    for j in table.jumps():
        if j.target in seen:
            continue
        seen.add(j.target)
        for raw in table.lines.get(j.target, []):
            fw = _taken(Jump(raw), fp)
            if fw is not None:
                where = fw.describe(fp.family)
                raise CniError(
                    CONFLICT,
                    f"host port {where} is already mapped by attachment {_owner(sd, j)}",
                    "remove that mapping first (or use another host port); nothing was changed",
                )


def installation(table: NatTable, fp: FamilyPlan, plan: Plan, name: str) -> list[str]:
    """Lines replacing this attachment's rules of one family with the plan's, in chain
    `name`: Go's rules, in Go's order of creation."""
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
    if any(fw.host_ip for fw in fp.forwards):
        # Go appends every jump; an attachment with a specific host address goes first
        # so that its address wins over another attachment's wildcard on the same port.
        lines += [line("-I", f"{TOP} {i}", words) for i, words in enumerate(entries, 1)]
    else:
        lines += [line("-A", TOP, words) for words in entries]
    return lines


# ---------------------------------------------------------------------------- the backend

Where = list[tuple[int, str, str]]  # (family, chain, variant) of a record's objects


class XtablesBackend:
    name = NAME

    def __init__(self, sd: AttachmentStore, log: Log) -> None:
        self.sd = sd
        self.log = log
        self._chosen: tuple[str, str] | None = None

    def owns(self, recorded: state.Recorded | None) -> bool:
        return recorded is not None and recorded.backend == NAME

    def _variant(self) -> str:
        """The variant of this call, decided once; its IPv4 table is kept for the first
        read (call under the lock when it is to be written)."""
        if self._chosen is None:
            self._chosen = choose_variant(self.log)
        return self._chosen[0]

    def _table(self, variant: str, family: int) -> NatTable:
        if self._chosen and self._chosen[0] == variant and family == 4 and self._chosen[1]:
            text, self._chosen = self._chosen[1], (variant, "")
            return NatTable(text)
        return NatTable(save(variant, family))

    def _recorded(self, att: Attachment) -> Where | None:
        """(family, chain, variant) of what a previous ADD recorded, or None."""
        recorded = self.sd.load(att)
        if recorded is None or recorded.backend != NAME:
            return None
        out = []
        for obj in recorded.objects:
            if isinstance(obj, list) and obj and obj[0] in (4, 6):
                # records of our former naming hold its chain name, which DEL then uses
                chain = obj[1] if len(obj) > 1 and isinstance(obj[1], str) else ""
                if not chain.startswith(CHAIN_PREFIX) or len(chain) > 28:
                    chain = old_chain_name(att)
                # no variant: written by the libiptc backend, which wrote the legacy tables
                variant = obj[2] if len(obj) > 2 and obj[2] in VARIANTS else "legacy"
                out.append((int(obj[0]), chain, str(variant)))
        return out

    def _name(self, att: Attachment, previous: Where, tables: dict[int, NatTable]) -> str:
        """Go's name, unless another attachment (ours or Go's) of this container and
        network has it: then second_chain_name. A repeated ADD keeps its name."""
        go, second = chain_name(att), second_chain_name(att)
        names = {chain for _, chain, _ in previous}
        if go in names or second in names:
            return go if go in names else second
        return second if any(go in t.chains for t in tables.values()) else go

    # -- verbs --------------------------------------------------------------------------

    def add(self, plan: Plan) -> None:
        att = plan.attachment
        for fp in plan.families:
            condition_words(fp.conditions)  # a config iptables cannot express changes nothing
        with self.sd.lock(LOCK):
            variant = self._variant()
            previous = self._recorded(att) or []
            tables = {fp.family: self._table(variant, fp.family) for fp in plan.families}
            name = self._name(att, previous, tables)
            owner = (att.network, att.container_id, att.ifname, NAME)
            objects = [[fp.family, name, variant] for fp in plan.families]
            self.sd.save(att, state.Recorded(*owner, objects + [list(p) for p in previous]))
            for family, chain, old in previous:
                # a repeated ADD after the host changed variant, or of an attachment
                # added under our former naming
                if (chain, old) != (name, variant):
                    delete_chains(old, family, (chain,))
                    tables.clear()  # read again: they held that chain
            done: list[int] = []
            try:
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
            except CniError:
                for family in done:
                    delete_chains(variant, family, (name,))
                self.sd.forget(att)
                raise
            self.sd.save(att, state.Recorded(*owner, objects))

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
            conflicts(table, fp, name, self.sd)
            if fp.forwards:
                changes.append((fp.family, installation(table, fp, plan, name)))
            else:
                changes.append((fp.family, removal(table, name, fp.family)[0]))
        for family, lines in changes:
            what = f"install the IPv{family} port mappings of {plan.attachment}"
            commit(variant, family, lines, what)
            done.append(family)

    def delete(self, att: Attachment, plan: Plan | None) -> UdpTargets:
        """The recorded chains. Without a record: the names only this attachment can
        have (Go's name is go_takeover.release's: a sibling attachment may own it)."""
        targets: UdpTargets = []
        with self.sd.lock(LOCK):
            where = self._recorded(att)
            if where is None:  # usually a repeated DEL: cheap looks, no tool run
                from portmap.probe import may_have

                own = (second_chain_name(att), old_chain_name(att))
                where = [(f, c, v) for v in VARIANTS for f in (4, 6) for c in own]
                where = [(f, c, v) for f, c, v in where if may_have(v, f, c)]
            places = sorted({(variant, family) for family, _, variant in where})
            for variant, family in places:
                chains = tuple(dict.fromkeys(c for f, c, v in where if (v, f) == (variant, family)))
                targets += delete_chains(variant, family, chains)
            self.sd.forget(att)
        return targets

    def check(self, plan: Plan) -> list[str]:
        for fp in plan.families:
            condition_words(fp.conditions)
        recorded = {f: (c, v) for f, c, v in self._recorded(plan.attachment) or []}
        go = chain_name(plan.attachment)
        mark_chain = plan.external_mark_chain or SETMARK
        problems: list[str] = []
        for fp in plan.families:
            if not fp.forwards:
                continue
            # no record: a pod the Go portmap set up has Go's name
            name, variant = recorded.get(fp.family) or (go, self._variant())
            table = NatTable(listing(variant, fp.family, (name, TOP)))
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
            complaint = restore(variant, fp.family, [line("-C", TOP, w) for w in entries])
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

    def gc(self, network: str, valid: set[AttachmentId], before: Stamps) -> UdpTargets:
        """Both variants, both families (an attachment may have been added before the host
        switched), wherever CNI-HOSTPORT-DNAT may be: the jumps of `network` in Go's
        format (ours and the Go portmap's alike) whose container is neither valid nor in
        an ADD in flight, those of our former format whose attachment is stale; then
        their chains, unless another rule still jumps there."""
        from portmap.probe import may_have

        targets: UdpTargets = []
        with self.sd.lock(LOCK):
            stale_records, in_flight = self.sd.sweep(network, valid, before)
            for recorded in stale_records:
                if recorded.backend == NAME:
                    self.sd.forget(recorded)
            alive = [Attachment(network, a.container_id, a.ifname) for a in [*valid, *in_flight]]
            keep_tags = {a.tag for a in alive}
            keep = {go_chain_name(network, a.container_id) for a in alive}
            keep |= {second_chain_name(a) for a in alive}
            prefix = network_tag(network) + "-"

            def stale(j: Jump) -> bool:
                if not j.target.startswith(CHAIN_PREFIX):
                    return False
                tag = j.old_owner
                if tag:
                    return tag.startswith(prefix) and tag not in keep_tags
                go = parse_go_comment(j.comment)
                return go is not None and go[0] == network and j.target not in keep

            for variant in VARIANTS:
                for family in (4, 6):
                    if may_have(variant, family, TOP):
                        targets += self._gc_family(variant, family, stale)
        return targets

    def _gc_family(self, variant: str, family: int, stale: Callable[[Jump], bool]) -> UdpTargets:
        try:
            top = listing(variant, family, (TOP,))
        except CniError as e:
            if e.code != STATUS_UNAVAILABLE:
                raise
            return []  # that variant's tools are not installed: nothing to remove with
        doomed = [j for j in NatTable(top).jumps() if stale(j)]
        if not doomed:
            return []
        chains = tuple(sorted({j.target for j in doomed}))
        table = NatTable(top + "\n" + listing(variant, family, chains))
        lines, udp = sweep(table, family, stale)
        commit(variant, family, lines, f"delete stale IPv{family} port mappings")
        self.log.info(f"GC removed iptables-{variant} IPv{family} chains {', '.join(chains)}")
        return udp

    def status(self) -> None:
        """The tools of the variant an ADD would use are there. Polled often (containerd
        2.1+ on every status poll): no table is read, the host's `iptables` decides."""
        forced = os.environ.get(VARIANT_ENV, "")
        variant = forced if forced in VARIANTS else host_default()
        for family in (4, 6):
            for kind in ("save", "restore"):
                tool(variant, family, kind)

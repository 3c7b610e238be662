"""The nftables backend: every mapping is an element of a set or map in our own table, so
the cost does not grow with the mappings. The table's layout, lanes, ownership and the
libnftables traps worked around: docs/portmap.md#nftables-backend-default.
"""

from __future__ import annotations

from itertools import pairwise

from common.digest import sha256_hex
from common.errors import CONFLICT, KERNEL_FAILURE, STATUS_UNAVAILABLE, CniError
from common.identity import network_tag
from common.values import OrderedValue, Value
from portmap import state
from portmap.config import (
    ANY_ADDRESS,
    PROTOCOL_NAMES,
    Conditions,
    host_ports,
    owner_comment,
)
from portmap.plan import MASQ_ALL, MASQ_NONE, MASQ_SUBNET, FamilyPlan, Plan, UdpTargets

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from common.attachment import Change
    from common.identity import Attachment
    from common.log import Log
    from common.store import Stamps
    from portmap.localnet import Rider
    from portmap.ports import NftKernel
    from portmap.state import Store

NAME = "nftables"
T = "inet cni_meta_portmap"
IPX = {4: "ip", 6: "ip6"}
FULL_PREFIX = {4: 32, 6: 128}
LOCK = "nftables.lock"
# libnftables 1.0.6 crashes (SIGSEGV) on a `get element` of a few hundred keys: ask in
# small batches.
GET_CHUNK = 50
# Each attachment's ownership proof: one element whose key is derived from the attachment
# alone. nft deletes an element by its key whatever its comment says, and a transaction
# fails as a whole when one of its deletions finds nothing; so a DEL that deletes this
# element together with the keys it recorded removes them only while they are still the
# ones it put there. A firewall reload (`nft flush ruleset`) takes the proof away with
# them: another attachment may then hold those keys, and the DEL reads before it deletes.
# 128 bits need nft's widest plain type; it is spelled as an IPv6 address.
OWNERS = "owners"
OWNERS_SET = f"add set {T} {OWNERS} {{ type ipv6_addr; }}"


# ---------------------------------------------------------------------------- pure rendering


def render_conditions(conditions: Conditions) -> tuple[str, ...]:
    """The conditions as nft expressions (parse refused those nft cannot express)."""
    return tuple(match.nft for match in conditions.matches)


class Lane(Value):
    """The maps and rules shared by attachments with the same conditions (per family)."""

    family: int
    conditions: tuple[str, ...]

    @property
    def id(self) -> int:
        raw = "\0".join((str(self.family), *self.conditions)).encode()
        return int(sha256_hex(raw)[:8], 16)

    @property
    def suffix(self) -> str:
        return f"_{self.id:08x}" if self.conditions else ""

    @property
    def hostip_map(self) -> str:
        return f"hostip{self.family}{self.suffix}"

    @property
    def any_map(self) -> str:
        return f"any{self.family}{self.suffix}"

    def maps_text(self) -> list[str]:
        addr = f"ipv{self.family}_addr"
        return [
            f"add map {T} {self.hostip_map} {{ type {addr} . inet_proto . inet_service : "
            f"{addr} . inet_service; }}",
            f"add map {T} {self.any_map} {{ type inet_proto . inet_service : "
            f"{addr} . inet_service; }}",
        ]

    def hostip_rule(self) -> str:
        ipx = IPX[self.family]
        return (
            f"{' '.join(self.conditions)} dnat {ipx} to "
            f"{ipx} daddr . meta l4proto . th dport map @{self.hostip_map}"
        ).strip()

    def any_rule(self) -> str:
        ipx = IPX[self.family]
        return (
            f"{' '.join(self.conditions)} meta nfproto ipv{self.family} dnat {ipx} to "
            f"meta l4proto . th dport map @{self.any_map}"
        ).strip()

    def create_text(self) -> list[str]:
        """A condition lane: its maps, its rules (specific first, wildcard last)."""
        return [
            *self.maps_text(),
            f"insert rule {T} hostports {self.hostip_rule()}",
            f"add rule {T} hostports {self.any_rule()}",
            f"add element {T} lanes {{ {self.id} }}",
        ]


DEFAULT_LANES = (Lane(4, ()), Lane(6, ()))
CHAINS = {
    "hostports": "",
    "masq-all": "",
    "prerouting": " { type nat hook prerouting priority dstnat; policy accept; }",
    # `priority dstnat` is refused on the output hook
    "output": " { type nat hook output priority -100; policy accept; }",
    "postrouting": " { type nat hook postrouting priority srcnat; policy accept; }",
}


def skeleton_text() -> list[str]:
    """The table with its fixed sets, chains and the default lanes. Created once, atomically."""
    lines = [
        f'add table {T} {{ comment "CNI portmap (cni-meta-plugins); managed, do not edit"; }}',
        f"add set {T} lanes {{ type mark; }}",
        OWNERS_SET,
    ]
    for f in (4, 6):
        addr = f"ipv{f}_addr"
        lines += [
            f"add set {T} claims{f} {{ type {addr} . inet_proto . inet_service; }}",
            f"add map {T} masq{f} {{ type {addr} : verdict; }}",
            f"add set {T} hairpin{f} {{ type {addr} . {addr}; }}",
        ]
    for lane in DEFAULT_LANES:
        lines += lane.maps_text()
    return [
        *lines,
        *(f"add chain {T} {name}{spec}" for name, spec in CHAINS.items()),
        *(f"flush chain {T} {name}" for name in CHAINS),
        *(f"add rule {T} hostports {lane.hostip_rule()}" for lane in DEFAULT_LANES),
        *(f"add rule {T} hostports {lane.any_rule()}" for lane in DEFAULT_LANES),
        f"add rule {T} masq-all masquerade",
        f"add rule {T} prerouting fib daddr type local jump hostports",
        f"add rule {T} output fib daddr type local jump hostports",
        f"add rule {T} postrouting ct status dnat ip daddr vmap @masq4",
        f"add rule {T} postrouting ct status dnat ip6 daddr vmap @masq6",
        f"add element {T} lanes {{ {', '.join(str(lane.id) for lane in DEFAULT_LANES)} }}",
    ]


def prefix_mask(family: int, prefix: int) -> str:
    import ipaddress

    return ipaddress.ip_network(f"{ANY_ADDRESS[family]}/{prefix}").netmask.compressed


def masq_chain(family: int, prefix: int) -> str:
    return f"masq{family}-p{prefix}"


def masq_chain_text(family: int, prefix: int) -> list[str]:
    """Idempotent: (re)written in full by every careful ADD that needs it (the fast one
    relies on it being there: its `goto` elements fail without it). Each rule is written
    as `list chain` prints it back, so that CHECK can compare the two."""
    chain = masq_chain(family, prefix)
    ipx = IPX[family]
    # nft drops a mask of all ones from the rule it stores
    saddr = f"{ipx} saddr"
    if prefix != FULL_PREFIX[family]:
        saddr += f" & {prefix_mask(family, prefix)}"
    lines = [f"add chain {T} {chain}", f"flush chain {T} {chain}"]
    if family == 4:
        # Connections from 127.0.0.0/8 (localhost:hostPort via route_localnet) only work
        # masqueraded: the container cannot answer a loopback address.
        lines.append(f"add rule {T} {chain} ip saddr 127.0.0.0/8 masquerade")
    lines.append(f"add rule {T} {chain} {saddr} . {ipx} daddr @hairpin{family} masquerade")
    return lines


MASQ_ALL_TEXT = [
    f"add chain {T} masq-all",
    f"flush chain {T} masq-all",
    f"add rule {T} masq-all masquerade",
]


def chain_rules(chain: str, lines: list[str]) -> list[str]:
    """The rules that `lines` (a chain's text above) write into `chain`."""
    head = f"add rule {T} {chain} "
    return [line.removeprefix(head) for line in lines if line.startswith(head)]


def listed_rules(chain: str, listing: str) -> list[str]:
    """The rules of `chain` in nft's text output of `list chain`, whitespace normalised."""
    lines = [" ".join(line.split()) for line in listing.splitlines()]
    start = f"chain {chain} {{"
    if start not in lines:
        return []
    rules = []
    for line in lines[lines.index(start) + 1 :]:
        if line == "}":
            break
        if line:
            rules.append(line)
    return rules


class Element(OrderedValue):
    """One set/map element; identity is (set, key), `data` is what a map maps it to."""

    set: str
    key: str
    data: str = ""

    def _fields(self) -> tuple[object, ...]:
        return (self.set, self.key)

    @property
    def is_claim(self) -> bool:
        return self.set.startswith("claims")

    def text(self, comment: str) -> str:
        return f'{self.key} comment "{comment}"' + (f" : {self.data}" if self.data else "")


def owner_element(att: Attachment) -> Element:
    """The attachment's key in the owners set. Every group has its top bit set, so that
    nft prints the address back exactly as written (no `::` shortening)."""
    digest = sha256_hex(f"owner\0{att.tag}".encode())
    return Element(
        OWNERS, ":".join(f"{int(digest[i : i + 4], 16) | 0x8000:04x}" for i in range(0, 32, 4))
    )


def proves_ownership(recorded: list[Element], att: Attachment) -> bool:
    """Whether deleting `recorded` blindly is safe: it holds the attachment's proof (or
    nothing), see OWNERS."""
    return not recorded or owner_element(att) in recorded


def family_elements(fp: FamilyPlan) -> list[Element]:
    f = fp.family
    lane = Lane(f, render_conditions(fp.conditions))
    out: list[Element] = []
    for fw in fp.forwards:
        for hp, cp in fw.ports():
            target = f"{fp.container_ip} . {cp}"
            claim = f"{fw.host_ip or ANY_ADDRESS[f]} . {fw.protocol} . {hp}"
            out.append(Element(f"claims{f}", claim))
            if fw.host_ip:
                out.append(Element(lane.hostip_map, f"{fw.host_ip} . {fw.protocol} . {hp}", target))
            else:
                out.append(Element(lane.any_map, f"{fw.protocol} . {hp}", target))
    if fp.forwards and fp.masquerade != MASQ_NONE:
        chain = "masq-all" if fp.masquerade == MASQ_ALL else masq_chain(f, fp.prefix_len)
        out.append(Element(f"masq{f}", fp.container_ip, f"goto {chain}"))
        if fp.masquerade == MASQ_SUBNET:
            out.append(Element(f"hairpin{f}", f"{fp.subnet} . {fp.container_ip}"))
    return out


def plan_elements(plan: Plan) -> list[Element]:
    """The attachment's elements, its ownership proof (OWNERS) among them when it has any."""
    out = forwarding_elements(plan)
    return [owner_element(plan.attachment), *out] if out else out


def forwarding_elements(plan: Plan) -> list[Element]:
    return [e for fp in plan.families for e in family_elements(fp)]


def plan_lanes(plan: Plan) -> list[Lane]:
    return sorted(
        {Lane(fp.family, render_conditions(fp.conditions)) for fp in plan.families if fp.forwards},
        key=lambda lane: (lane.family, lane.id),
    )


def plan_masq_chains(plan: Plan) -> list[tuple[int, int]]:
    subnet = [fp for fp in plan.families if fp.forwards and fp.masquerade == MASQ_SUBNET]
    return sorted({(fp.family, fp.prefix_len) for fp in subnet})


def plan_masq_texts(plan: Plan) -> dict[str, list[str]]:
    """Each masquerade chain the plan's `goto` elements lead to, with its text."""
    out = {masq_chain(*fp): masq_chain_text(*fp) for fp in plan_masq_chains(plan)}
    if any(fp.forwards and fp.masquerade == MASQ_ALL for fp in plan.families):
        out["masq-all"] = MASQ_ALL_TEXT
    return out


def _grouped(elements: Iterable[Element]) -> dict[str, list[Element]]:
    out: dict[str, list[Element]] = {}
    for e in elements:
        out.setdefault(e.set, []).append(e)
    return out


def add_text(elements: Iterable[Element], comment: str) -> list[str]:
    lines = []
    for name, group in _grouped(elements).items():
        verb = "create" if name.startswith("claims") or name == OWNERS else "add"
        body = ", ".join(e.text(comment) for e in group)
        lines.append(f"{verb} element {T} {name} {{ {body} }}")
    return lines


def delete_text(elements: Iterable[Element]) -> list[str]:
    return [
        f"delete element {T} {name} {{ {', '.join(e.key for e in group)} }}"
        for name, group in _grouped(elements).items()
    ]


def udp_targets(elements: Iterable[Element]) -> UdpTargets:
    """(family, host address or None, port) of the UDP claims among `elements`."""
    out = []
    for e in elements:
        if not e.is_claim:
            continue
        addr, proto, port = (p.strip() for p in e.key.split(" . "))
        if proto != "udp":
            continue
        family = int(e.set[-1])
        out.append((family, None if addr == ANY_ADDRESS[family] else addr, int(port)))
    return out


# ---------------------------------------------------------------------------- parsing output

_PROTO_NUMBERS = {str(number): name for number, name in PROTOCOL_NAMES.items()}


def _normal_key(key: str) -> str:
    """Keys as we write them: nft prints a protocol (always second to last: `... proto .
    port`) as a number where /etc/protocols does not name it."""
    parts = [p.strip() for p in key.split(" . ")]
    if len(parts) >= 2:
        parts[-2] = _PROTO_NUMBERS.get(parts[-2], parts[-2])
    return " . ".join(parts)


def parse_elements(text: str) -> list[tuple[Element, str]]:
    """Every element, with its comment, in nft's text output of `get element`, `list set`
    or `list table`: `set|map NAME { ... elements = { KEY [comment "TEXT"] [: DATA], ... }`.
    Neither our keys nor our comments contain a comma, a brace, a quote or " : "."""
    out = []
    blocks = text.split("elements = {")
    for head, block in pairwise(blocks):
        name = head[: head.rindex("{")].split()[-1]
        for item in block[: block.find("}")].split(","):
            key, _, data = " ".join(item.split()).partition(" : ")
            key, _, comment = key.partition(' comment "')
            if key:
                out.append((Element(name, _normal_key(key), data), comment.removesuffix('"')))
    return out


def tag_of(comment: str) -> str:
    return comment.split(" ", 1)[0]


# ---------------------------------------------------------------------------- the kernel side


class Nft:
    """One libnftables context of the port, in the netns where it was created (the
    plugin's own), and the questions portmap asks through it."""

    def __init__(self, port: NftKernel) -> None:
        try:
            self.context = port.context()
        except OSError as e:
            raise CniError(STATUS_UNAVAILABLE, "libnftables cannot be loaded", str(e)) from None

    def run(self, text: str) -> tuple[int, str, str]:
        """(return code, output, error text) of one nft command batch."""
        return self.context.run(text)

    def must(self, lines: list[str], what: str) -> None:
        rc, _, err = self.run("\n".join(lines))
        if rc != 0:
            raise CniError(KERNEL_FAILURE, f"nftables refused to {what}", first_error(err))

    def get(self, elements: list[Element]) -> dict[Element, tuple[str, str]]:
        """The live (comment, data) of those of `elements` that exist."""
        found: dict[Element, tuple[str, str]] = {}
        for name, group in _grouped(elements).items():
            for i in range(0, len(group), GET_CHUNK):
                chunk = group[i : i + GET_CHUNK]
                rc, out, _ = self.run(
                    f"get element {T} {name} {{ {', '.join(e.key for e in chunk)} }}"
                )
                if rc == 0:
                    live = {e.key: (comment, e.data) for e, comment in parse_elements(out)}
                    found.update((e, live[e.key]) for e in chunk if e.key in live)
                elif len(chunk) > 1:  # one missing key fails the whole get: ask one by one
                    for e in chunk:
                        found.update(self.get([e]))
        return found

    def has_lane(self, lane: Lane) -> bool:
        return self.run(f"get element {T} lanes {{ {lane.id} }}")[0] == 0

    def table_exists(self) -> bool:
        rc, out, _ = self.run("list tables inet")
        return rc == 0 and f"table {T}\n" in out + "\n"

    def listing(self) -> list[tuple[Element, str]]:
        rc, out, err = self.run(f"list table {T}")
        if rc != 0:
            if "No such file or directory" in err:
                return []
            raise CniError(KERNEL_FAILURE, f"cannot list nft table {T}", first_error(err))
        return [(e, comment) for e, comment in parse_elements(out) if is_plain(e)]


def first_error(err: str) -> str:
    """The first two lines of nft's complaint, for an error's details."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return " | ".join(lines[:2])[:500]


def _owned(nft: Nft, candidates: list[Element], tag: str) -> list[Element]:
    live = nft.get(candidates)
    return sorted(e for e, (comment, _) in live.items() if tag_of(comment) == tag)


def is_plain(e: Element) -> bool:
    return state.plain(e.set, e.key)


def recorded_elements(recorded: state.Recorded | None) -> list[Element] | None:
    """What a record of this backend lists (the store kept the plain elements only)."""
    if not isinstance(recorded, state.NftRecord):
        return None
    return [Element(name, key) for name, key in recorded.elements]


def record_of(att: Attachment, elements: Iterable[Element]) -> state.NftRecord:
    """The attachment's record saying that `elements` are its own."""
    owned = tuple(sorted({(e.set, e.key) for e in elements}))
    return state.NftRecord(att.network, att.container_id, att.ifname, elements=owned)


class NftBackend:
    name = NAME

    def __init__(self, sd: Store, log: Log, port: NftKernel) -> None:
        from common.attachment import Engine

        self.sd = sd
        self.log = log
        self.port = port
        self.engine = Engine(sd, log, LOCK)

    def owns(self, recorded: state.Recorded | None) -> bool:
        return isinstance(recorded, state.NftRecord)

    def may_hold(self) -> bool:
        """False: an ADD records its elements before it writes them (the engine's intent),
        so the records name every attachment that may have some."""
        return False

    # -- ADD ---------------------------------------------------------------------------

    def add(self, plan: Plan) -> None:
        """Every transaction is all or nothing: a failed one leaves the kernel as it was,
        so a failed ADD needs no undo, only the record of what is still ours."""
        att = plan.attachment
        wanted = plan_elements(plan)
        with self.engine.add(att) as change:
            nft = Nft(self.port)
            if not self._fast_add(nft, change, plan, wanted):
                self._careful_add(nft, change, plan, wanted)

    def _fast_add(
        self, nft: Nft, change: Change[state.Recorded], plan: Plan, wanted: list[Element]
    ) -> bool:
        """Write without reading (whether it did). libnftables fills its cache with every
        element of the table on the first read of a process (time linear in the
        mappings), but not for a write. The record says what we own, and deleting our
        proof of ownership with it (OWNERS) makes sure it still is; if anything is off
        (no table yet, a new lane, an element gone or another's, a conflict), the write
        fails as a whole and the careful path reads and repairs. The masq chains are left
        out: a `goto` element fails the same way while its chain is missing, and
        rewriting one that is there (flush and add rules) would make the kernel free the
        old rules after an RCU grace period, which the process waits for when its netlink
        socket closes."""
        att, recorded = plan.attachment, change.previous
        previous = recorded_elements(recorded) or []
        if recorded is not None and not recorded.committed:
            return False  # an intent: what it lists may or may not be there
        if not proves_ownership(previous, att):
            return False
        change.intend(record_of(att, [*previous, *wanted]))
        lines = [*delete_text(previous), *add_text(wanted, owner_comment(att))]
        if nft.run("\n".join(lines))[0] != 0:
            return False
        change.confirm(record_of(att, wanted))
        return True

    def _careful_add(
        self, nft: Nft, change: Change[state.Recorded], plan: Plan, wanted: list[Element]
    ) -> None:
        """Read what of the record is still ours, create what the table lacks, rewrite the
        masq chains, write. Our own leftovers that the record did not know of (it was
        lost) are removed too and the write tried once more; anybody else's: a conflict,
        named."""
        att = plan.attachment
        mine = _owned(nft, recorded_elements(change.previous) or [], att.tag)
        change.found(record_of(att, mine) if mine else None)
        setup = self._missing_setup(nft, plan)
        masq = [line for text in plan_masq_texts(plan).values() for line in text]
        change.intend(record_of(att, [*mine, *wanted]))
        for _attempt in range(2):
            lines = [*setup, *delete_text(mine), *masq, *add_text(wanted, owner_comment(att))]
            rc, _, err = nft.run("\n".join(lines))
            if rc == 0:
                change.confirm(record_of(att, wanted))
                return
            stale = self._collisions(nft, wanted, att)
            if not stale:
                break
            mine = sorted(set(mine) | set(stale))
            change.found(record_of(att, mine))
        raise CniError(KERNEL_FAILURE, "nftables refused the port mappings", first_error(err))

    def _missing_setup(self, nft: Nft, plan: Plan) -> list[str]:
        lanes = plan_lanes(plan)
        probe = ", ".join(str(lane.id) for lane in (*DEFAULT_LANES, *lanes))
        if nft.run(f"get element {T} lanes {{ {probe} }}")[0] == 0:
            return []
        lines: list[str] = []
        if not nft.table_exists():
            lines += skeleton_text()
            present = {lane.id for lane in DEFAULT_LANES}
        else:
            present = {lane.id for lane in (*DEFAULT_LANES, *lanes) if nft.has_lane(lane)}
            if not {lane.id for lane in DEFAULT_LANES} <= present:
                raise CniError(
                    KERNEL_FAILURE,
                    f"nft table {T} exists but is not in the shape portmap made it",
                    f"delete it (nft delete table {T}) and re-add the containers",
                )
        for lane in lanes:
            if lane.id not in present:
                lines += lane.create_text()
        return lines

    def _collisions(self, nft: Nft, wanted: list[Element], att: Attachment) -> list[Element]:
        """After a failed transaction: raise CONFLICT naming the owner of what we collided
        with; return our own live elements among `wanted` (leftovers) otherwise."""
        live = nft.get(wanted)
        own = []
        for e in wanted:
            if e not in live:
                continue
            comment, data = live[e]
            if tag_of(comment) == att.tag:
                own.append(e)
                continue
            if e.is_claim:
                addr, proto, port = e.key.split(" . ")
                where = host_ports(addr, int(port), 1, proto)
                raise state.port_taken(where, state.owner_name(self.sd, comment))
            if e.data and data != e.data:
                raise CniError(
                    CONFLICT,
                    f"container address {e.key.split(' . ')[-1]} is already forwarded for "
                    f"attachment {state.owner_name(self.sd, comment)} with different settings "
                    f"({data})",
                    "two live attachments cannot share a container address; nothing was changed",
                )
        return own

    # -- DEL ---------------------------------------------------------------------------

    def delete(self, att: Attachment, plan: Plan | None, rider: Rider | None = None) -> UdpTargets:
        def teardown(recorded: state.Recorded | None) -> UdpTargets:
            nft = Nft(self.port)
            committed = recorded_elements(recorded) if recorded and recorded.committed else None
            if committed and self._fast_delete(nft, att, committed, rider):
                return udp_targets(committed)
            mine = self._own_elements(nft, att, recorded, plan)
            self._careful_delete(nft, att, mine)
            # What the record knew as ours was so until a moment ago, even when it
            # vanished before this DEL saw it: its flows must not outlive it.
            return udp_targets(sorted(set(mine) | set(committed or ())))

        return self.engine.delete(att, teardown)

    def _fast_delete(
        self, nft: Nft, att: Attachment, committed: list[Element], rider: Rider | None
    ) -> bool:
        """Delete without reading (whether it did, see _fast_add): the record says exactly
        what we own, and the transaction fails unless our proof of ownership is there.
        The localhost guard's change rides in it (Registry.releasing), on this path only:
        a guard nft refuses must not fail the DEL."""
        if not proves_ownership(committed, att):
            return False
        return self._delete_owned(nft, att, committed, rider)[0] == 0

    def _own_elements(
        self, nft: Nft, att: Attachment, recorded: state.Recorded | None, plan: Plan | None
    ) -> list[Element]:
        """What the table holds of `att`'s: of what its record lists, else of what the
        DEL's plan would have made, else of the whole table; nothing when the owners set
        says it has nothing (usually the runtime's second DEL: no record, no read)."""
        if not self.owns(recorded) and not self._may_hold(att):
            return []
        candidates = recorded_elements(recorded)
        if candidates is None and plan is not None and not plan.empty:
            candidates = plan_elements(plan)
        if candidates is None:
            return sorted(e for e, c in nft.listing() if tag_of(c) == att.tag)
        return _owned(nft, candidates, att.tag) if candidates else []

    def _careful_delete(self, nft: Nft, att: Attachment, mine: list[Element]) -> None:
        rc, err = self._delete_owned(nft, att, mine)
        if rc != 0 and nft.table_exists():
            # A transaction fails as a whole when one of its objects is gone (someone
            # deleted it meanwhile): once more with what is left of ours.
            rc, err = self._delete_owned(nft, att, _owned(nft, mine, att.tag))
        if rc != 0 and nft.table_exists():
            raise CniError(
                KERNEL_FAILURE, f"nftables refused to delete the port mappings of {att}",
                first_error(err),
            )  # fmt: skip

    def _may_hold(self, att: Attachment) -> bool:
        """Whether the table may hold elements of `att`, asked without reading anybody
        else's: every transaction that adds or deletes an attachment's elements adds or
        deletes its key in the owners set with them (OWNERS), so while that set is there,
        an attachment without its key has nothing in the table. One netlink lookup each,
        whatever the table holds; libnftables' reads would first load every element of
        the table, under the lock every ADD and DEL of the node waits for. A table
        without the owners set (ours always has it: someone deleted it) may hold anything."""
        table, key = T.split()[1], owner_element(att).key
        if self.port.may_have_element(table, OWNERS, bytes.fromhex(key.replace(":", ""))):
            return True
        return not self.port.may_have_element(table, OWNERS)

    def _delete_owned(
        self, nft: Nft, att: Attachment, mine: list[Element], rider: Rider | None = None
    ) -> tuple[int, str]:
        # The last attachment leaves the host as it found it, also when it has nothing
        # in the table (an ADD that failed or was killed before its transaction).
        lines = [f"delete table {T}"] if self._last_owner(nft, att) else delete_text(mine)
        lines += [rider.text] if rider else []
        if not lines:
            return 0, ""
        rc, _, err = nft.run("\n".join(lines))
        if rider:
            rider.done = rc == 0
        return rc, err

    def _last_owner(self, nft: Nft, att: Attachment) -> bool:
        """Whether `att` owns every claim in the table (so the table can go with it).
        Cheap in the common case: other attachments' state files answer 'no' at once."""
        if self.sd.holds_other_than(self.sd.file_of(att)):
            return False
        for family in (4, 6):
            rc, out, _ = nft.run(f"list set {T} claims{family}")
            if rc != 0 or any(tag_of(c) != att.tag for _, c in parse_elements(out)):
                return False
        return True

    # -- CHECK -------------------------------------------------------------------------

    def check(self, plan: Plan) -> list[str]:
        # The ownership proof only keeps DEL cheap; forwarding works without it.
        wanted = forwarding_elements(plan)
        nft = Nft(self.port)
        problems = [
            f"the IPv{lane.family} lookup rules of {T} are missing"
            for lane in plan_lanes(plan)
            if not nft.has_lane(lane)
        ]
        live = nft.get(wanted)
        for e in wanted:
            if e not in live:
                problems.append(
                    f"{e.set} has no element {e.key}" + (f" : {e.data}" if e.data else "")
                )
                continue
            comment, data = live[e]
            if tag_of(comment) != plan.attachment.tag:
                problems.append(f"{e.set} {e.key} belongs to {comment.partition(' ')[2]}")
            elif e.data and data != e.data:
                problems.append(f"{e.set} {e.key} maps to {data}, expected {e.data}")
        # The fast ADD never rewrites a masquerade chain that exists (see add): one
        # flushed or edited by hand shows here, and the next careful ADD rewrites it.
        for chain, text in plan_masq_texts(plan).items():
            rc, out, _ = nft.run(f"list chain {T} {chain}")
            expected = chain_rules(chain, text)
            if rc != 0:
                problems.append(f"chain {chain} of {T} is missing")
            elif (rules := listed_rules(chain, out)) != expected:
                problems.append(
                    f"chain {chain} holds [{'; '.join(rules)}], expected [{'; '.join(expected)}]"
                )
        return problems

    # -- GC / STATUS ---------------------------------------------------------------------

    def gc(self, network: str, valid: set[Attachment], before: Stamps) -> UdpTargets:
        prefix = network_tag(network) + "-"
        # The tags of the stale records the engine forgets: of this network (the sweep
        # picks records by their network), whose elements then go too.
        forgotten: set[str] = set()
        with self.engine.collecting(
            network, valid, lambda record: forgotten.add(record.attachment.tag),
            owns=self.owns, unusable=state.unusable_prefix(self.sd, network), before=before,
        ) as alive:  # fmt: skip
            keep = {a.tag for a in alive}
            owners: dict[str, str] = {}  # tag -> its network, as proven ("": unproven)

            def is_stale(comment: str) -> bool:
                # A tag starting with the network's hash may be another network's (two
                # names can share that hash): only one proven to be of this network goes.
                tag = tag_of(comment)
                if not tag.startswith(prefix) or tag in keep:
                    return False
                if tag not in owners:
                    proven = tag in forgotten
                    owners[tag] = network if proven else state.owner_network(self.sd, comment)
                return owners[tag] == network

            nft = Nft(self.port)
            listing = [(e, c) for e, c in nft.listing() if c]
            doomed = sorted(e for e, c in listing if is_stale(c))
            unproven = sorted(tag for tag, owner in owners.items() if not owner)
            if unproven:
                self.log.warning(
                    f"gc: left the mappings of {', '.join(unproven)}: no record and "
                    "no comment says their network"
                )
            survivors = len(listing) - len(doomed)
            if survivors == 0 and not self.sd.names() and (doomed or nft.table_exists()):
                nft.must([f"delete table {T}"], "delete the empty portmap table")
            elif doomed:
                nft.must(delete_text(doomed), "delete stale port mappings")
            return udp_targets(doomed)

    def status(self) -> None:
        rc, _, err = Nft(self.port).run("list tables")
        if rc != 0:
            raise CniError(STATUS_UNAVAILABLE, "nftables is not usable here", first_error(err))

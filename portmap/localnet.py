"""route_localnet toward the container: which interface may get it, and giving it back.

`127.0.0.1:hostPort` reaches a container only when the interface the host routes the
container through has `net.ipv4.conf.<if>.route_localnet=1` (Linux otherwise drops a
packet from or to 127.0.0.0/8 off the loopback interface as martian). The switch opens
that interface to the node's own localhost: a neighbour on its link can then send to
127.0.0.1 and reach services bound there. So it goes only on an interface that faces
the container, and goes back off when the last attachment that needed it goes.

Which interface (`choose`, pure): the kernel's answer to "route to the container" (an
RTM_GETROUTE, so policy rules and every table count, as for the packets themselves):
a unicast route on a link of the host (no gateway), not the loopback device, and one of
the host-side interfaces prevResult names (what the chain made: bridge, veth), or where
it names none (Calico marks even its host veth as the sandbox's), a bridge or a veth:
never a plain device such as an uplink, the parent of a macvlan container.
Anything else (the address is the host's own, routed via a gateway, unreachable) gets
nothing and a warning: 127.0.0.1:hostPort then does not reach that container.

Giving it back: the attachments that need it on an interface are kept in a directory
of portmap's state, one file per attachment (`<if>@<its record's tag>`, not a record:
no `.json`), and `<if>@switched` when portmap found the switch off and turned it on. When the last
attachment's file goes (DEL, GC, a repeated ADD that no longer needs it), the switch
goes back to what `switched` recorded. Every change of the directory and the sysctls is
made under the directory's lock, whichever backend serves the call.

The guard: while an interface is in the directory, whatever is on its link (a container
with CAP_NET_RAW, which runtimes grant by default) could send to 127.0.0.1 and reach
the node's services bound to localhost. So every interface in the directory is also in
the localhost guard (Kernel.guard_localnet: new, non-DNAT packets to 127.0.0.0/8 that
arrive on it are dropped; 127.0.0.1:hostPort's own packets are DNAT'd or replies). A
change of the directory's interfaces writes the guard whole from them: an interface goes
in before the switch, and leaves only after the switch is back (a DEL's change rides in
the transaction that deletes its mappings), just before its last file goes, so a call
killed in between leaves the file for the retried DEL or GC.
An ADD on an interface the guard already holds (the kernel's answer to one look, not the
directory's word) writes nothing; one the guard lacks (a new interface, a call killed
before its write, a firewall reload that flushed it) writes it whole again, and GC does
so for every interface in the directory.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, suppress

from common.env import plugin_dir
from common.statedir import TMP_SUFFIX, StateDir
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

    from common.log import Log
    from common.result import Result
    from portmap.kernel import Route
    from portmap.plan import Plan
    from portmap.ports import Kernel

RTN_UNICAST = 1
LOOPBACK = "lo"
# what connects containers to the host: a plain device (an uplink, a bond, a VLAN: the
# parent of a macvlan container) also faces other hosts
CONTAINER_LINKS = ("bridge", "veth")
SWITCHED = "switched"  # <if>@switched: portmap turned it on (no tag is spelled so)
LOCK = "lock"
_TAG = frozenset("0123456789abcdef-")
# the names the guard can spell in nft and iptables alike (no quote, no iptables wildcard
# `+`): what the bridge and veth plugins make
_GUARDABLE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.@")


def sysctl_path(ifname: str) -> str:
    return f"/proc/sys/net/ipv4/conf/{ifname}/route_localnet"


def host_interfaces(prev: Result | None) -> set[str]:
    """The host-side interfaces prevResult names (no sandbox): the bridge, a veth."""
    if prev is None:
        return set()
    return {i.name for i in prev.interfaces if i.name and not i.sandbox}


def choose(route: Route | None, host_side: set[str]) -> tuple[str | None, str]:
    """(the interface whose route_localnet may go on, "") or (None, why not)."""
    if route is None:
        return None, "the host has no route to it"
    if route.kind != RTN_UNICAST or route.oif in ("", LOOPBACK):
        return None, "the host routes it to itself (a local address), not to a container"
    if route.gateway:
        return None, f"the host routes it through the gateway {route.gateway} on {route.oif}"
    if host_side and route.oif not in host_side:
        names = ", ".join(sorted(host_side))
        return None, f"the host routes it via {route.oif}, none of the chain's ({names})"
    if not host_side and route.link_kind not in CONTAINER_LINKS:
        article = "an" if route.link_kind[:1] in tuple("aeiou") else "a"
        kind = f"{article} {route.link_kind} device" if route.link_kind else "a plain device"
        return None, f"the host routes it via {route.oif}, {kind}, not a bridge or veth"
    if not _GUARDABLE.issuperset(route.oif):
        return None, f"the name of {route.oif!r} has characters the localhost guard cannot match"
    return route.oif, ""


def needed(plan: Plan) -> str | None:
    """The IPv4 container address whose localhost forwarding needs route_localnet."""
    return next((fp.container_ip for fp in plan.families if fp.forwards and fp.localhost), None)


def interface_for(plan: Plan, prev: Result | None, kernel: Kernel, log: Log) -> str | None:
    """The interface that should have route_localnet for this plan, None for none (said
    in the log when localhost forwarding wanted one)."""
    ip = needed(plan)
    if ip is None:
        return None
    route, host_side = kernel.route_v4(ip), host_interfaces(prev)
    if route is not None and route.oif and not host_side:  # only then does the kind decide
        route = route.replace(link_kind=kernel.link_kind(route.oif))
    ifname, why = choose(route, host_side)
    if ifname is None:
        log.warning(f"route_localnet left alone: 127.0.0.1:hostPort will not reach {ip}: {why}")
    return ifname


class _Directory(StateDir):
    def listing(self) -> list[str]:
        fd = self._open()
        return [] if fd is None else os.listdir(fd)

    def leftovers(self, tag: str = "") -> list[str]:
        """The temporary files of writers killed before their rename (write_json), of
        `tag`'s entries ("": anybody's). Writers hold the directory's lock: under it, a
        temporary file is nobody's work in progress."""
        end = f"@{tag}{TMP_SUFFIX}" if tag else TMP_SUFFIX
        return [name for name in self.listing() if name.endswith(end)]

    def drop_leftovers(self, tag: str = "") -> None:
        fd = self._open()
        for name in self.leftovers(tag):
            with suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)


def tag_of(record: str) -> str:
    """The tag of a record's file name (`<network tag>-<attachment tag>.json`)."""
    return record.removesuffix(".json")


class Rider(Value):
    """The localhost guard's change as nft text, for a transaction of the caller's
    (Registry.releasing); `done` once that transaction committed."""

    text: str
    done: bool = False


class Registry:
    """The attachments that need route_localnet, per interface (see the module doc).
    Attachments are named by their record's tag (tag_of)."""

    def __init__(self, kernel: Kernel, log: Log, directory: str = "") -> None:
        self.dir = _Directory(directory or os.path.join(plugin_dir("portmap"), "route_localnet"))
        self.kernel = kernel
        self.log = log

    def users(self) -> dict[str, set[str]]:
        """interface -> the tags of the attachments that need it there."""
        out: dict[str, set[str]] = {}
        for name in self.dir.listing():
            ifname, sep, tag = name.rpartition("@")
            if sep and ifname and tag and _TAG.issuperset(tag):  # not the lock, a marker, a .tmp
                out.setdefault(ifname, set()).add(tag)
        return out

    def claim(self, tag: str, ifname: str, network: str) -> None:
        """`tag`'s attachment (of `network`) needs route_localnet on `ifname` (and
        nowhere else): guarded, then on when it is not. OSError when the guard cannot be
        made or the sysctl cannot be read or written. The entry names its network in
        full: GC's sweep goes by it, not by the tag's short network hash that two names
        can share."""
        from common.safepath import safe_file_name

        safe_file_name(ifname)  # an interface name never holds "/"; the route said it
        with self.dir.lock(LOCK):
            for other, tags in self.users().items():
                if other != ifname and tag in tags:
                    self._drop(other, tag)  # routed elsewhere since its last ADD
            self.dir.write_json(f"{ifname}@{tag}", {"network": network})
            if not self.kernel.localnet_guarded(ifname):  # before the switch
                self.kernel.guard_localnet(self.users())
            path = sysctl_path(ifname)
            was = self.kernel.read_sysctl(path).strip()
            if was != "1":
                # written first: a kill before the switch leaves a marker that puts back
                # what is there anyway
                if self.dir.read_bytes(f"{ifname}@{SWITCHED}") is None:
                    self.dir.write_json(f"{ifname}@{SWITCHED}", {"was": was})
                self.kernel.write_sysctl(path, "1")

    def release(self, tag: str) -> None:
        """`tag`'s attachment needs route_localnet nowhere: each interface it was the
        last to need it on gets back what portmap found there."""
        with self.releasing(tag):
            pass

    @contextmanager
    def releasing(self, tag: str) -> Iterator[Rider | None]:
        """release(tag) around the caller's deletion of the attachment's mappings, under
        the lock (see _dropping)."""
        if not any(tag in tags for tags in self.users().values()) and not self.dir.leftovers(tag):
            yield None  # the usual DEL: no lock
            return
        with self.dir.lock(LOCK):
            self.dir.drop_leftovers(tag)  # an ADD killed before its entry was whole
            mine = [ifname for ifname, tags in self.users().items() if tag in tags]
            with self._dropping(tag, mine) as rider:
                yield rider

    def sweep(self, network: str, prefix: str, store: StateDir) -> None:
        """GC of `network`: forget its users (tag starting with `prefix`, the network's
        hash, and the entry naming `network` itself) whose record is no longer in
        `store`: a DEL that was killed before it got here. The records are listed under
        the lock: an ADD writes its record before it claims. Then the guard is made
        whole again where it lacks an interface of the directory (a firewall reload)."""
        users = self.users().values()
        ours = any(r.startswith(prefix) for rs in users for r in rs)
        if not ours and not self.dir.leftovers() and self._guarded():
            return
        with self.dir.lock(LOCK):
            self.dir.drop_leftovers()
            alive = {tag_of(name) for name in store.names()}
            for ifname, records in self.users().items():
                for record in sorted(records):
                    stale = record.startswith(prefix) and record not in alive
                    if stale and self._network_of(f"{ifname}@{record}") == network:
                        self._drop(ifname, record)
            if not self._guarded():
                try:
                    self.kernel.guard_localnet(self.users())
                except OSError as e:  # the next ADD on such an interface fails on it
                    self.log.warning(f"localhost guard not restored: {e}")

    def _guarded(self) -> bool:
        """Whether the guard holds every interface of the directory (one look each)."""
        return all(self.kernel.localnet_guarded(ifname) for ifname in self.users())

    def _network_of(self, entry: str) -> str | None:
        from common.jsontext import loads

        raw = self.dir.read_bytes(entry)
        try:
            network = loads(raw).get("network") if raw is not None else None
        except (ValueError, AttributeError):
            return None
        return network if isinstance(network, str) else None

    def _drop(self, ifname: str, tag: str) -> None:
        with self._dropping(tag, [ifname]):
            pass

    @contextmanager
    def _dropping(self, tag: str, ifnames: list[str]) -> Iterator[Rider | None]:
        """Forget `tag` on `ifnames` around the body (the caller's deletion of its
        mappings). Where it was the last, the switch goes back first, so that the guard's
        change can ride in the body's transaction (each nft transaction that deletes
        makes the process wait for an RCU grace period); else it is written after. Those
        entries go last: a call killed in between, or a body that raised, leaves them
        for the retried DEL or GC to finish."""
        last = []
        for ifname in ifnames:
            if self.users().get(ifname, set()) - {tag}:
                self.dir.remove(f"{ifname}@{tag}")
                continue  # another attachment still needs it
            marker = f"{ifname}@{SWITCHED}"
            raw = self.dir.read_bytes(marker)
            if raw is not None:  # else it was on before portmap needed it: left on
                self._put_back(ifname, raw)
                self.dir.remove(marker)
            last.append(ifname)
        rest = [ifname for ifname in self.users() if ifname not in last]
        text = self.kernel.guard_text(rest) if last else ""
        rider = Rider(text) if text else None
        yield rider
        if last and not (rider and rider.done):
            try:  # left over, it only drops what it was made to: not worth a failed DEL
                self.kernel.guard_localnet(rest)
            except OSError as e:
                self.log.warning(f"localhost guard of {', '.join(last)} not removed: {e}")
        for ifname in last:
            self.dir.remove(f"{ifname}@{tag}")

    def _put_back(self, ifname: str, marker: bytes) -> None:
        from common.jsontext import loads

        try:
            was = str(loads(marker).get("was", "0"))
        except (ValueError, AttributeError):
            was = "0"
        was = was if was in ("0", "1") else "0"
        try:
            self.kernel.write_sysctl(sysctl_path(ifname), was)
            self.log.info(f"route_localnet of {ifname} back to {was}: no attachment needs it")
        except OSError as e:  # the interface is gone, and its sysctls with it
            self.log.info(f"route_localnet of {ifname} not put back: {e}")

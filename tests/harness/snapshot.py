"""What a network namespace and some state dirs look like, as text, to compare later.

A snapshot is a dict of named sections, each a canonical text (sorted, counters and other
ever-changing numbers removed), read back with the system tools (nft, ip, tc,
iptables-legacy-save) and /proc, never through the plugins' own code. `diff` names the
sections that changed with the lines added and removed, so a failing leak check says what
leaked.

The same code judges the machine's own namespace at the end of the test session
(tests/conftest.py `host_untouched`) and a lab's namespaces between crash trials.

Reading must not change what is read: legacy iptables tables are dumped only when
/proc/net/ip(6)_tables_names already lists them (asking for a table instantiates it in
that namespace), and nothing here loads a module or writes a file.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from common.netns import entered

Snapshot = dict[str, str]


def is_lock_file(name: str) -> bool:
    """What a state dir may keep for good (see common/statedir.py StateDir.lock): an empty
    lock file per kind of lock (`lock`, `nftables.lock`, ...), never per attachment. Every
    other file is an attachment's and must be gone after its DEL."""
    return name == "lock" or name.endswith(".lock")


# Host-wide sysctls a plugin could plausibly touch; per-interface ones are read for every
# interface of the namespace (see _sysctls).
GLOBAL_SYSCTLS = (
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv4/conf/default/route_localnet",
    "net/ipv4/conf/all/forwarding",
    "net/ipv4/conf/default/forwarding",
    "net/bridge/bridge-nf-call-iptables",
)
PER_INTERFACE_SYSCTLS = ("route_localnet", "forwarding", "accept_redirects", "rp_filter")


def _run(argv: list[str], netns: str | None) -> str:
    cmd = ["ip", "netns", "exec", netns, *argv] if netns else argv
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return f"<{argv[0]} failed ({proc.returncode}): {proc.stderr.strip()[:200]}>"
    return proc.stdout


@contextmanager
def _inside(netns: str | None) -> Iterator[None]:
    if netns is None:
        yield
    else:
        with entered(f"/run/netns/{netns}"):
            yield


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _links(netns: str | None) -> tuple[str, list[str]]:
    """One line per link with what a plugin could change; and the link names."""
    raw = _run(["ip", "-j", "-d", "link", "show"], netns)
    try:
        links: list[dict[str, Any]] = json.loads(raw)
    except ValueError:
        return raw, []
    lines = []
    for link in links:
        info = link.get("linkinfo", {})
        flags = ",".join(sorted(f for f in link.get("flags", []) if f not in ("LOWER_UP",)))
        lines.append(
            " ".join(
                f"{k}={v}"
                for k, v in (
                    ("name", link.get("ifname")),
                    ("kind", info.get("info_kind", "")),
                    ("mtu", link.get("mtu")),
                    # an ifb gets a random MAC each time it is made: not a difference
                    ("mac", "*" if info.get("info_kind") == "ifb" else link.get("address")),
                    ("flags", flags),
                    ("promiscuity", link.get("promiscuity")),
                    ("allmulti", link.get("allmulti")),
                    ("txqlen", link.get("txqlen")),
                    ("master", link.get("master", "")),
                    ("alias", link.get("ifalias", "")),
                )
            )
        )
    return "\n".join(sorted(lines)), sorted(str(x.get("ifname")) for x in links)


_REFCNT = re.compile(r" refcnt \d+")
# tc numbers actions per namespace: a re-made redirect gets the next index
_ACTION_INDEX = re.compile(r" index \d+ ref \d+ bind \d+")


def _qdiscs_and_filters(netns: str | None) -> tuple[str, str]:
    qdiscs = _REFCNT.sub("", _run(["tc", "qdisc", "show"], netns))
    # Filters hang off ingress/clsact qdiscs (and classful roots, which the plugins never
    # make): ask only the devices that have one.
    devs = sorted(set(re.findall(r"^qdisc (?:ingress|clsact) \S+ dev (\S+)", qdiscs, re.M)))
    filters = []
    for dev in devs:
        text = _run(["tc", "filter", "show", "dev", dev, "ingress"], netns)
        filters.append(f"dev {dev} ingress:\n{_ACTION_INDEX.sub('', text).strip()}")
    return "\n".join(sorted(qdiscs.splitlines())), "\n".join(filters)


_COUNTERS = re.compile(r"\[\d+:\d+\]")


def _iptables_legacy(netns: str | None) -> str:
    """Legacy xtables (what libiptc writes) of both families, only tables that exist."""
    out = []
    for family, names_file, save in (
        (4, "ip_tables_names", "iptables-legacy-save"),
        (6, "ip6_tables_names", "ip6tables-legacy-save"),
    ):
        with _inside(netns):
            names = _read(f"/proc/thread-self/net/{names_file}") or ""
        for table in sorted(names.split()):
            text = _run([save, "-t", table], netns)
            lines = [_COUNTERS.sub("", x) for x in text.splitlines() if not x.startswith("#")]
            out.append(f"IPv{family} {table}:\n" + "\n".join(lines))
    return "\n".join(out)


def _sysctls(interfaces: Iterable[str], extra: Iterable[str]) -> str:
    """Call inside the namespace: /proc/sys/net shows the opening thread's namespace."""
    paths = list(GLOBAL_SYSCTLS) + list(extra)
    for ifname in interfaces:
        paths += [f"net/ipv4/conf/{ifname}/{k}" for k in PER_INTERFACE_SYSCTLS]
        paths.append(f"net/ipv6/conf/{ifname}/forwarding")
    lines = []
    for path in dict.fromkeys(paths):
        value = _read(f"/proc/sys/{path}")
        if value is not None:
            lines.append(f"{path} = {value}")
    return "\n".join(lines)


def netns_snapshot(netns: str | None = None, sysctls: Iterable[str] = ()) -> Snapshot:
    """The namespace's rules, links, qdiscs, filters and sysctls (None: this process's own).

    `sysctls`: further keys (paths below /proc/sys) worth watching there.
    """
    links, names = _links(netns)
    qdiscs, filters = _qdiscs_and_filters(netns)
    with _inside(netns):
        sysctl_text = _sysctls(names, sysctls)
    return {
        "nft ruleset": _run(["nft", "-s", "list", "ruleset"], netns).strip(),
        "iptables (legacy)": _iptables_legacy(netns),
        "links": links,
        "qdiscs": qdiscs,
        "ingress filters": filters,
        "sysctls": sysctl_text,
    }


def dir_listing(path: str, *, ignore_locks: bool = False) -> str:
    """Every file and dir below `path` with its mode and a digest of its content.

    `ignore_locks`: leave out the lock files a state dir keeps for good (and the dirs
    holding them), i.e. judge only what is per attachment.
    """
    if not os.path.isdir(path):
        return "<absent>" if not ignore_locks else ""
    lines = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        rel_root = os.path.relpath(root, path)
        if not ignore_locks:
            lines.append(f"{rel_root}/ {os.stat(root).st_mode & 0o7777:o}")
        for name in sorted(files):
            if ignore_locks and is_lock_file(name):
                continue
            full = os.path.join(root, name)
            try:
                with open(full, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()[:16]
                mode = os.stat(full).st_mode & 0o7777
            except OSError as e:
                digest, mode = f"<unreadable: {e.strerror}>", 0
            lines.append(f"{os.path.join(rel_root, name)} {mode:o} {digest}")
    return "\n".join(lines)


def state_snapshot(dirs: Iterable[str], *, ignore_locks: bool = False) -> Snapshot:
    return {f"dir {d}": dir_listing(d, ignore_locks=ignore_locks) for d in dirs}


def diff(before: Snapshot, after: Snapshot) -> dict[str, list[str]]:
    """Section -> the lines removed ('-') and added ('+'); empty when nothing changed."""
    out: dict[str, list[str]] = {}
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key, "<no section>"), after.get(key, "<no section>")
        if old == new:
            continue
        lines = [
            line
            for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        ]
        out[key] = lines or ["<whitespace only>"]
    return out


def describe(changes: dict[str, list[str]], limit: int = 12) -> str:
    parts = []
    for key, lines in changes.items():
        shown = lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])
        parts.append(f"[{key}]\n  " + "\n  ".join(shown))
    return "\n".join(parts)

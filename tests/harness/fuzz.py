"""Fuzzing: hypothesis strategies for plugin invocations, and a snapshot of the kernel state.

A *case* is one exec of a plugin: the CNI_* environment and the stdin bytes. Cases are
generated around a valid base (a real attachment made by the Go bridge in a lab), so a
good share of them really act on the kernel and another good share are broken in the ways
runtimes, users and attackers break them: wrong types, missing fields, huge numbers,
unicode and lone surrogates, deep nesting, duplicated keys, every cniVersion and invalid
ones, byte-level damage, missing or garbage CNI_* variables.

The snapshot is everything a plugin may change, read with as few execs as possible (nft
and iptables dumps, `ip -d link` and `tc -batch` per namespace; sysctls and the state
root are read in-process): a failed call must leave it identical.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from tests.harness.netns import Netns, sh
from tests.harness.plugins import GO_BIN, OUR_BIN, go, run_plugin

SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
BAD_VERSIONS = (
    "0.5.0",
    "2.0.0",
    "1.0",
    "v1.0.0",
    "1.0.0 ",
    "latest",
    "1.1.0\n",
    "\uff10.4.0",
    "..",
)
# The codes docs/cni-contract.md's error table documents; 999 (an unexpected exception) is a
# bug here.
EXPECTED_CODES = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 11, 50, 51, 100, 101, 102})
NETWORK = "fznet"
BRIDGE = "cmpfz0"
SUBNET4, GATEWAY4 = "10.89.9.0/24", "10.89.9.1"
SUBNET6, GATEWAY6 = "fd00:89:9::/64", "fd00:89:9::1"


# ---------------------------------------------------------------------------- the attachment


def attach_with_bridge(
    host: Netns, ctr: Netns, workdir: Path, cid: str = "fzctr"
) -> dict[str, Any]:
    """eth0 in `ctr` on a bridge in `host`, dual stack, made by the Go bridge + host-local.

    Returns the bridge's 1.0.0 result: the prevResult every case starts from.
    """
    conf = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "dataDir": str(workdir / "host-local"),
            "ranges": [[{"subnet": SUBNET4}], [{"subnet": SUBNET6}]],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
        },
    }
    run = run_plugin(go("bridge"), "ADD", conf, host=host, netns=ctr.path, container_id=cid)
    result: dict[str, Any] = run.ok().json
    host.sysctl("net.ipv4.ip_forward", "1")
    host.sysctl("net.ipv6.conf.all.forwarding", "1")
    return result


def host_veth(result: Mapping[str, Any]) -> str:
    return next(str(i["name"]) for i in result["interfaces"] if i["name"].startswith("veth"))


def result_in(version: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """The bridge's 1.0.0 result written as `version` would carry it (hand-made, not ours)."""
    if version in ("0.1.0", "0.2.0"):
        out: dict[str, Any] = {"cniVersion": version, "dns": {}}
        for ip in result["ips"]:
            family = "ip6" if ":" in ip["address"] else "ip4"
            out.setdefault(family, {"ip": ip["address"], "gateway": ip.get("gateway", "")})
        return out
    out = copy.deepcopy(dict(result))
    out["cniVersion"] = version
    if version in ("0.3.0", "0.3.1", "0.4.0"):
        for ip in out["ips"]:
            ip["version"] = "6" if ":" in ip["address"] else "4"
    return out


# ---------------------------------------------------------------------------- JSON with extras


@dataclass(frozen=True)
class Raw:
    """JSON text spliced verbatim into the output (deep nesting, duplicate keys)."""

    text: str


class DupDict(dict[str, Any]):
    """A JSON object serialised with `dup` appended: the same key twice in the text."""

    dup: tuple[str, Any] = ("", None)


def encode(value: Any) -> str:
    """json.dumps that understands Raw and DupDict, and keeps NaN/Infinity as Go never would."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        items = [f"{json.dumps(str(k))}: {encode(v)}" for k, v in value.items()]
        if isinstance(value, DupDict):
            items.append(f"{json.dumps(value.dup[0])}: {encode(value.dup[1])}")
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(encode(v) for v in value) + "]"
    return json.dumps(value)


def nested(depth: int, inner: Any, kind: str = "list") -> Raw:
    """`inner` wrapped `depth` times in arrays or objects, built as text (no recursion)."""
    if kind == "list":
        return Raw("[" * depth + encode(inner) + "]" * depth)
    return Raw('{"a": ' * depth + encode(inner) + "}" * depth)


# ---------------------------------------------------------------------------- junk values

HUGE_INTS = (
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -1,
    -(2**31),
    -(2**63),
    -(2**64),
    10**30,
    -(10**30),
    10**300,
)


def surrogate_text(max_size: int = 12) -> st.SearchStrategy[str]:
    """Unicode including lone surrogates: json.dumps writes them as \\udXXX escapes, which
    json.loads turns back into strings that cannot be encoded as UTF-8."""
    return st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=max_size)


def huge_numbers() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(HUGE_INTS),
        st.integers(),
        st.sampled_from(
            [1e308, -1e308, 1e-300, -0.0, 0.5, float("nan"), float("inf"), -float("inf")]
        ),
    )


def junk(leaves_only: bool = False) -> st.SearchStrategy[Any]:
    """Any JSON value, weighted toward the ones that break parsers."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        huge_numbers(),
        st.floats(allow_nan=True, allow_infinity=True),
        surrogate_text(),
        st.sampled_from(["", " ", "0", "1", "true", "null", "-1", "0x10", "1e3", "eth0", "../.."]),
    )
    if leaves_only:
        return leaves
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=3),
            st.dictionaries(surrogate_text(6), children, max_size=3),
        ),
        max_leaves=6,
    )


# ---------------------------------------------------------------------------- mutation

PathStep = str | int


def _containers(
    doc: Any, path: tuple[PathStep, ...] = (), depth: int = 0
) -> Iterator[tuple[PathStep, ...]]:
    """Paths of every dict/list value in doc (the root is ())."""
    if isinstance(doc, dict | list) and not isinstance(doc, DupDict) and depth < 8:
        yield path
        items = doc.items() if isinstance(doc, dict) else enumerate(doc)
        for key, value in items:
            yield from _containers(value, (*path, key), depth + 1)


def _at(doc: Any, path: tuple[PathStep, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


MUTATIONS = (
    "delete",
    "junk",
    "huge",
    "unicode",
    "nest",
    "recase",
    "extra",
    "null",
    "empty",
    "duplicate",
    "wrongtype",
)


@st.composite
def mutated(draw: st.DrawFn, base: Any, max_mutations: int = 3) -> Any:
    """A deep copy of `base` with 1..max_mutations random mutations at random places."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = list(_containers(doc))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = _at(doc, path)
        keys: list[PathStep] = (
            list(parent) if isinstance(parent, dict) else list(range(len(parent)))
        )
        op = draw(st.sampled_from(MUTATIONS))
        if not keys or op == "extra":
            if isinstance(parent, dict):
                parent[draw(surrogate_text(8))] = draw(junk())
            else:
                parent.append(draw(junk()))
            continue
        key = draw(st.sampled_from(keys))
        old = parent[key]
        if op == "delete":
            del parent[key]
        elif op == "junk":
            parent[key] = draw(junk())
        elif op == "huge":
            parent[key] = draw(huge_numbers())
        elif op == "unicode":
            parent[key] = draw(surrogate_text(40))
        elif op == "nest":
            depth = draw(st.sampled_from([1, 2, 30, 500, 990, 5000, 100_000]))
            parent[key] = nested(depth, old, draw(st.sampled_from(["list", "dict"])))
        elif op == "recase" and isinstance(parent, dict) and isinstance(key, str):
            del parent[key]
            parent[draw(st.sampled_from([key.upper(), key.lower(), key.swapcase(), key + " "]))] = (
                old
            )
        elif op == "null":
            parent[key] = None
        elif op == "empty":
            parent[key] = draw(st.sampled_from(["", [], {}, 0, False]))
        elif op == "duplicate" and isinstance(parent, dict) and isinstance(key, str):
            dup = DupDict(parent)
            dup.dup = (key, draw(junk()))
            if path:
                _at(doc, path[:-1])[path[-1]] = dup
            else:
                doc = dup
        elif op == "wrongtype":
            parent[key] = _wrong_type(old)
    return doc


def _wrong_type(value: Any) -> Any:
    """A value of another JSON type that a lax parser might still accept."""
    if isinstance(value, bool):
        return "true" if value else 0
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return int(value) if value == value and abs(value) != float("inf") else "NaN"
    if isinstance(value, str):
        return int(value) if value.isascii() and value.isdigit() else [value]
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, dict):
        return list(value.values())
    return {"value": value}


BYTE_DAMAGE = ("truncate", "insert", "flip", "bom", "trailing", "utf16", "latin1", "blank")


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """The serialised config with byte-level damage."""
    how = draw(st.sampled_from(BYTE_DAMAGE))
    if how == "truncate":
        return data[: draw(st.integers(0, max(len(data) - 1, 0)))]
    if how == "insert":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at:]
    if how == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
    if how == "bom":
        return b"\xef\xbb\xbf" + data
    if how == "trailing":
        return data + draw(st.sampled_from([b" {}", b"\n{}", b"x", b"\x00", b"]"]))
    if how == "utf16":
        return data.decode("utf-8", "replace").encode("utf-16")
    if how == "latin1":
        return data.replace(b'"', b'"\xe9', 1)
    return draw(st.sampled_from([b"", b" ", b"\n", b"null", b"0", b"[]", b'""', b"{}"]))


# ---------------------------------------------------------------------------- environments

ENV_VARS = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH", "CNI_ARGS")


def env_text(max_size: int = 20) -> st.SearchStrategy[str]:
    """What an environment variable can hold: no NUL; \\udc80-\\udcff become raw bytes
    (invalid UTF-8) through os.fsencode's surrogateescape."""
    return st.text(
        st.one_of(
            st.characters(min_codepoint=1, max_codepoint=0x10FFFF, exclude_categories=["Cs"]),
            st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
        ),
        max_size=max_size,
    )


SHELLISH = ("a;reboot", "$(id)", "`id`", "a|b", "a&&b", "a'b", 'a"b', "a\\b", "a*", "~root", "a\nb")
TRAVERSAL = ("../../etc/passwd", "..", ".", "a/../../b", "/etc/passwd", "a/b", "%2e%2e%2f")

CONTAINER_IDS_VALID = st.from_regex(r"\A[a-zA-Z0-9][a-zA-Z0-9_.\-]{0,70}\Z")
CNI_ARGS_VALID = (
    "",
    "IgnoreUnknown=1",
    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;"
    "K8S_POD_INFRA_CONTAINER_ID=fzctr;K8S_POD_UID=0f3c",
    ";;",
    "K8S_POD_NAME=a=b",
)


def mac_addresses() -> st.SearchStrategy[str]:
    """Unicast, non-zero MACs in the three spellings tuning reads."""

    def spell(octets: list[int], style: int) -> str:
        hexes = [f"{o:02x}" for o in octets]
        if style == 0:
            return ":".join(hexes)
        if style == 1:
            return "-".join(hexes).upper()
        joined = "".join(hexes)
        return ".".join(joined[i : i + 4] for i in (0, 4, 8))

    first = st.integers(0, 127).map(lambda n: n * 2 if n else 2)
    octets = st.tuples(first, st.lists(st.integers(0, 255), min_size=5, max_size=5)).map(
        lambda t: [t[0], *t[1]]
    )
    return st.builds(spell, octets, st.integers(0, 2))


@dataclass(frozen=True)
class EnvContext:
    """What the env strategies need to know about the lab."""

    ctr_netns: str
    scratch: Path  # holds a regular file, a symlink to ctr_netns and an empty dir


def _bad_values(var: str, ctx: EnvContext) -> st.SearchStrategy[str | None]:
    common: list[st.SearchStrategy[str | None]] = [
        st.none(),
        st.just(""),
        env_text(),
        st.sampled_from(SHELLISH + TRAVERSAL),
    ]
    if var == "CNI_COMMAND":
        common.append(st.sampled_from(["add", "Add", " ADD", "ADD ", "VERSIONX", "DELETE"]))
    elif var == "CNI_CONTAINERID":
        common.append(st.sampled_from(["a" * 1024, "a" * 1025, "b" * 5000, "-abc", "_x", "a b"]))
    elif var == "CNI_IFNAME":
        common.append(
            st.sampled_from(["eth1", "lo", "abcdefghijklmno", "abcdefghijklmnop", "eth0:1", "ëth0"])
        )
    elif var == "CNI_NETNS":
        common.append(
            st.sampled_from(
                [
                    "/run/netns/cmpt-no-such-netns",
                    str(ctx.scratch / "regular-file"),
                    str(ctx.scratch / "empty-dir"),
                    "/proc/self/ns/net",  # the plugin's own (the lab host): refused
                    "/dev/null",
                    ctx.ctr_netns + "/",
                    ctx.ctr_netns + "x",
                ]
            )
        )
    elif var == "CNI_PATH":
        common.append(st.sampled_from([":", "::::", "/nonexistent", "relative/dir"]))
    elif var == "CNI_ARGS":
        common.append(
            st.sampled_from(
                [
                    "novalue",
                    "=x",
                    "a=b;novalue",
                    "MAC=zz:zz",
                    "MAC=01:00:5e:00:00:01",
                    "K=" + "v" * 50_000,
                ]
            )
        )
        common.append(mac_addresses().map(lambda m: f"IgnoreUnknown=1;MAC={m}"))
    return st.one_of(*common)


def _good_values(var: str, ctx: EnvContext) -> st.SearchStrategy[str]:
    if var == "CNI_COMMAND":
        return st.just("ADD")
    if var == "CNI_CONTAINERID":
        return st.one_of(st.just("fzcase"), CONTAINER_IDS_VALID, st.just("c" * 1024))
    if var == "CNI_NETNS":
        return st.sampled_from([ctx.ctr_netns, str(ctx.scratch / "ctr-link")])
    if var == "CNI_IFNAME":
        return st.just("eth0")
    if var == "CNI_PATH":
        return st.sampled_from([f"{OUR_BIN}:{GO_BIN}", str(GO_BIN)])
    return st.sampled_from(CNI_ARGS_VALID)


@st.composite
def environments(draw: st.DrawFn, ctx: EnvContext, broken: bool) -> dict[str, str | None]:
    """CNI_* variables (None = unset). `broken`: one or two of them replaced by something
    a runtime should never send, or another verb."""
    env: dict[str, str | None] = {var: draw(_good_values(var, ctx)) for var in ENV_VARS}
    if not broken:
        return env
    if draw(st.booleans()):
        env["CNI_COMMAND"] = draw(st.sampled_from(["DEL", "CHECK", "GC", "STATUS", "VERSION"]))
    for var in draw(st.lists(st.sampled_from(ENV_VARS), min_size=1, max_size=2, unique=True)):
        env[var] = draw(_bad_values(var, ctx))
    return env


# ---------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Base:
    """What a valid config is built around."""

    plugin: str
    prev_result: dict[str, Any]  # the bridge's 1.0.0 result


def _versions_for_add() -> st.SearchStrategy[str]:
    return st.sampled_from(SUPPORTED_VERSIONS)


def cni_versions() -> st.SearchStrategy[Any]:
    """Every supported version, invalid spellings, and non-strings."""
    return st.one_of(
        st.sampled_from(SUPPORTED_VERSIONS),
        st.sampled_from(BAD_VERSIONS),
        junk(leaves_only=True),
    )


def port_mappings() -> st.SearchStrategy[list[dict[str, Any]]]:
    host_ips = [
        "",
        "0.0.0.0",
        "::",
        GATEWAY4,
        GATEWAY6,
        "127.0.0.1",
        "192.0.2.10",
        "::ffff:10.1.2.3",
        "[fd00:89:9::1]",
    ]
    mapping = st.fixed_dictionaries(
        {"hostPort": st.integers(1, 65535), "containerPort": st.integers(1, 65535)},
        optional={
            "protocol": st.sampled_from(["tcp", "udp", "sctp", "TCP", "Udp", ""]),
            "hostIP": st.sampled_from(host_ips),
            "range": st.integers(1, 4),
        },
    )
    return st.lists(mapping, min_size=0, max_size=6)


@st.composite
def portmap_keys(draw: st.DrawFn) -> dict[str, Any]:
    keys: dict[str, Any] = {"capabilities": {"portMappings": True}}
    keys["runtimeConfig"] = {"portMappings": draw(port_mappings())}
    if draw(st.booleans()):
        # case-insensitive keys, as Go runtimes send them
        for m in keys["runtimeConfig"]["portMappings"]:
            if "hostPort" in m:
                m["HostPort"] = m.pop("hostPort")
    for key, strategy in (
        ("snat", st.booleans()),
        ("masqAll", st.booleans()),
        ("backend", st.sampled_from(["nftables", "nftables", "nftables", "NFTables", "iptables"])),
        (
            "conditionsV4",
            st.sampled_from(
                [
                    [],
                    ["ip saddr 10.0.0.0/8"],
                    ["-s", "10.0.0.0/8"],
                    ["!", "-i", "eth9"],
                    ["ip saddr != 1.2.3.4"],
                ]
            ),
        ),
        ("conditionsV6", st.sampled_from([[], ["ip6 saddr fd00::/8"], ["!", "-d", "fd00::1"]])),
    ):
        if draw(st.booleans()):
            keys[key] = draw(strategy)
    choice = draw(st.integers(0, 4))
    if choice == 1:
        keys["markMasqBit"] = draw(st.integers(0, 31))
    elif choice == 2:
        keys["externalSetMarkChain"] = draw(
            st.sampled_from(["CNI-HOSTPORT-SETMARK", "KUBE-MARK-MASQ"])
        )
    return keys


@st.composite
def bandwidth_keys(draw: st.DrawFn) -> dict[str, Any]:
    rate = st.one_of(
        st.integers(64_000, 10**9), st.sampled_from([8_000_000, 1_000_000_000, 34_359_738_360])
    )
    burst = st.one_of(st.integers(12_112, 10**8), st.just(4_294_967_295))
    limits: dict[str, Any] = {}
    for direction in draw(st.sampled_from([("ingress",), ("egress",), ("ingress", "egress"), ()])):
        limits[f"{direction}Rate"] = draw(rate)
        limits[f"{direction}Burst"] = draw(burst)
    if draw(st.booleans()):
        return {"capabilities": {"bandwidth": True}, "runtimeConfig": {"bandwidth": limits}}
    if draw(st.booleans()):
        limits = {k[0].upper() + k[1:]: v for k, v in limits.items()}
    return limits


# Per-netns sysctls that exist in a fresh container namespace, with values it accepts.
SYSCTLS: dict[str, st.SearchStrategy[Any]] = {
    "net.core.somaxconn": st.integers(128, 65535).map(str),
    "net.ipv4.conf.IFNAME.accept_redirects": st.sampled_from(["0", "1", 0, 1]),
    "net.ipv4.conf.IFNAME.rp_filter": st.sampled_from(["0", "1", "2"]),
    "net/ipv4/conf/IFNAME/arp_ignore": st.sampled_from(["0", "1", "2"]),
    "net.ipv4.ip_unprivileged_port_start": st.integers(0, 1024).map(str),
    "net.ipv4.tcp_keepalive_time": st.integers(60, 7200).map(str),
    "net.ipv6.conf.IFNAME.accept_ra": st.sampled_from(["0", "1", "2"]),
    "net.ipv4.ping_group_range": st.sampled_from(["0 2147483647", "1\t0", "100 200"]),
    "net.ipv4.tcp_rmem": st.sampled_from(["4096 131072 6291456", "4096  87380   4194304"]),
}
EVIL_SYSCTL_KEYS = (
    "kernel.ostype",  # read-only: a broken check could still not change the machine
    "net/../kernel/ostype",
    "net.ipv4.conf.IFNAME/../../../../kernel/ostype",
    "/proc/sys/kernel/ostype",
    "net..core.somaxconn",
    "net.core.somaxconn ",
    "net.core.somaxconn\n",
    "net.core.%2e%2e.somaxconn",
    "net",
    "net.",
    "NET.core.somaxconn",
    "net.core.somaxconn\x00",
)


@st.composite
def sysctl_objects(draw: st.DrawFn) -> dict[str, Any]:
    keys = draw(st.lists(st.sampled_from(sorted(SYSCTLS)), max_size=4, unique=True))
    return {k: draw(SYSCTLS[k]) for k in keys}


@st.composite
def tuning_keys(draw: st.DrawFn) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if draw(st.booleans()):
        settings["sysctl"] = draw(sysctl_objects())
    # Link attributes make a call slower (pyroute2): about one config in four sets one.
    if draw(st.integers(0, 3)) == 0:
        for key, strategy in (
            ("mac", mac_addresses()),
            ("mtu", st.one_of(st.just(0), st.integers(68, 9000))),
            ("promisc", st.booleans()),
            ("allmulti", st.booleans()),
            ("txQLen", st.integers(0, 100_000)),
        ):
            if draw(st.booleans()):
                settings[key] = draw(strategy)
    where = draw(st.sampled_from(["conf", "conf", "args"]))
    keys: dict[str, Any] = settings if where == "conf" else {"args": {"cni": settings}}
    if draw(st.integers(0, 5)) == 0:
        keys["capabilities"] = {"mac": True}
        keys["runtimeConfig"] = {"mac": draw(mac_addresses())}
    return keys


PLUGIN_KEYS: dict[str, Callable[[], st.SearchStrategy[dict[str, Any]]]] = {
    "portmap": portmap_keys,
    "bandwidth": bandwidth_keys,
    "tuning": tuning_keys,
}


@st.composite
def prev_results(draw: st.DrawFn, base: Base, version: str) -> Any:
    """The attachment's result, mostly in the config's version, sometimes reshaped."""
    prev = base.prev_result
    variant = draw(st.sampled_from(["same", "same", "same", "other", "v4only", "v6only", "absent"]))
    if variant == "absent":
        return None
    if variant == "other":
        return result_in(draw(st.sampled_from(SUPPORTED_VERSIONS)), prev)
    out = result_in(version, prev)
    if variant in ("v4only", "v6only") and "ips" in out:
        want6 = variant == "v6only"
        out["ips"] = [ip for ip in out["ips"] if (":" in ip["address"]) == want6]
    return out


@st.composite
def valid_configs(draw: st.DrawFn, base: Base) -> dict[str, Any]:
    version = draw(_versions_for_add())
    conf: dict[str, Any] = {
        "cniVersion": version,
        "name": draw(st.sampled_from([NETWORK, NETWORK, "fz.net-2_b", "n" * 200])),
        "type": base.plugin,
    }
    prev = draw(prev_results(base, version))
    if prev is not None:
        conf["prevResult"] = prev
    conf.update(draw(PLUGIN_KEYS[base.plugin]()))
    return conf


@st.composite
def broken_configs(draw: st.DrawFn, base: Base) -> Any:
    conf = draw(valid_configs(base))
    how = draw(st.sampled_from(["mutate", "mutate", "mutate", "version", "evil-sysctl", "root"]))
    if how == "version":
        conf["cniVersion"] = draw(cni_versions())
        if draw(st.booleans()):
            del conf["cniVersion"]
        return conf
    if how == "evil-sysctl" and base.plugin == "tuning":
        where = (
            conf.setdefault("sysctl", {})
            if draw(st.booleans())
            else conf.setdefault("args", {}).setdefault("cni", {}).setdefault("sysctl", {})
        )
        if isinstance(where, dict):
            where[draw(st.sampled_from(EVIL_SYSCTL_KEYS))] = draw(st.sampled_from(["1", "x\ny"]))
        return conf
    if how == "root":
        return draw(junk())
    return draw(mutated(conf))


# ---------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One exec of a plugin."""

    kind: str  # "valid", "broken-conf", "broken-env", "broken-bytes"
    env: dict[str, str | None]
    stdin: bytes
    conf: Any = field(default=None, compare=False)
    check_after_add: bool = False  # a successful ADD is followed by CHECK (from 0.4.0)

    @property
    def command(self) -> str | None:
        return self.env.get("CNI_COMMAND")

    def __repr__(self) -> str:
        shown = {
            k: (v if v is None or len(v) < 120 else v[:60] + f"...({len(v)} chars)")
            for k, v in self.env.items()
        }
        data = (
            self.stdin if len(self.stdin) < 1500 else self.stdin[:700] + b"..." + self.stdin[-200:]
        )
        return f"Case({self.kind}, env={shown}, stdin={data!r})"


@st.composite
def cases(draw: st.DrawFn, base: Base, ctx: EnvContext) -> Case:
    kind = draw(
        st.sampled_from(
            ["valid", "valid", "broken-conf", "broken-conf", "broken-env", "broken-bytes"]
        )
    )
    conf: Any = draw(broken_configs(base) if kind == "broken-conf" else valid_configs(base))
    env = draw(environments(ctx, broken=kind == "broken-env"))
    stdin = encode(conf).encode("utf-8", "surrogatepass")
    if kind == "broken-bytes":
        stdin = draw(damaged(stdin))
    return Case(kind, env, stdin, conf, draw(st.booleans()))


def run_case(
    exe: str, host: Netns, case: Case, lab_env: Mapping[str, str], cwd: Path, timeout: float = 120
) -> tuple[int, str, str, float]:
    """Exec the plugin in the lab host with exactly the case's CNI_* variables.

    Returns (exit code, stdout, stderr, seconds). A call still running after `timeout`
    seconds is killed and reported as a hang (the assertion message names the case).
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    full.update(lab_env)
    env = {k: v for k, v in case.env.items() if v is not None}
    full.update(env)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            ["ip", "netns", "exec", host.name, exe],
            input=case.stdin,
            env=full,  # \udc80-\udcff reach the plugin as raw (non-UTF-8) bytes
            capture_output=True,
            cwd=cwd,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"no answer within {timeout}s (hang?): {case!r}") from e
    elapsed = time.monotonic() - started
    return proc.returncode, _text(proc.stdout), _text(proc.stderr), elapsed


def _text(data: bytes) -> str:
    return data.decode("utf-8", "backslashreplace")


# ---------------------------------------------------------------------------- output checks


def expected_version(stdin: bytes) -> str | None:
    """The cniVersion a successful answer must carry, when the config says so plainly."""
    try:
        raw = json.loads(stdin)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    matching = [k for k in raw if k.casefold() == "cniversion"]
    if matching != ["cniVersion"] and matching:
        return None
    value = raw.get("cniVersion")
    if value is None or value == "":
        return "0.1.0"
    return value if value in SUPPORTED_VERSIONS else None


def has_prev_result(stdin: bytes) -> bool:
    try:
        raw = json.loads(stdin)
    except (ValueError, RecursionError):
        return False
    # "prevResult": null is no prevResult: common.config reads it so.
    return isinstance(raw, dict) and any(
        k.casefold() == "prevresult" and v is not None for k, v in raw.items()
    )


def one_json_object(stdout: str) -> dict[str, Any]:
    """stdout must be exactly one JSON object (whitespace around it is fine)."""
    text = stdout.strip()
    obj, end = json.JSONDecoder().raw_decode(text)
    assert end == len(text), f"more than one JSON document on stdout: {stdout[:300]!r}"
    assert isinstance(obj, dict), f"stdout is not a JSON object: {stdout[:300]!r}"
    return obj


def check_error(stdout: str) -> dict[str, Any]:
    err = one_json_object(stdout)
    assert set(err) <= {"cniVersion", "code", "msg", "details"}, err
    code = err.get("code")
    assert isinstance(code, int) and not isinstance(code, bool), err
    assert code != 999, f"internal error (a bug): {err}"
    assert code in EXPECTED_CODES, f"undocumented error code: {err}"
    assert isinstance(err.get("msg"), str) and err["msg"].strip(), err
    assert err.get("cniVersion") in SUPPORTED_VERSIONS, err
    assert isinstance(err.get("details", ""), str), err
    return err


def check_result(stdout: str, version: str | None) -> dict[str, Any]:
    """A well-formed CNI result of `version` (checked here by hand, not by our parser)."""
    import ipaddress

    result = one_json_object(stdout)
    got = result.get("cniVersion")
    assert got in SUPPORTED_VERSIONS, result
    if version is not None:
        assert got == version, f"result is {got}, config asked for {version}"
    if got in ("0.1.0", "0.2.0"):
        assert "ips" not in result and "interfaces" not in result, result
        for family in ("ip4", "ip6"):
            if family in result:
                ipaddress.ip_interface(result[family]["ip"])
                if result[family].get("gateway"):
                    ipaddress.ip_address(result[family]["gateway"])
        return result
    interfaces = result.get("interfaces", [])
    assert isinstance(interfaces, list), result
    for iface in interfaces:
        assert isinstance(iface, dict) and isinstance(iface.get("name"), str), result
    for ip in result.get("ips", []):
        ipaddress.ip_interface(ip["address"])
        if ip.get("gateway"):
            ipaddress.ip_address(ip["gateway"])
        if "interface" in ip:  # an index (Go does not check that it points anywhere)
            index = ip["interface"]
            assert isinstance(index, int) and not isinstance(index, bool) and index >= 0, result
        if got in ("0.3.0", "0.3.1", "0.4.0"):
            assert ip.get("version") in ("4", "6"), result
        else:
            assert "version" not in ip, result
    return result


# ---------------------------------------------------------------------------- snapshots


def _drop_volatile(value: Any) -> Any:
    """ip -d -j link output without the bridge's running timers and traffic counters."""
    if isinstance(value, dict):
        return {
            k: _drop_volatile(v)
            for k, v in value.items()
            if not k.endswith("_timer") and k not in ("stats", "stats64", "operstate")
        }
    if isinstance(value, list):
        return [_drop_volatile(v) for v in value]
    return value


def _json_documents(text: str) -> list[Any]:
    """Several JSON documents one after another (tc -batch -j prints one per command)."""
    decoder = json.JSONDecoder()
    out, i = [], 0
    text = text.strip()
    while i < len(text):
        obj, end = decoder.raw_decode(text, i)
        out.append(obj)
        i = end
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def _iptables(ns: Netns, tool: str) -> str:
    """A legacy xtables dump without its timestamps and packet counters."""
    out = ns.run(tool, check=False)
    lines = []
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        if line.startswith(":"):
            line = line.rsplit(" ", 1)[0]
        lines.append(line)
    return "\n".join(lines)


def _netns_view(ns: Netns) -> dict[str, Any]:
    links = json.loads(sh("ip", "-n", ns.name, "-d", "-j", "link", "show") or "[]")
    names = [str(link["ifname"]) for link in links]
    script = "qdisc show\n" + "".join(
        f"filter show dev {n} ingress\nfilter show dev {n}\n" for n in names
    )
    proc = subprocess.run(
        ["tc", "-n", ns.name, "-force", "-j", "-batch", "-"],
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )
    docs = _json_documents(proc.stdout)
    qdiscs = docs[0] if docs else []
    filters = {
        f"{n} {d}": docs[1 + 2 * i + j]
        for i, n in enumerate(names)
        for j, d in enumerate(("ingress", "root"))
        if 1 + 2 * i + j < len(docs)
    }
    return {
        "links": _drop_volatile(links),
        "qdiscs": [q for q in qdiscs if isinstance(q, dict)],
        "filters": filters,
    }


def read_sysctl_tree(ns: Netns, top: str = "/proc/sys/net") -> dict[str, str]:
    """Every readable file below `top` as the namespace shows it."""
    out: dict[str, str] = {}
    with ns.entered():
        for directory, _, files in os.walk(top):
            for name in files:
                path = os.path.join(directory, name)
                try:
                    with open(path, "rb") as f:
                        out[path] = f.read().decode("utf-8", "replace")
                except OSError:
                    continue
    return out


def read_sysctls(ns: Netns, paths: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    with ns.entered():
        for path in paths:
            try:
                with open(path, "rb") as f:
                    out[path] = f.read().decode("utf-8", "replace")
            except OSError as e:
                out[path] = f"<{e.strerror}>"
    return out


def host_sysctl_paths(ns: Netns) -> list[str]:
    with ns.entered():
        conf = sorted(os.listdir("/proc/sys/net/ipv4/conf"))
    return [
        "/proc/sys/net/ipv4/ip_forward",
        "/proc/sys/net/ipv6/conf/all/forwarding",
        *(f"/proc/sys/net/ipv4/conf/{c}/route_localnet" for c in conf),
    ]


def is_lock_file(path: Path) -> bool:
    return path.name == "lock" or path.name.endswith(".lock")


def tree(root: Path) -> dict[str, str]:
    """Every entry below root (lock files aside): type, mode and content hash."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        st_ = path.lstat()
        rel = str(path.relative_to(root))
        mode = oct(stat.S_IMODE(st_.st_mode))
        if stat.S_ISDIR(st_.st_mode):
            out[rel] = f"dir {mode}"
        elif stat.S_ISREG(st_.st_mode):
            if is_lock_file(path) and st_.st_size == 0:
                continue
            out[rel] = f"file {mode} {hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
        else:
            out[rel] = f"other {mode}"
    return out


@dataclass
class Snapshotter:
    """Reads everything `plugin` may change in the lab."""

    plugin: str
    host: Netns
    ctr: Netns
    state_root: Path

    def take(self) -> dict[str, Any]:
        snap: dict[str, Any] = {
            "host": _netns_view(self.host),
            "ctr": _netns_view(self.ctr),
            # -s: counters are traffic, not state (iptables-nft counts every rule)
            "nft": json.loads(self.host.run("nft", "-s", "-j", "list", "ruleset") or "{}"),
            "state": tree(self.state_root),
        }
        if self.plugin == "portmap":
            snap["iptables"] = _iptables(self.host, "iptables-legacy-save")
            snap["ip6tables"] = _iptables(self.host, "ip6tables-legacy-save")
            snap["sysctl host"] = read_sysctls(self.host, host_sysctl_paths(self.host))
        if self.plugin == "tuning":
            snap["sysctl ctr"] = read_sysctl_tree(self.ctr)
        return snap


def differences(before: Mapping[str, Any], after: Mapping[str, Any], limit: int = 12) -> list[str]:
    """Human-readable list of what changed between two snapshots (leaf by leaf)."""
    out: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if len(out) >= limit or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{where}/{k}")
            return
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{where}[{i}]")
            return
        if isinstance(a, str) and isinstance(b, str) and "\n" in a + b:
            import difflib

            lines = difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
            out.append(f"{where}: " + " | ".join(list(lines)[2:14]))
            return
        out.append(f"{where}: {str(a)[:300]} -> {str(b)[:300]}")

    walk(before, after, "")
    return out

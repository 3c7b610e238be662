"""What each plugin verb imports: the start-up cost of every container start, guarded
without a clock.

Each verb runs in a fresh `python -IS -X importtime` process started the way
deploy/install.sh's launcher starts it (our packages and the venv's site-packages on
sys.path, no site.py), and that process writes sorted(sys.modules) when it
exits. A verb fails here when our code imports a module known to be heavy (milliseconds
each on a small node, or a whole subsystem it has no use for), or when it imports more
modules than its recorded budget (counted beyond what the bare launcher has). A new import on a
call path is then a conscious decision: raise the budget below in the same commit, saying
why.

pyroute2 (netlink) imports some of the heavy ones itself (`pyroute2.netlink` imports
typing, logging, threading and traceback; `pyroute2.config` multiprocessing, platform and
re; `tcmsg`'s classifiers dataclasses and inspect). Those are tolerated where
`-X importtime` shows one of these libraries importing them first, and counted in the
budget; the same module imported first by our code fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Lab

REPO = Path(__file__).resolve().parents[1]


# Never on a plugin's call path: each costs milliseconds to import or drags in a
# subsystem a plugin does not use (OpenSSL, threads, the compiler's AST, ...).
HEAVY = (
    "dataclasses",
    "typing",
    "inspect",
    "enum",
    "re",
    "argparse",
    "ast",
    "asyncio",
    "unittest",
    "multiprocessing",
    "hashlib",
    "_hashlib",
    "ssl",
    "subprocess",
    "threading",
    "logging",
    "email",
    "http",
    "urllib",
    "tokenize",
    "dis",
    "importlib.metadata",
    "pkg_resources",
)

# The library the plugins are built on: heavy modules it imports itself are its own.
LIBRARIES = ("pyroute2",)

# A verb loads the netlink messages it sends and the firewall library of the backend in
# use, nothing more.
NOT_FOR = {
    "tuning": ("pyroute2.netlink.rtnl.tcmsg", "portmap", "bandwidth"),
    "bandwidth-unrecorded": ("pyroute2", "portmap", "tuning"),
    "portmap-pass-through": ("pyroute2", "bandwidth", "tuning"),
    "bandwidth-pass-through": ("pyroute2", "portmap", "tuning"),
    "tuning-pass-through": ("pyroute2", "portmap", "bandwidth"),
    # contextlib (with functools and collections) only for blocks a class does as well
    "portmap-nftables": ("portmap.xtables", "pyroute2", "contextlib"),
    # (the iptables backend loads libnftables too, for the localhost guard: see BUDGET)
    "portmap-iptables": ("pyroute2", "contextlib"),
    # pyroute2's tcmsg package would import every qdisc and classifier it knows.
    # An IPAM plugin's work is files: no netlink, no ctypes, no ipaddress (flatnet_ipam.addr).
    "flatnet-ipam": ("pyroute2", "portmap", "bandwidth", "tuning", "ipaddress", "ctypes"),
    "bandwidth": (
        "portmap",
        "tuning",
        "dataclasses",
        "inspect",
        "pyroute2.netlink.rtnl.tcmsg.sched_htb",
        "pyroute2.netlink.rtnl.tcmsg.sched_cake",
        "pyroute2.netlink.rtnl.tcmsg.cls_basic",
    ),
}

# Modules imported beyond the bare launcher's, per plugin and verb (Python 3.11, pyroute2
# 0.9.7). Raise one only for an import the verb really needs. Where
# the counts go: VERSION is the plugin, skel, jsontext, versions and errors (not even
# os); portmap with nftables adds its own modules (portmap.kernel, its kernel ports,
# and portmap.libnftables, the one binding of libnftables, among them), the attachment
# engine, os, ctypes and, where there is a plan (ADD, CHECK), ipaddress with functools
# and collections; no contextlib; iptables adds portmap.xtables, which
# runs iptables-restore/-save through posix_spawn (no subprocess module), and
# common.rtnl (the one netlink transport, builtin modules only) for the UDP conntrack
# flush; tuning adds pyroute2's link
# messages (~70 with what pyroute2 imports: typing, logging, threading, multiprocessing,
# platform, re); bandwidth adds the tc modules of the kinds it sends and reads (tbf,
# ingress, u32 with its actions: ~20 more), not pyroute2's whole tcmsg package.
# A verb that reads or writes /proc/sys loads common.sysctl, the one reader and writer.
# portmap's verbs load portmap.localnet (which interface gets route_localnet, and who
# still needs it: DEL of the last one puts it back, through common.sysctl); ADD and
# CHECK ask the kernel for the route to the container over common.rtnl. The localhost
# guard beside route_localnet is made with libnftables wherever it loads, whatever the
# backend: the iptables backend's ADD and last DEL load portmap.libnftables and ctypes.
BUDGET = {
    ("portmap", "VERSION"): 9,
    ("bandwidth", "VERSION"): 9,
    ("tuning", "VERSION"): 9,
    ("flatnet_ipam", "VERSION"): 9,
    ("portmap-nftables", "ADD"): 55,
    ("portmap-nftables", "CHECK"): 55,
    ("portmap-nftables", "DEL"): 45,  # no plan (nor ipaddress) when the state file says
    ("portmap-iptables", "ADD"): 56,
    ("portmap-iptables", "CHECK"): 52,
    ("portmap-iptables", "DEL"): 45,
    ("bandwidth", "ADD"): 140,
    ("bandwidth", "CHECK"): 139,
    ("bandwidth", "DEL"): 137,
    ("bandwidth-unrecorded", "DEL"): 54,  # no pyroute2: nothing was left to remove
    # Nothing to map, shape or tune: ADD and CHECK parse the config and stop (tuning's
    # names its dataDir with os.path); DEL looks for a record (portmap also for mappings
    # whose record was lost, and for the Go portmap's: libnftables and the iptables probe;
    # bandwidth for an ifb in the container netns too: ctypes' setns).
    ("portmap-pass-through", "ADD"): 19,
    ("portmap-pass-through", "CHECK"): 19,
    ("portmap-pass-through", "DEL"): 47,
    ("bandwidth-pass-through", "ADD"): 19,
    ("bandwidth-pass-through", "CHECK"): 19,
    ("bandwidth-pass-through", "DEL"): 54,
    ("tuning-pass-through", "ADD"): 26,
    ("tuning-pass-through", "CHECK"): 26,
    ("tuning-pass-through", "DEL"): 30,
    ("tuning", "ADD"): 122,
    ("tuning", "CHECK"): 122,
    ("tuning", "DEL"): 122,
    # flatnet-ipam: the config, the store (os, fcntl, common.state), the engine, and
    # _socket's inet_pton for addresses; GC also contextlib (the engine's GC block) and
    # common.gc.
    ("flatnet-ipam", "ADD"): 34,
    ("flatnet-ipam", "CHECK"): 33,
    ("flatnet-ipam", "DEL"): 34,
    ("flatnet-ipam", "GC"): 44,
    ("flatnet-ipam", "STATUS"): 31,
}

# deploy/install.sh's launcher, run as `python -IS -X importtime LAUNCHER` (a shebang
# passes at most one argument to the interpreter), dumping sys.modules at whichever exit.
LAUNCHER = """\
import sys
sys.path[:0] = {paths!r}
def _dump_modules():
    with open({out!r}, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
import atexit
atexit.register(_dump_modules)
# A plugin ends with posix._exit (common.finish), which runs no atexit handler.
import posix
_exit = posix._exit
def _dump_and_exit(status):
    _dump_modules()
    _exit(status)
posix._exit = _dump_and_exit
{body}
"""


def launcher(tmp: Path, plugin: str, out: Path) -> Path:
    """A launcher like deploy/install.sh's, that also dumps sys.modules at exit."""
    body = f"from {plugin}.__main__ import main\nmain()" if plugin else "pass"
    paths = [str(REPO), sysconfig.get_paths()["purelib"]]
    exe = tmp / f"probe-{plugin or 'bare'}"
    exe.write_text(LAUNCHER.format(paths=paths, out=str(out), body=body))
    return exe


class Imports:
    """What one process imported, and which module first imported each."""

    def __init__(self, modules: list[str], importtime: str) -> None:
        self.modules = modules
        self.importer: dict[str, list[str]] = {}  # module -> the chain of its importers
        # -X importtime prints a module after the modules it imported, indented two more
        # spaces per level: a module's importers are the next lines with less indentation.
        rows = []
        for line in importtime.splitlines():
            if line.startswith("import time:") and "[us]" not in line:
                name = line.rsplit("|", 1)[1]
                rows.append((len(name) - len(name.lstrip()), name.strip()))
        for i, (depth, name) in enumerate(rows):
            chain, level = [], depth
            for d, parent in rows[i + 1 :]:
                if d < level:
                    chain.append(parent)
                    level = d
                    if d <= 1:
                        break
            self.importer[name] = chain

    def first_imported_by_a_library(self, module: str) -> bool:
        return any(m.startswith(LIBRARIES) for m in self.importer.get(module, []))


def imported(
    tmp: Path,
    plugin: str,
    command: str,
    conf: dict[str, Any] | None = None,
    *,
    netns: str = "",
    host: str = "",
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> Imports:
    """Run one verb in a fresh process; the modules it had imported when it exited."""
    out = tmp / f"modules-{plugin}-{command}.txt"
    exe = launcher(tmp, plugin, out)
    full = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "ctr-imports",
        "CNI_IFNAME": "eth0",
        "CNI_NETNS": netns,
        "CNI_PATH": "/usr/lib/cni",
        **(env or {}),
    }
    python = [sys.executable, "-IS", "-X", "importtime", str(exe)]
    argv = ["ip", "netns", "exec", host, *python] if host else python
    data = json.dumps(conf or {"cniVersion": "1.0.0"}).encode() if stdin is None else stdin
    proc = subprocess.run(argv, input=data, env=full, capture_output=True, check=False)
    assert proc.returncode == 0, f"{plugin} {command} failed: {proc.stdout!r} {proc.stderr!r}"
    return Imports(out.read_text().split(), proc.stderr.decode(errors="replace"))


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """What the launcher itself imports (interpreter start, sys.path, atexit)."""
    tmp = tmp_path_factory.mktemp("bare")
    return set(imported(tmp, "", "VERSION").modules)


def problems_of(found: Imports, bare: set[str], command: str, kind: str) -> list[str]:
    modules = found.modules
    heavy = [m for m in modules if m in HEAVY and not found.first_imported_by_a_library(m)]
    wrong = [m for m in modules for p in NOT_FOR.get(kind, ()) if m == p or m.startswith(p + ".")]
    extra = sorted(set(modules) - bare)
    budget = BUDGET[(kind, command)]
    problems = []
    if heavy:
        problems.append(f"heavy modules imported: {heavy}")
    if wrong:
        problems.append(f"modules this verb does not use: {wrong}")
    if len(extra) > budget:
        problems.append(f"{len(extra)} modules imported beyond the launcher's, budget {budget}")
    if problems:
        problems.append(f"imported: {extra}")
    return problems


@pytest.mark.parametrize("plugin", ["portmap", "bandwidth", "tuning", "flatnet_ipam"])
def test_version_imports_almost_nothing(tmp_path: Path, bare: set[str], plugin: str) -> None:
    problems = problems_of(imported(tmp_path, plugin, "VERSION"), bare, "VERSION", plugin)
    assert not problems, f"{plugin} VERSION: " + "\n".join(problems)


def test_version_with_nothing_on_stdin_imports_almost_nothing(
    tmp_path: Path, bare: set[str]
) -> None:
    # Some callers send no config with VERSION: that is no version asked, not a JSON error
    # (whose message would import the `json` package).
    found = imported(tmp_path, "tuning", "VERSION", stdin=b"")
    assert "json" not in found.modules
    assert not problems_of(found, bare, "VERSION", "tuning")


# ---------------------------------------------------------------------------- ADD/CHECK/DEL


def veth(lab: Lab) -> str:
    """A veth pair with addresses: host end in lab.host, eth0 in the container."""
    host_end = "vh" + lab.ctr.name[-8:]
    lab.host.ip(
        "link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", lab.ctr.name
    )
    lab.host.ip("addr", "add", "10.99.0.1/24", "dev", host_end)
    lab.host.ip("link", "set", host_end, "up")
    lab.ctr.ip("addr", "add", "10.99.0.2/24", "dev", "eth0")
    lab.ctr.ip("link", "set", "eth0", "up")
    return host_end


def conf(lab: Lab, host_end: str, plugin: str, **keys: Any) -> dict[str, Any]:
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": host_end, "mac": "aa:bb:cc:00:00:01"},
            {"name": "eth0", "mac": "aa:bb:cc:00:00:02", "sandbox": lab.ctr.path},
        ],
        "ips": [{"address": "10.99.0.2/24", "gateway": "10.99.0.1", "interface": 1}],
    }
    return {"cniVersion": "1.0.0", "name": "importnet", "type": plugin, "prevResult": prev, **keys}


CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "portmap-nftables": (
        "portmap",
        {
            "backend": "nftables",
            "runtimeConfig": {
                "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
            },
        },
    ),
    "portmap-iptables": (
        "portmap",
        {
            "backend": "iptables",
            "runtimeConfig": {
                "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "udp"}]
            },
        },
    ),
    "bandwidth": (
        "bandwidth",
        {
            "runtimeConfig": {
                "bandwidth": {
                    "ingressRate": 8_000_000,
                    "ingressBurst": 80_000,
                    "egressRate": 8_000_000,
                    "egressBurst": 80_000,
                }
            }
        },
    ),
    "tuning": (
        "tuning",
        {"mac": "02:42:0a:59:00:07", "mtu": 1400, "sysctl": {"net.core.somaxconn": "1000"}},
    ),
}


@pytest.mark.root
@pytest.mark.parametrize("kind", sorted(CASES))
def test_add_check_del_import_only_what_they_use(
    lab: Lab, tmp_path: Path, bare: set[str], kind: str
) -> None:
    plugin, keys = CASES[kind]
    host_end = veth(lab)
    config = conf(lab, host_end, plugin, **keys)
    found = {}
    for command in ("ADD", "CHECK", "DEL"):
        found[command] = imported(
            tmp_path, plugin, command, config, netns=lab.ctr.path, host=lab.host.name, env=lab.env
        )
    # All three verbs ran (DEL cleaned up) before any is judged.
    problems = [
        f"{kind} {command}: {problem}"
        for command, imports in found.items()
        for problem in problems_of(imports, bare, command, kind)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.root
def test_bandwidth_del_without_a_record_imports_no_netlink_messages(
    lab: Lab, tmp_path: Path, bare: set[str]
) -> None:
    # containerd DELs every pod twice, and most pods are not shaped: a DEL with no record
    # and no ifb of the attachment learns that with an ioctl, before pyroute2 (see
    # bandwidth.tc.has_device), whether the netns is still there or not.
    host_end = veth(lab)
    unshaped = conf(lab, host_end, "bandwidth")
    shaped = conf(lab, host_end, "bandwidth", **CASES["bandwidth"][1])

    def run(command: str, config: dict[str, Any], netns: str = lab.ctr.path) -> Imports:
        return imported(
            tmp_path, "bandwidth", command, config, netns=netns, host=lab.host.name, env=lab.env
        )

    found = {"unshaped": run("DEL", unshaped)}
    run("ADD", shaped)
    run("DEL", shaped)
    found["second"] = run("DEL", shaped)
    found["netns gone"] = run("DEL", shaped, netns="/run/netns/no-such-netns")
    problems = [
        f"bandwidth DEL, {case}: {problem}"
        for case, imports in found.items()
        for problem in problems_of(imports, bare, "DEL", "bandwidth-unrecorded")
    ]
    assert not problems, "\n".join(problems)


# What a pod without port mappings, bandwidth or link settings sends each plugin.
PASS_THROUGH: dict[str, dict[str, Any]] = {
    "portmap": {"capabilities": {"portMappings": True}},
    "bandwidth": {"capabilities": {"bandwidth": True}},
    "tuning": {},
}
# An ADD or CHECK that passes prevResult through has no use for these (the budget counts
# the rest).
NOT_FOR_PASS_THROUGH_ADD = ("contextlib", "functools", "ctypes", "common.state", "common.netns")


@pytest.mark.root
@pytest.mark.parametrize("plugin", sorted(PASS_THROUGH))
def test_pass_through_imports_only_the_config(
    lab: Lab, tmp_path: Path, bare: set[str], plugin: str
) -> None:
    host_end = veth(lab)
    config = conf(lab, host_end, plugin, **PASS_THROUGH[plugin])
    found = {
        command: imported(
            tmp_path, plugin, command, config, netns=lab.ctr.path, host=lab.host.name, env=lab.env
        )
        for command in ("ADD", "CHECK", "DEL")
    }
    kind = f"{plugin}-pass-through"
    problems = [
        f"{plugin} {command}: {problem}"
        for command, imports in found.items()
        for problem in problems_of(imports, bare, command, kind)
    ]
    for command in ("ADD", "CHECK"):
        extra = [m for m in found[command].modules if m in NOT_FOR_PASS_THROUGH_ADD]
        if extra:
            problems.append(f"{plugin} {command} passes through, yet imported {extra}")
    assert not problems, "\n".join(problems)


@pytest.mark.root
def test_flatnet_ipam_verbs_import_only_what_they_use(
    lab: Lab, tmp_path: Path, bare: set[str]
) -> None:
    ipam = {"type": "flatnet-ipam", "subnet": "10.99.0.0/24", "dataDir": str(tmp_path / "leases")}
    config = {"cniVersion": "1.1.0", "name": "importnet", "type": "flatnet-ipam", "ipam": ipam}
    problems = []
    for command in ("ADD", "CHECK", "DEL", "STATUS", "GC"):
        netns = lab.ctr.path if command in ("ADD", "CHECK", "DEL") else ""
        found = imported(tmp_path, "flatnet_ipam", command, config, netns=netns,
                         host=lab.host.name, env=lab.env)  # fmt: skip
        problems += [f"flatnet-ipam {command}: {p}"
                     for p in problems_of(found, bare, command, "flatnet-ipam")]  # fmt: skip
        if command != "GC" and "contextlib" in found.modules:
            problems.append(f"flatnet-ipam {command} imported contextlib")
    assert not problems, "\n".join(problems)

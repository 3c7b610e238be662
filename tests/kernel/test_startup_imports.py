"""What each plugin verb imports: the start-up cost of every container start, guarded
without a clock.

Each verb runs in a fresh `python -IS -X importtime` process started the way
deploy/install.sh's launcher starts it (our packages and the venv's site-packages on
sys.path, no site.py), and that process writes sorted(sys.modules) when it exits. A verb
fails here when it imports a module known to be heavy (HEAVY: milliseconds each on a
small node, or a whole subsystem no plugin has use for), or one named for that verb in
NOT_FOR (another plugin, or a library that verb has no use for: pyroute2's netlink
messages, libnftables through ctypes, the other backend). Cheap modules (contextlib,
functools, collections, ipaddress, ...) are not counted: code is written plainly, not
bent to save one.

pyroute2 (netlink) imports some of the heavy ones itself (`pyroute2.netlink` imports
typing, logging, threading and traceback; `pyroute2.config` multiprocessing, platform and
re; `tcmsg`'s classifiers dataclasses and inspect). Those are tolerated where
`-X importtime` shows one of these libraries importing them first; the same module
imported first by our code fails.
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

from tests.harness.lab import Lab

REPO = Path(__file__).resolve().parents[2]


# Never on a plugin's call path: each costs milliseconds to import or drags in a
# subsystem a plugin does not use (OpenSSL, threads, the compiler's AST, ...). `json`
# compiles regular expressions on import: common.jsontext parses without it.
HEAVY = (
    "json",
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

PLUGINS = ("portmap", "bandwidth", "tuning", "flatnet", "flatnet_ipam")
# The one plugin-to-plugin import the layers allow: flatnet runs flatnet-ipam's library.
LIBRARY_OF = {"flatnet": ("flatnet_ipam",)}
# Besides the other plugins (never imported by one), what each verb must not load.
# VERSION (podman asks every plugin of every list on every command) answers from skel
# alone: no config parsing, no store, no verbs. A verb loads the netlink messages it
# sends and the firewall library of the backend in use, nothing more; ctypes is for
# entering a netns (setns) and for libnftables.
NETLINK = "pyroute2"
NOT_FOR = {
    "VERSION": (NETLINK, "ctypes", "common.config", "common.store"),
    "tuning": ("pyroute2.netlink.rtnl.tcmsg",),
    "bandwidth-unrecorded": (NETLINK,),
    "portmap-pass-through": (NETLINK,),
    "bandwidth-pass-through": (NETLINK,),
    "tuning-pass-through": (NETLINK, "ctypes"),
    "portmap-nftables": ("portmap.xtables", NETLINK),
    # the iptables backend loads libnftables too, for the localhost guard (portmap.localnet)
    "portmap-iptables": (NETLINK,),
    # An IPAM plugin's work is files: no netlink, no ctypes, no ipaddress (flatnet_ipam.addr).
    "flatnet-ipam": (NETLINK, "ipaddress", "ctypes"),
    # pyroute2's tcmsg package would import every qdisc and classifier it knows.
    # flatnet sends link, address and route messages: no tc, and no IPRoute (asyncio).
    "flatnet": ("pyroute2.netlink.rtnl.tcmsg", "pyroute2.iproute"),
    # DEL deletes the host veth, a link message: no address or route classes.
    "flatnet-DEL": ("pyroute2.netlink.rtnl.ifaddrmsg", "pyroute2.netlink.rtnl.rtmsg"),
    "bandwidth": (
        "dataclasses",
        "inspect",
        "pyroute2.netlink.rtnl.tcmsg.sched_htb",
        "pyroute2.netlink.rtnl.tcmsg.sched_cake",
        "pyroute2.netlink.rtnl.tcmsg.cls_basic",
    ),
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
    (tmp / f"stdout-{plugin}-{command}.json").write_bytes(proc.stdout)  # e.g. for CHECK
    assert proc.returncode == 0, f"{plugin} {command} failed: {proc.stdout!r} {proc.stderr!r}"
    return Imports(out.read_text().split(), proc.stderr.decode(errors="replace"))


def problems_of(found: Imports, plugin: str, kind: str) -> list[str]:
    modules = found.modules
    heavy = [m for m in modules if m in HEAVY and not found.first_imported_by_a_library(m)]
    others = tuple(p for p in PLUGINS if p != plugin and p not in LIBRARY_OF.get(plugin, ()))
    unused = (*others, *NOT_FOR.get(kind, ()))
    wrong = [m for m in modules for p in unused if m == p or m.startswith(p + ".")]
    problems = []
    if heavy:
        problems.append(f"heavy modules imported: {heavy}")
    if wrong:
        problems.append(f"modules this verb does not use: {wrong}")
    return problems


@pytest.mark.parametrize("plugin", ["portmap", "bandwidth", "tuning", "flatnet", "flatnet_ipam"])
def test_version_imports_almost_nothing(tmp_path: Path, plugin: str) -> None:
    problems = problems_of(imported(tmp_path, plugin, "VERSION"), plugin, "VERSION")
    assert not problems, f"{plugin} VERSION: " + "\n".join(problems)


def test_version_with_nothing_on_stdin_imports_almost_nothing(
    tmp_path: Path,
) -> None:
    # Some callers send no config with VERSION: that is no version asked, not a JSON error
    # (whose message would import the `json` package).
    found = imported(tmp_path, "tuning", "VERSION", stdin=b"")
    assert "json" not in found.modules
    assert not problems_of(found, "tuning", "VERSION")


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
def test_add_check_del_import_only_what_they_use(lab: Lab, tmp_path: Path, kind: str) -> None:
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
        for problem in problems_of(imports, plugin, kind)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.root
def test_flatnet_add_check_del_import_only_what_they_use(lab: Lab, tmp_path: Path) -> None:
    config: dict[str, Any] = {
        "cniVersion": "1.0.0", "name": "imports", "type": "flatnet", "bridge": "fl0",
        "isGateway": True, "ipMasq": True,
        "ipam": {"type": "flatnet-ipam", "subnet": "10.42.0.0/24",
                 "dataDir": str(tmp_path / "leases")},
    }  # fmt: skip
    found = {}
    for command in ("ADD", "CHECK", "DEL"):
        if command == "CHECK":
            added = json.loads((tmp_path / "stdout-flatnet-ADD.json").read_text())
            config = {**config, "prevResult": added}
        found[command] = imported(
            tmp_path,
            "flatnet",
            command,
            config,
            netns=lab.ctr.path,
            host=lab.host.name,
            env=lab.env,
        )
    problems = [
        f"flatnet {command}: {problem}"
        for command, imports in found.items()
        for problem in problems_of(imports, "flatnet", "flatnet")
    ]
    problems += [f"flatnet DEL: {p}" for p in problems_of(found["DEL"], "flatnet", "flatnet-DEL")]
    assert not problems, "\n".join(problems)


@pytest.mark.root
def test_bandwidth_del_without_a_record_imports_no_netlink_messages(
    lab: Lab, tmp_path: Path
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
        for problem in problems_of(imports, "bandwidth", "bandwidth-unrecorded")
    ]
    assert not problems, "\n".join(problems)


# What a pod without port mappings, bandwidth or link settings sends each plugin.
PASS_THROUGH: dict[str, dict[str, Any]] = {
    "portmap": {"capabilities": {"portMappings": True}},
    "bandwidth": {"capabilities": {"bandwidth": True}},
    "tuning": {},
}
# An ADD or CHECK that passes prevResult through parses the config and stops: it has no
# use for the store, the engine or the netns entry.
NOT_FOR_PASS_THROUGH_ADD = ("ctypes", "common.store", "common.attachment", "common.netns")


@pytest.mark.root
@pytest.mark.parametrize("plugin", sorted(PASS_THROUGH))
def test_pass_through_imports_only_the_config(lab: Lab, tmp_path: Path, plugin: str) -> None:
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
        for problem in problems_of(imports, plugin, kind)
    ]
    for command in ("ADD", "CHECK"):
        extra = [m for m in found[command].modules if m in NOT_FOR_PASS_THROUGH_ADD]
        if extra:
            problems.append(f"{plugin} {command} passes through, yet imported {extra}")
    assert not problems, "\n".join(problems)


@pytest.mark.root
def test_flatnet_ipam_verbs_import_only_what_they_use(lab: Lab, tmp_path: Path) -> None:
    ipam = {"type": "flatnet-ipam", "subnet": "10.99.0.0/24", "dataDir": str(tmp_path / "leases")}
    config = {"cniVersion": "1.1.0", "name": "importnet", "type": "flatnet-ipam", "ipam": ipam}
    problems = []
    for command in ("ADD", "CHECK", "DEL", "STATUS", "GC"):
        netns = lab.ctr.path if command in ("ADD", "CHECK", "DEL") else ""
        found = imported(tmp_path, "flatnet_ipam", command, config, netns=netns,
                         host=lab.host.name, env=lab.env)  # fmt: skip
        problems += [
            f"flatnet-ipam {command}: {p}"
            for p in problems_of(found, "flatnet_ipam", "flatnet-ipam")
        ]
    assert not problems, "\n".join(problems)

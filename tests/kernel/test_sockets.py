"""No plugin opens a socket other than netlink (docs/security.md): nothing listens, nothing
connects, no descriptor is passed to or from another process.

Two checks, either of which fails when someone adds, say, a Unix socket connect:
- statically, every socket constructor in the plugins' own code (their packages and
  `common`; the import contracts keep `cnichain`, the test API and cni-chain, out of a
  plugin process) names its address family, and that family is AF_NETLINK; nothing calls
  connect/listen/accept/sendmsg/recvmsg, and nothing names AF_UNIX, SCM_RIGHTS or peer
  credentials. There is no exception: portmap does not read the legacy iptables nat table
  through a raw IP socket (as iptables-legacy-save does) but leaves that to the tools.
- dynamically, the plugins run under a Python audit hook that records every socket the
  process creates, binds or connects (also through the builtin `_socket`): importing every
  module, VERSION and a refused ADD (unit), and a whole ADD/CHECK/DEL chain with both
  portmap backends against a real kernel in the test's own namespaces (root).
"""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.lab import Lab
from tests.harness.plugins import GO_BIN, REPO, Chain, load_conflist

PLUGIN_CODE = ("common", "portmap", "bandwidth", "tuning")
PLUGINS = ("portmap", "bandwidth", "tuning")
CONSTRUCTORS = {"socket", "socketpair", "fromfd", "fromshare", "create_connection",
                "create_server", "SocketType", "send_fds", "recv_fds"}  # fmt: skip
BANNED_METHODS = {"connect", "connect_ex", "listen", "accept", "sendmsg", "recvmsg"}
BANNED_NAMES = {"AF_UNIX", "AF_LOCAL", "SCM_RIGHTS", "SCM_CREDENTIALS", "SO_PEERCRED",
                "SO_PASSCRED", "SO_PEERPIDFD"}  # fmt: skip


def _names(node: ast.AST) -> set[str]:
    """Every bare name and attribute name in an expression."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
    return out


def _constants(node: ast.expr | None, prefix: str) -> set[str]:
    """The socket module's constants of one kind (AF_, SOCK_, IPPROTO_) an argument names."""
    if node is None:
        return set()
    return {n for n in _names(node) if n.startswith(prefix) and hasattr(socket, n)}


def _arg(call: ast.Call, index: int, keyword: str) -> ast.expr | None:
    if len(call.args) > index:
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


class _Scan(ast.NodeVisitor):
    def __init__(self, rel: str) -> None:
        self.rel = rel
        self.function = ""
        self.sites: list[tuple[str, str]] = []  # (file, function) of each socket constructor
        self.problems: list[str] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def _where(self, node: ast.AST) -> str:
        return f"{self.rel}:{getattr(node, 'lineno', '?')} ({self.function or 'module'})"

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in BANNED_NAMES:
            self.problems.append(f"{self._where(node)} names {node.id}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in BANNED_NAMES:
            self.problems.append(f"{self._where(node)} names {node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        where = self._where(node)
        if isinstance(func, ast.Attribute) and name in BANNED_METHODS:
            self.problems.append(f"{where} calls .{name}()")
        if name in CONSTRUCTORS:
            self.sites.append((self.rel, self.function))
            self._check_constructor(node, name, where)
        self.generic_visit(node)

    def _check_constructor(self, node: ast.Call, name: str, where: str) -> None:
        if name != "socket":
            self.problems.append(f"{where} calls {name}(): only socket(AF_NETLINK, ...) is allowed")
            return
        family = _arg(node, 0, "family")
        families = _constants(family, "AF_")
        if families != {"AF_NETLINK"}:
            said = ", ".join(sorted(families)) or "no literal family"
            self.problems.append(f"{where} opens a socket of {said}: only AF_NETLINK is allowed")


def test_the_plugins_code_opens_only_netlink_sockets() -> None:
    sites: list[tuple[str, str]] = []
    problems: list[str] = []
    for package in PLUGIN_CODE:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            scan = _Scan(rel)
            scan.visit(ast.parse(path.read_text(), rel))
            sites += scan.sites
            problems += scan.problems
    assert problems == []
    # The scan sees the sockets there are (it would pass vacuously if it saw none).
    assert ("common/rtnl.py", "__init__") in sites
    assert set(sites) == {("common/rtnl.py", "__init__")}


# ---------------------------------------------------------------------------- at run time

# Runs one plugin (argv: log file, plugin name or "*" for importing every module) under an
# audit hook that appends one line per socket event to the log file: written at once,
# since a process may leave through os._exit.
PROBE = """
import os, sys
log, what = sys.argv[1], sys.argv[2]
del sys.argv[1:3]
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

def hook(event, args):
    if event == "socket.__new__":
        line = [what, event, args[1], args[2] & 0xFF, args[3]]
    elif event in ("socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg"):
        line = [what, event, args[0].family, args[0].type & 0xFF, args[0].proto]
    else:
        return
    os.write(fd, (" ".join(map(str, line)) + "\\n").encode())

sys.addaudithook(hook)
import importlib
if what == "*":
    import pkgutil
    for package in PACKAGES:
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            importlib.import_module(info.name)
else:
    importlib.import_module(what + ".__main__").main()
""".replace("PACKAGES", repr(PLUGIN_CODE))


def _events(log: Path) -> list[tuple[str, str, int, int, int]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        who, event, family, kind, proto = line.split()
        out.append((who, event, int(family), int(kind), int(proto)))
    return out


def _not_netlink(events: list[tuple[str, str, int, int, int]]) -> list[object]:
    """Events other than making and binding a netlink socket."""
    bad: list[object] = []
    for who, event, family, kind, proto in events:
        if family == socket.AF_NETLINK and event in ("socket.__new__", "socket.bind"):
            continue
        bad.append((who, event, family, kind, proto))
    return bad


def _probe(tmp: Path) -> tuple[Path, Path]:
    probe, log = tmp / "probe.py", tmp / "sockets.log"
    probe.write_text(PROBE)
    return probe, log


def test_no_module_import_and_no_version_or_refused_call_opens_a_socket(tmp_path: Path) -> None:
    """Importing every module, VERSION, and a refused ADD open no socket at
    all (as root this also covers what a plugin does before its work: a hand-over to
    another process would show here)."""
    probe, log = _probe(tmp_path)
    run = [sys.executable, "-I", str(probe), str(log)]
    subprocess.run([*run, "*"], check=True, capture_output=True)
    for plugin in PLUGINS:
        version = subprocess.run(
            [*run, plugin], input=b'{"cniVersion": "1.0.0"}', env={"CNI_COMMAND": "VERSION"},
            capture_output=True, check=False,
        )  # fmt: skip
        assert version.returncode == 0, version.stderr
        assert json.loads(version.stdout)["supportedVersions"]
        refused = subprocess.run(
            [*run, plugin], input=b"{not json", capture_output=True, check=False,
            env={"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
                 "CNI_NETNS": "/proc/self/ns/net", "CNI_PATH": str(GO_BIN)},
        )  # fmt: skip
        assert refused.returncode != 0 and json.loads(refused.stdout)["code"]
    assert _events(log) == []


@pytest.mark.root
@pytest.mark.parametrize("backend", ["nftables", "iptables"])
def test_a_whole_chain_opens_only_netlink_sockets(lab: Lab, backend: str) -> None:
    """ADD, CHECK and DEL of portmap, bandwidth and tuning after the Go bridge, each plugin
    exec'd by cni-chain under the audit hook, in the test's own namespaces."""
    probe, log = _probe(lab.workdir)
    bin_dir = lab.workdir / "probed"
    bin_dir.mkdir()
    for plugin in PLUGINS:
        exe = bin_dir / plugin
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I "{probe}" "{log}" {plugin}\n')
        exe.chmod(0o755)
    conflist = load_conflist("ipv4.conflist", lab.workdir)
    raw = json.loads(conflist.read_text())
    raw["plugins"][1]["backend"] = backend
    conflist.write_text(json.dumps(raw))
    chain = Chain(lab.host, lab.workdir, cni_path=f"{bin_dir}:{GO_BIN}", env=lab.env)
    flags = ("--port", "18080:80/tcp", "--bandwidth", "10000000", "--mac", "02:42:ac:11:00:42")
    chain.add(conflist, lab.ctr, *flags)
    chain.check(conflist, lab.ctr, *flags)
    chain.delete(conflist, lab.ctr, *flags)
    events = _events(log)
    # Every plugin ran and talked to the kernel (the hook saw it): netlink, and nothing else.
    assert {who for who, event, family, *_ in events if family == socket.AF_NETLINK} >= {
        "bandwidth",
        "tuning",
    }
    assert _not_netlink(events) == []

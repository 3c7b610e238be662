"""Hostile input to the three plugins: refused with a clear error or handled safely.

* sysctl keys that try to leave /proc/sys/net (traversal in every spelling, absolute
  paths, symlinks, encoded separators) and keys that try to slip past the allowlist;
* container ids and interface names carrying shell metacharacters, `../` or overlong
  values, and the valid-but-long ids a runtime may send (up to 1024 characters);
* a hostIP of the other family than the container's addresses, or with an IPv6 zone
  id, and conditions that act instead of matching (portmap);
* oversized input: a 10 MB stdin, 100,000 port mappings, one `range` of 65,535 ports,
  answered in bounded time and memory (measured with wait4: wall clock and peak RSS; the
  time bound is only a hang detector);
* state directories 0700 and files 0600 even under a umask of 0, and a state directory
  someone else created first is refused; so is a tuning dataDir someone else owns, with
  symlinks planted in it;
* no `shell=True`, no string command lines, no os.system/os.popen anywhere in the code;
* nothing secret from `args`, `runtimeConfig` or CNI_ARGS reaches the log.

Every kernel test runs in a lab (its own host and container namespaces, the Go bridge's
dual-stack attachment) and reads the kernel back with nft/iptables/ip, never trusting
the plugin's report.
"""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.harness import fuzz
from tests.harness.lab import Lab
from tests.harness.plugins import REPO, PluginRun, invocation, our, run_plugin
from tests.harness.portmap_world import nft_elements

PLUGINS = ("portmap", "bandwidth", "tuning")
ERROR_LINE_LIMIT = 2000  # a clear error is one short line, not a dump of the input


# ---------------------------------------------------------------------------- the lab


@dataclass
class Attached:
    """A lab whose container has eth0 on the Go bridge (10.89.9.x, fd00:89:9::x)."""

    lab: Lab
    prev: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)

    def conf(self, plugin: str, version: str = "1.0.0", **keys: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"cniVersion": version, "name": fuzz.NETWORK, "type": plugin}
        conf["prevResult"] = fuzz.result_in(version, self.prev)
        conf.update(keys)
        return conf

    def run(
        self,
        plugin: str,
        command: str,
        conf: Any,
        *,
        cid: str = "sec1",
        ifname: str = "eth0",
        cni_args: str = "",
        env: dict[str, str] | None = None,
        netns: str | None = None,
    ) -> PluginRun:
        return run_plugin(
            our(plugin),
            command,
            conf,
            host=self.lab.host,
            container_id=cid,
            ifname=ifname,
            netns=self.lab.ctr.path if netns is None else netns,
            cni_args=cni_args,
            env={**self.lab.env, **self.env, **(env or {})},
        )


@pytest.fixture
def attached(lab: Lab) -> Attached:
    prev = fuzz.attach_with_bridge(lab.host, lab.ctr, lab.workdir)
    # No allowlist unless a test writes one: the machine's own must not decide.
    env = {"CNI_TUNING_ALLOWLIST": str(lab.workdir / "no-allowlist.conf")}
    return Attached(lab, prev, env)


def refused(run: PluginRun, code: int) -> dict[str, Any]:
    """A clear refusal: non-zero, one error JSON with `code`, a short message, no traceback."""
    assert run.returncode != 0, f"expected error {code}, got success: {run.stdout[:300]}"
    assert "Traceback" not in run.stdout + run.stderr, run.stderr
    err = fuzz.one_json_object(run.stdout)
    assert err["code"] == code, err
    assert err["msg"] and len(run.stdout) < ERROR_LINE_LIMIT, err
    return err


PORTMAP_KEYS: dict[str, Any] = {
    "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80}]}
}
BANDWIDTH_KEYS = {"egressRate": 1_000_000, "egressBurst": 100_000}
TUNING_KEYS: dict[str, Any] = {"sysctl": {"net.core.somaxconn": "1234"}, "mtu": 1400}
EFFECT: dict[str, dict[str, Any]] = {
    "portmap": PORTMAP_KEYS,
    "bandwidth": BANDWIDTH_KEYS,
    "tuning": TUNING_KEYS,
}


def files_below(root: Path) -> dict[str, int]:
    """Every path below root with its mode."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.lstat().st_mode for p in root.rglob("*")}


# ---------------------------------------------------------------------------- sysctl traversal

# (key, what the refusal says): each key names, or tries to reach, a file outside
# /proc/sys/net. kernel.ostype is read-only, so even a broken check could not change it.
TRAVERSALS = [
    ("net/../kernel/ostype", "'..' part"),
    ("net/ipv4/../../kernel/ostype", "'..' part"),
    ("net.ipv4.conf.IFNAME/../../../../kernel/ostype", "'..' part"),
    ("net/ipv4/conf/IFNAME/../../../../kernel/ostype", "'..' part"),
    ("net.core.somaxconn/..", "'..' part"),
    ("..", "'..' part"),
    ("net/./core/somaxconn", "'..' part"),
    ("net//core/somaxconn", "'..' part"),
    ("net..core.somaxconn", "'..' part"),
    ("/proc/sys/kernel/ostype", "absolute path"),
    ("/proc/sys/net/core/somaxconn", "absolute path"),
    ("kernel.ostype", "not a network sysctl"),
    ("kernel/ostype", "not a network sysctl"),
    ("NET.core.somaxconn", "not a network sysctl"),
    ("net", "not a network sysctl"),
    ("net%2fcore%2fsomaxconn", "not a network sysctl"),
    ("net%2F..%2Fkernel%2Fostype", "'..' part"),
    ("net\u2024core\u2024somaxconn", "not a network sysctl"),  # ONE DOT LEADER
    ("net\\..\\kernel\\ostype", "'..' part"),
    ("net.core.somaxconn ", "white space"),
    ("net.core.somaxconn\x00", "white space or NUL"),
    ("net.core.somaxconn\n", "white space"),
]


@pytest.mark.root
@pytest.mark.parametrize("where", ["sysctl", "args.cni.sysctl"])
@pytest.mark.parametrize(("key", "why"), TRAVERSALS, ids=[repr(k) for k, _ in TRAVERSALS])
def test_sysctl_keys_that_leave_proc_sys_net_are_refused_before_anything_is_written(
    attached: Attached, key: str, why: str, where: str
) -> None:
    ctr = attached.lab.ctr
    before = fuzz.read_sysctl_tree(ctr)
    ostype = Path("/proc/sys/kernel/ostype").read_text()
    settings = {key: "1", "net.core.somaxconn": "999"}  # the valid key must not land either
    keys = {"sysctl": settings} if where == "sysctl" else {"args": {"cni": {"sysctl": settings}}}
    err = refused(attached.run("tuning", "ADD", attached.conf("tuning", **keys)), 7)
    assert why in err["msg"], err
    assert fuzz.read_sysctl_tree(ctr) == before
    assert Path("/proc/sys/kernel/ostype").read_text() == ostype
    assert not [n for n in files_below(attached.lab.state_root / "tuning") if n.endswith(".json")]


@pytest.mark.root
def test_ifname_that_would_widen_a_per_interface_key_is_refused(attached: Attached) -> None:
    """IFNAME stands for CNI_IFNAME: "all" or "default" would make a per-interface key
    namespace-wide (and no interface can have those names)."""
    before = fuzz.read_sysctl_tree(attached.lab.ctr)
    conf = attached.conf("tuning", sysctl={"net.ipv4.conf.IFNAME.rp_filter": "2"})
    for ifname in ("all", "default"):
        err = refused(attached.run("tuning", "ADD", conf, ifname=ifname), 4)
        assert "cannot be an interface name" in err["details"], err
    assert fuzz.read_sysctl_tree(attached.lab.ctr) == before


def test_resolve_refuses_a_symlink_out_of_net(tmp_path: Path) -> None:
    """/proc/sys has no symlinks today; the real-path check is what stops one anyway."""
    from common.errors import CniError
    from tuning.apply import resolve_sysctl

    root = tmp_path / "sys"
    (root / "net" / "core").mkdir(parents=True)
    (root / "net" / "core" / "somaxconn").write_text("4096\n")
    (root / "kernel").mkdir()
    (root / "kernel" / "ostype").write_text("Linux\n")
    (root / "net" / "escape").symlink_to(root / "kernel")
    (root / "net" / "abs").symlink_to("/etc")
    assert resolve_sysctl("net/core/somaxconn", str(root)) == str(root / "net/core/somaxconn")
    for path in ("net/escape/ostype", "net/abs/passwd", "net/escape"):
        with pytest.raises(CniError) as caught:
            resolve_sysctl(path, str(root))
        assert caught.value.code == 7 and "outside" in caught.value.msg


@pytest.mark.root
def test_a_tampered_backup_file_cannot_make_del_write_outside_net(attached: Attached) -> None:
    """The originals DEL writes back come from a file: a path edited into it is refused,
    and forgotten with the file (it could never be put back: a DEL that kept the file
    for it would fail on every retry)."""
    conf = attached.conf("tuning", sysctl={"net.core.somaxconn": "1111"})
    attached.run("tuning", "ADD", conf).ok()
    backup = attached.lab.state_root / "tuning" / "sec1_eth0.json"
    target = attached.lab.workdir / "target"
    target.write_text("untouched\n")
    data = json.loads(backup.read_text())
    escape = "net/../../../.." + str(target)
    data["sysctls"] = [{"path": escape, "value": "pwned"}, *data["sysctls"]]
    backup.write_text(json.dumps(data))
    run = attached.run("tuning", "DEL", conf)
    assert target.read_text() == "untouched\n"
    run.ok()  # the good original is still restored
    assert attached.lab.ctr.sysctl("net.core.somaxconn") != "1111"
    assert not backup.exists()


# ---------------------------------------------------------------------------- allowlist

ALLOWLIST = (
    "# what pods may set\n^net\\.core\\.somaxconn$\nnet\\.ipv4\\.conf\\.IFNAME\\.rp_filter\n"
)


@pytest.mark.root
@pytest.mark.parametrize(
    "keys",
    [
        {"sysctl": {"net/core/somaxconn": "1000"}},  # the allowed key, other spelling
        {"sysctl": {"net.core.somaxconn_x": "1"}},  # prefix of an allowed key
        {"sysctl": {"net.ipv4.conf.eth0.rp_filter": "2"}},  # IFNAME spelled out
        {"sysctl": {"net.ipv4.conf.all.rp_filter": "2"}},
        # passes the list (the match ends at a separator), but no key lies below a file
        {"sysctl": {"net.ipv4.conf.IFNAME.rp_filter.x": "2"}},
        {"sysctl": {"xnet.core.somaxconn": "1"}},
        {"sysctl": {"net.core.somaxconn": "1000", "net.ipv4.ip_forward": "1"}},
        {
            "sysctl": {"net.core.somaxconn": "1000"},
            "args": {"cni": {"sysctl": {"net.ipv4.ip_forward": "1"}}},
        },
        {"args": {"cni": {"sysctl": {"net.ipv4.conf.lo.rp_filter": "2"}}}},
    ],
    ids=lambda keys: json.dumps(keys)[:60],
)
def test_allowlist_cannot_be_bypassed(attached: Attached, keys: dict[str, Any]) -> None:
    allow = attached.lab.workdir / "allowlist.conf"
    allow.write_text(ALLOWLIST)
    env = {"CNI_TUNING_ALLOWLIST": str(allow)}
    before = fuzz.read_sysctl_tree(attached.lab.ctr)
    err = refused(attached.run("tuning", "ADD", attached.conf("tuning", **keys), env=env), 7)
    reasons = ("not allowed", "not a network sysctl", "does not exist")
    assert any(r in err["msg"] for r in reasons), err
    assert fuzz.read_sysctl_tree(attached.lab.ctr) == before
    # the listed keys themselves do pass (the list is not simply refusing everything)
    ok = {"net.core.somaxconn": "1000", "net.ipv4.conf.IFNAME.rp_filter": "2"}
    attached.run("tuning", "ADD", attached.conf("tuning", sysctl=ok), env=env).ok()
    assert attached.lab.ctr.sysctl("net.ipv4.conf.eth0.rp_filter") == "2"
    attached.run("tuning", "DEL", attached.conf("tuning"), env=env).ok()
    assert fuzz.read_sysctl_tree(attached.lab.ctr) == before


@pytest.mark.root
@pytest.mark.parametrize(
    ("content", "code"),
    [("^net\\.core\\.(somaxconn\n", 7), (None, 5)],
    ids=["not-a-regex", "unreadable"],
)
def test_a_broken_allowlist_refuses_instead_of_allowing_all(
    attached: Attached, content: str | None, code: int
) -> None:
    allow = attached.lab.workdir / "allowlist.conf"
    if content is None:
        allow.mkdir()  # reading a directory fails
    else:
        allow.write_text(content)
    conf = attached.conf("tuning", sysctl={"net.core.somaxconn": "1000"})
    refused(attached.run("tuning", "ADD", conf, env={"CNI_TUNING_ALLOWLIST": str(allow)}), code)
    assert attached.lab.ctr.sysctl("net.core.somaxconn") != "1000"


# ---------------------------------------------------------------------------- ids and names


def hostile_values(marker: Path) -> list[str]:
    """Values a shell or a path join would misread, each invalid as a container id and as
    an interface name; `marker` would exist if a shell had run one."""
    rel = os.path.relpath(marker, "/")
    return [
        f"a;touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"a|touch {marker}",
        f"a && touch {marker}",
        f"../../../../../../{rel}",
        f"..{marker}",
        "../state",
        "a/../../b",
        "x\ny",
        "a" * 1025,
        "\u00e4" * 300,
    ]


def snapshot_outside(attached: Attached) -> dict[str, Any]:
    """What a misused id or name could touch besides the kernel: the lab's files."""
    state = attached.lab.state_root
    return {
        # the plugin dirs and their lock files appear on first use: that is all
        "state": {
            p: m
            for p, m in files_below(state).items()
            if not stat.S_ISDIR(m) and not fuzz.is_lock_file(state / p)
        },
        "workdir": sorted(set(os.listdir(attached.lab.workdir)) - {"plugins.log", "state"}),
        "cwd": sorted(os.listdir(os.getcwd())),
        "ctr links": attached.lab.ctr.ip("-d", "link", "show"),
    }


@pytest.mark.root
@pytest.mark.parametrize("plugin", PLUGINS)
@pytest.mark.parametrize("variable", ["CNI_CONTAINERID", "CNI_IFNAME"])
def test_hostile_container_ids_and_ifnames_are_refused_and_write_nothing(
    attached: Attached, plugin: str, variable: str
) -> None:
    marker = attached.lab.workdir / f"pwned-{uuid.uuid4().hex[:8]}"
    before = snapshot_outside(attached)
    values = hostile_values(marker)
    if variable == "CNI_CONTAINERID":
        values += ["-rf", "_x", ".hidden", "a b", "a" * 1025]
    else:
        values += ["eth0123456789012", "\u00eb" * 8, "all", "default", ".", ".."]
    conf = attached.conf(plugin, **EFFECT[plugin])
    for value in values:
        kw: dict[str, Any] = {"cid" if variable == "CNI_CONTAINERID" else "ifname": value}
        for command in ("ADD", "DEL", "CHECK"):
            err = refused(attached.run(plugin, command, conf, **kw), 4)
            assert variable in err["msg"], err
    assert not marker.exists()
    assert snapshot_outside(attached) == before


# Linux takes these as interface names (anything but '/', ':', white space, '.', '..'),
# so a runtime may pass them: they must reach no shell and leave nothing behind.
LEGAL_BUT_SHELLISH_IFNAMES = [
    "a;id",
    "$(id)",
    "`id`",
    "a|id",
    "a&id",
    "'a'",
    '"a"',
    "a>b",
    "-rf",
    "*",
]


@pytest.mark.root
@pytest.mark.parametrize("plugin", PLUGINS)
def test_legal_ifnames_with_shell_characters_are_handled_safely(
    attached: Attached, plugin: str
) -> None:
    before = snapshot_outside(attached)
    conf = attached.conf(plugin, **EFFECT[plugin])
    for ifname in LEGAL_BUT_SHELLISH_IFNAMES:
        add = attached.run(plugin, "ADD", conf, ifname=ifname)
        assert "Traceback" not in add.stdout + add.stderr
        if add.returncode != 0:  # no such interface in the container: a clear error
            assert fuzz.check_error(add.stdout)["code"] in (7, 100), add.stdout
        attached.run(plugin, "DEL", conf, ifname=ifname).ok()
    assert snapshot_outside(attached) == before


@pytest.mark.root
@pytest.mark.parametrize("plugin", PLUGINS)
def test_hostile_network_names_are_refused(attached: Attached, plugin: str) -> None:
    marker = attached.lab.workdir / "pwned-net"
    before = files_below(attached.lab.state_root)
    for name in ("../../x", "a/b", f"$(touch {marker})", "a b", ".hidden", "n" * 1025):
        conf = attached.conf(plugin, **EFFECT[plugin])
        conf["name"] = name
        err = refused(attached.run(plugin, "ADD", conf), 7)
        assert "name" in err["msg"], err
    assert not marker.exists()
    assert files_below(attached.lab.state_root) == before


@pytest.mark.root
@pytest.mark.parametrize("plugin", PLUGINS)
@pytest.mark.parametrize("length", [255, 300, 1024])
def test_long_valid_container_ids_work_and_stay_inside_the_state_root(
    attached: Attached, plugin: str, length: int
) -> None:
    """Runtimes may send ids of up to 1024 characters: every file name stays within
    NAME_MAX, inside <root>/<plugin>/, and DEL removes it."""
    cid = ("c" + uuid.uuid4().hex * 40)[:length]
    conf = attached.conf(plugin, **EFFECT[plugin])
    attached.run(plugin, "ADD", conf, cid=cid).ok()
    files = files_below(attached.lab.state_root / plugin)
    assert any(name.endswith(".json") for name in files), files
    for name in files:
        # portmap's one subdirectory: who needs route_localnet (portmap/localnet.py)
        inside = name.removeprefix("route_localnet/") if plugin == "portmap" else name
        assert len(inside.encode()) <= 255 and "/" not in inside, name
    if plugin == "bandwidth":
        ifb = fuzz_ifb_alias(attached)
        assert ifb.startswith("cni-meta-bandwidth fznet/") and len(ifb.encode()) <= 254
    attached.run(plugin, "CHECK", conf, cid=cid).ok()
    attached.run(plugin, "DEL", conf, cid=cid).ok()
    assert not [n for n in files_below(attached.lab.state_root / plugin) if n.endswith(".json")]


def fuzz_ifb_alias(attached: Attached) -> str:
    links = json.loads(attached.lab.host.ip("-j", "-d", "link", "show", "type", "ifb"))
    assert len(links) == 1, links
    return str(links[0].get("ifalias", ""))


# ---------------------------------------------------------------------------- hostIP family


def nat_rules(attached: Attached) -> tuple[str, str]:
    """(IPv4, IPv6) nat dumps of the host's iptables variant (where the iptables backend
    writes in an empty netns), DNAT targets only."""
    out = []
    for tool in ("iptables-save", "ip6tables-save"):
        text = attached.lab.host.run(tool, "-t", "nat", check=False)
        out.append("\n".join(line for line in text.splitlines() if "DNAT" in line))
    return out[0], out[1]


def dnat_targets(attached: Attached, backend: str) -> tuple[set[str], set[str]]:
    """Container addresses the host's DNAT points at, per family, read from the kernel."""
    v4, v6 = set(), set()
    if backend == "nftables":
        for name, elems in nft_elements(attached.lab.host).items():
            text = json.dumps(elems)
            if name.endswith("4"):
                v4 |= {a for a in ("10.89.9.2",) if a in text}
            if name.endswith("6"):
                v6 |= {a for a in ("fd00:89:9::2",) if a in text}
        return v4, v6
    text4, text6 = nat_rules(attached)
    return ({"10.89.9.2"} if "10.89.9.2" in text4 else set()), (
        {"fd00:89:9::2"} if "fd00:89:9::2" in text6 else set()
    )


@pytest.mark.root
@pytest.mark.parametrize("backend", ["nftables", "iptables"])
@pytest.mark.parametrize(
    ("host_ip", "prev_families", "expect"),
    [
        ("10.89.9.1", "dual", (True, False)),
        ("::ffff:10.89.9.1", "dual", (True, False)),  # an IPv4-mapped address is IPv4
        ("fd00:89:9::1", "dual", (False, True)),
        ("fd00:89:9::1", "v4only", (False, False)),  # nothing of that family to forward to
        ("10.89.9.1", "v6only", (False, False)),
        ("", "v4only", (True, False)),
    ],
)
def test_a_host_ip_only_forwards_within_its_own_family(
    attached: Attached,
    backend: str,
    host_ip: str,
    prev_families: str,
    expect: tuple[bool, bool],
) -> None:
    conf = attached.conf("portmap", backend=backend)
    mapping: dict[str, Any] = {"hostPort": 8080, "containerPort": 80}
    if host_ip:
        mapping["hostIP"] = host_ip
    conf["runtimeConfig"] = {"portMappings": [mapping]}
    if prev_families != "dual":
        want6 = prev_families == "v6only"
        ips = conf["prevResult"]["ips"]
        conf["prevResult"]["ips"] = [ip for ip in ips if (":" in ip["address"]) == want6]
    result = attached.run("portmap", "ADD", conf).ok().json
    assert result["ips"] == conf["prevResult"]["ips"]  # passed through untouched
    v4, v6 = dnat_targets(attached, backend)
    assert (bool(v4), bool(v6)) == expect, (v4, v6)
    attached.run("portmap", "DEL", conf).ok()
    assert dnat_targets(attached, backend) == (set(), set())


# Conditions that act instead of matching: each was accepted by the kernel (the old
# denylist did not know them); the first would let any client's packets add keys to the
# claims set, blocking host ports for every other attachment.
ACTING_CONDITIONS = [
    "update @claims4 { ip saddr . meta l4proto . th dport }",
    "add @hairpin4 { ip saddr . ip daddr }",
    "meter m4 { ip saddr }",
]


@pytest.mark.root
@pytest.mark.parametrize("condition", ACTING_CONDITIONS)
def test_a_condition_that_acts_is_refused_before_the_kernel(
    attached: Attached, condition: str
) -> None:
    conf = attached.conf("portmap", backend="nftables", conditionsV4=[condition], **PORTMAP_KEYS)
    err = refused(attached.run("portmap", "ADD", conf), 7)
    assert "is not an allowed match" in err["msg"], err
    assert not nft_elements(attached.lab.host)  # no table at all


@pytest.mark.root
def test_a_host_ip_with_a_zone_id_is_refused_before_the_kernel(attached: Attached) -> None:
    conf = attached.conf("portmap", backend="nftables")
    mapping = {"hostPort": 8080, "containerPort": 80, "hostIP": "fd00:89:9::1%eth0"}
    conf["runtimeConfig"] = {"portMappings": [mapping]}
    err = refused(attached.run("portmap", "ADD", conf), 7)
    assert "zone" in err["msg"], err
    assert not nft_elements(attached.lab.host)


# ---------------------------------------------------------------------------- oversized input


@dataclass(frozen=True)
class Measured:
    returncode: int
    stdout: str
    seconds: float
    peak_rss_mb: float


def measured(attached: Attached, plugin: str, command: str, stdin: bytes) -> Measured:
    """Exec the plugin in the lab host; wall clock and peak RSS from wait4 (the plugin is
    the process `ip netns exec` execs, so its rusage is the plugin's)."""
    env = {**attached.lab.env, **attached.env, "CNI_PATH": "/usr/lib/cni"}
    inv = invocation(our(plugin), command, stdin, host=attached.lab.host, container_id="big1",
                     netns=attached.lab.ctr.path, env=env)  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-IS", "-c", RSS_WRAPPER, *inv.argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=inv.env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    out: list[bytes] = []

    def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the plugin stopped reading at its limit, as it should

    def drain() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.read())

    threads = [threading.Thread(target=feed), threading.Thread(target=drain)]
    for t in threads:
        t.start()
    deadline = started + 120
    while True:
        pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{plugin} {command} did not finish within 120 s")
        time.sleep(0.01)
    seconds = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join()
    assert proc.stderr is not None
    maxrss_kib = int(proc.stderr.read().split()[-1])
    return Measured(proc.returncode, out[0].decode(), seconds, maxrss_kib / 1024)


# A child's ru_maxrss includes the resident size of the process it was forked from (exec
# folds the old address space's high-water mark in), and pytest is hundreds of MB by the
# end of a session. This small wrapper forks the plugin from a small process of its own,
# waits for it and reports the plugin's ru_maxrss (KiB) on stderr; the plugin's stderr is
# dropped.
RSS_WRAPPER = """
import os, sys
pid = os.fork()
if pid == 0:
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 2)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(str(usage.ru_maxrss) + "\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def assert_bounded(m: Measured, seconds: float, rss_mb: float) -> None:
    # Generous bounds: hang and blow-up detectors, not performance figures (bench/ has those).
    assert m.seconds < seconds, f"took {m.seconds:.1f} s"
    assert m.peak_rss_mb < rss_mb, f"peak RSS {m.peak_rss_mb:.0f} MB"


def big_refusal(m: Measured, code: int) -> dict[str, Any]:
    assert m.returncode != 0 and "Traceback" not in m.stdout, m.stdout[:300]
    err = fuzz.one_json_object(m.stdout)
    assert err["code"] == code and len(m.stdout) < ERROR_LINE_LIMIT, err
    return err


@pytest.mark.root
@pytest.mark.parametrize("plugin", PLUGINS)
@pytest.mark.parametrize("command", ["ADD", "DEL", "VERSION"])
def test_ten_megabytes_of_stdin_are_refused_quickly(
    attached: Attached, plugin: str, command: str
) -> None:
    data = b'{"cniVersion": "1.0.0", "name": "n", "pad": "' + b"x" * (10 << 20) + b'"}'
    m = measured(attached, plugin, command, data)
    assert_bounded(m, seconds=10, rss_mb=150)
    if command == "VERSION":  # never fails, whatever stdin holds
        assert m.returncode == 0 and json.loads(m.stdout)["supportedVersions"]
        return
    err = big_refusal(m, 6)
    assert "bytes, more than the" in err["msg"], err


@pytest.mark.root
def test_a_hundred_thousand_port_mappings_are_refused_quickly(attached: Attached) -> None:
    mappings = [{"hostPort": 1 + i % 65535, "containerPort": 80} for i in range(100_000)]
    conf = attached.conf("portmap", runtimeConfig={"portMappings": mappings})
    m = measured(attached, "portmap", "ADD", json.dumps(conf, separators=(",", ":")).encode())
    assert_bounded(m, seconds=10, rss_mb=150)
    big_refusal(m, 6)
    assert not nft_elements(attached.lab.host)


@pytest.mark.root
@pytest.mark.parametrize("backend", ["nftables", "iptables"])
@pytest.mark.parametrize(
    "mappings",
    [
        [{"hostPort": 1, "containerPort": 1, "range": 65535}],
        # each mapping distinct by hostIP, so no duplicate check would stop them
        [
            {
                "hostPort": 1,
                "containerPort": 1,
                "range": 65535,
                "hostIP": f"127.0.{i // 250}.{i % 250 + 1}",
            }
            for i in range(3000)
        ],
        [
            {"hostPort": 1, "containerPort": 1, "range": 8192, "protocol": p}
            for p in ("tcp", "udp", "sctp")
        ],
    ],
    ids=["one-range-65535", "3000-ranges", "three-protocols"],
)
def test_port_ranges_cannot_blow_up_into_millions_of_rules(
    attached: Attached, backend: str, mappings: list[dict[str, Any]]
) -> None:
    conf = attached.conf("portmap", backend=backend, runtimeConfig={"portMappings": mappings})
    m = measured(attached, "portmap", "ADD", json.dumps(conf).encode())
    assert_bounded(m, seconds=10, rss_mb=150)
    err = big_refusal(m, 7)
    assert "host ports; at most" in err["msg"], err
    assert dnat_targets(attached, backend) == (set(), set())


@pytest.mark.root
@pytest.mark.slow
def test_the_largest_allowed_range_is_served_in_bounded_time_and_memory(
    attached: Attached,
) -> None:
    from portmap.config import MAX_HOST_PORTS

    mapping = {"hostPort": 10000, "containerPort": 10000, "range": MAX_HOST_PORTS}
    conf = attached.conf("portmap", runtimeConfig={"portMappings": [mapping]})
    m = measured(attached, "portmap", "ADD", json.dumps(conf).encode())
    assert m.returncode == 0, m.stdout[:300]
    assert_bounded(m, seconds=60, rss_mb=512)
    elements = nft_elements(attached.lab.host)
    assert len(elements["any4"]) == len(elements["any6"]) == MAX_HOST_PORTS
    m = measured(attached, "portmap", "DEL", json.dumps(conf).encode())
    assert m.returncode == 0, m.stdout[:300]
    assert_bounded(m, seconds=60, rss_mb=512)
    assert not nft_elements(attached.lab.host)


# ---------------------------------------------------------------------------- state modes


def run_with_umask(attached: Attached, plugin: str, conf: dict[str, Any], root: Path) -> PluginRun:
    """ADD as a runtime with umask 0 would run it: modes must not come from the umask."""
    env = {**attached.lab.env, **attached.env, "CNI_PATH": "/usr/lib/cni"}
    env.update(CNI_META_STATE_ROOT=str(root), CNI_META_LOG_FILE=str(root.parent / "plugins.log"))
    inv = invocation(our(plugin), "ADD", conf, host=attached.lab.host, container_id="modes1",
                     netns=attached.lab.ctr.path, env=env)  # fmt: skip
    proc = subprocess.run(
        inv.argv, input=inv.stdin, env=inv.env, capture_output=True, umask=0, check=False
    )
    return PluginRun(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@pytest.mark.root
@pytest.mark.parametrize("plugin", ["portmap-nftables", "portmap-iptables", "bandwidth", "tuning"])
def test_state_dirs_are_0700_and_files_0600_whatever_the_umask(
    attached: Attached, plugin: str
) -> None:
    name, _, backend = plugin.partition("-")
    keys = dict(EFFECT[name])
    if backend:
        keys["backend"] = backend
    root = attached.lab.workdir / "fresh" / "state"  # neither exists yet
    run_with_umask(attached, name, attached.conf(name, logLevel="debug", **keys), root).ok()
    entries = {p: p.lstat() for p in [root.parent, root, *root.rglob("*")]}
    assert any(p.suffix == ".json" for p in entries), list(entries)
    for path, st in entries.items():
        mode = st.st_mode & 0o7777
        assert st.st_uid == 0, path
        if path.is_symlink():
            raise AssertionError(f"unexpected symlink {path}")
        if path.is_dir():
            assert mode == 0o700, f"{path} is {mode:o}"
        else:
            assert mode == 0o600, f"{path} is {mode:o}"
    log = root.parent / "plugins.log"
    assert log.exists() and log.stat().st_mode & 0o777 == 0o600
    env = {"CNI_META_STATE_ROOT": str(root)}
    attached.run(name, "DEL", attached.conf(name, **keys), cid="modes1", env=env).ok()


@pytest.mark.root
@pytest.mark.parametrize("plugin", ["portmap", "bandwidth"])
def test_a_state_dir_someone_else_created_is_refused(attached: Attached, plugin: str) -> None:
    planted = attached.lab.state_root / plugin
    planted.mkdir(parents=True)
    os.chown(planted, 65534, 65534)
    os.chmod(planted, 0o777)
    err = refused(attached.run(plugin, "ADD", attached.conf(plugin, **EFFECT[plugin])), 5)
    assert "belongs to uid 65534" in err["msg"], err
    assert not list(planted.iterdir())
    assert dnat_targets(attached, "nftables") == (set(), set())
    assert not json.loads(attached.lab.host.ip("-j", "link", "show", "type", "ifb"))


@pytest.mark.root
@pytest.mark.parametrize("command", ["ADD", "DEL"])
def test_a_data_dir_with_planted_symlinks_makes_tuning_refuse_and_write_nothing(
    attached: Attached, command: str
) -> None:
    """A dataDir someone else owns, with symlinks at the names of the lock, the backup and
    its temporary file: root wrote through them (overwriting a root-owned file)."""
    data_dir = attached.lab.workdir / "shared-data"
    data_dir.mkdir()
    targets = []
    for name in ("tuning.lock", "sec1_eth0.json", "sec1_eth0.json.tmp"):
        target = attached.lab.workdir / f"target-{name}"
        target.write_text("root's file\n")
        (data_dir / name).symlink_to(target)
        targets.append(target)
    os.chown(data_dir, 65534, 65534)
    sysctl_before = attached.lab.ctr.sysctl("net.core.somaxconn")
    conf = attached.conf("tuning", dataDir=str(data_dir), **TUNING_KEYS)
    err = refused(attached.run("tuning", command, conf), 7)
    assert "belongs to uid 65534" in err["msg"] and "dataDir" in err.get("details", ""), err
    for target in targets:
        assert target.read_text() == "root's file\n" and target.stat().st_uid == 0
    assert attached.lab.ctr.sysctl("net.core.somaxconn") == sysctl_before
    assert sorted(p.name for p in data_dir.iterdir()) == [
        "sec1_eth0.json",
        "sec1_eth0.json.tmp",
        "tuning.lock",
    ]


# ---------------------------------------------------------------------------- no shell

SOURCE_DIRS = ("common", "portmap", "bandwidth", "tuning", "flatnet_ipam", "deploy")
SPAWNERS = {
    ("subprocess", name) for name in ("run", "call", "check_call", "check_output", "Popen")
} | {("os", name) for name in ("system", "popen", "execl", "execlp", "spawnl", "spawnlp")}


def shell_uses(source: str, filename: str) -> list[str]:
    """Calls that would hand a string to a shell: shell=True anywhere, a str (literal,
    f-string, concatenation, %-format) as the command of subprocess, and os.system,
    os.popen and the string forms of exec/spawn."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        where = f"{filename}:{node.lineno}"
        for kw in node.keywords:
            if kw.arg == "shell" and not (
                isinstance(kw.value, ast.Constant) and kw.value.value is False
            ):
                found.append(f"{where}: shell={ast.unparse(kw.value)}")
        func = node.func
        name = ast.unparse(func)
        parts = tuple(name.split(".")[-2:])
        if parts in SPAWNERS or name in {
            "create_subprocess_shell",
            "asyncio.create_subprocess_shell",
        }:
            if parts[0] == "os" or "shell" in name:
                found.append(f"{where}: {name}()")
                continue
            command = (
                node.args[0]
                if node.args
                else next((kw.value for kw in node.keywords if kw.arg == "args"), None)
            )
            if command is not None and _is_string(command):
                found.append(f"{where}: {name}() with a string command {ast.unparse(command)[:60]}")
    return found


def _is_string(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str | bytes)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mod):
        return _is_string(node.left) or _is_string(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in ("format", "join") and _is_string(node.func.value)
    return False


def test_the_shell_checker_recognises_every_form() -> None:
    bad = """
import os, subprocess, asyncio
subprocess.run("ip link", shell=True)
subprocess.run(["ip"], shell=flag)
subprocess.check_output(f"ip {x}")
subprocess.Popen("nft " + rule)
subprocess.call("tc %s" % dev)
subprocess.run(args="iptables -L")
os.system("reboot")
os.popen("id")
asyncio.create_subprocess_shell("id")
"""
    assert len(shell_uses(bad, "bad.py")) == 10, shell_uses(bad, "bad.py")
    good = 'import subprocess\nsubprocess.run(["ip", "link"], check=True, shell=False)\n'
    assert shell_uses(good, "good.py") == []


def test_no_shell_and_no_string_command_lines_anywhere() -> None:
    files = [p for d in SOURCE_DIRS for p in sorted((REPO / d).rglob("*.py"))]
    assert len(files) > 30, files  # the scan really covers the code
    found = [hit for p in files for hit in shell_uses(p.read_text(), str(p.relative_to(REPO)))]
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------- secrets


@pytest.mark.root
@pytest.mark.parametrize("plugin", PLUGINS)
def test_secrets_in_args_and_cni_args_never_reach_the_log(attached: Attached, plugin: str) -> None:
    token = "tok-" + uuid.uuid4().hex
    log = attached.lab.workdir / f"{plugin}-debug.log"
    secrets: dict[str, Any] = {
        "logFile": str(log),
        "logLevel": "debug",
        "args": {
            "cni": {"secret": token, "nested": {"password": token}, "labels": [token]},
            "k8s": {"token": token},
        },
        "runtimeConfig": {"secret": token, "portMappings": [], "bandwidth": {}},
    }
    cni_args = f"IgnoreUnknown=1;K8S_POD_NAME=web-0;K8S_POD_TOKEN={token};SECRET={token}"
    effect = json.loads(json.dumps(EFFECT[plugin]))
    if "runtimeConfig" in effect:  # portmap: keep its mappings beside the secret
        secrets["runtimeConfig"].update(effect.pop("runtimeConfig"))
    conf = attached.conf(plugin, "1.1.0", **effect, **secrets)
    runs = [
        attached.run(plugin, "ADD", conf, cni_args=cni_args).ok(),
        attached.run(plugin, "CHECK", conf, cni_args=cni_args).ok(),
        attached.run(plugin, "STATUS", conf, cni_args=cni_args),
        attached.run(plugin, "DEL", conf, cni_args=cni_args).ok(),
        attached.run(plugin, "GC", conf, cni_args=cni_args),
        # failures log their error: the message must not drag the args along
        attached.run(
            plugin, "ADD", {**conf, "prevResult": {"ips": [{"address": "x"}]}}, cni_args=cni_args
        ),
        attached.run(plugin, "ADD", {**conf, "cniVersion": "9.9.9"}, cni_args=cni_args),
        attached.run(plugin, "ADD", conf, cni_args=cni_args, ifname="bad/if"),
    ]
    assert runs[-1].returncode != 0 and runs[-2].returncode != 0 and runs[-3].returncode != 0
    text = log.read_text()
    assert "DEBUG" in text and "ERROR" in text, text  # the log was really written, at debug
    assert token not in text
    assert token not in (attached.lab.workdir / "plugins.log").read_text()  # CNI_META_LOG_FILE
    for run in runs:
        assert token not in run.stdout and token not in run.stderr, run


# ---------------------------------------------------------------------------- helpers' own check


def test_hostile_values_cover_shell_and_traversal_forms(tmp_path: Path) -> None:
    values = hostile_values(tmp_path / "m")
    assert any(";" in v for v in values) and any("$(" in v for v in values)
    assert any("`" in v for v in values) and any(v.startswith("../") for v in values)
    assert any(len(v) > 1024 for v in values)

"""Every plugin call as a runtime makes it: VERSION, ADD, CHECK, DEL; time, CPU and peak RSS.

Plugins: portmap (our nftables and iptables backends; Go's has only iptables), bandwidth
(both directions shaped) and tuning (mac + mtu + one sysctl: link changes over netlink).
Implementations: Go's (/usr/lib/cni) and ours.

Every case has its own throwaway host netns with a Go bridge, and a container netns whose
eth0 comes from a real Go bridge + host-local ADD, so prevResult is what a runtime
passes. Each round runs, per case, VERSION, ADD (prevResult: the bridge's result), CHECK and
DEL (prevResult: the ADD's result, like libcni's cache); cases of one plugin alternate and
their order rotates every round. Go's bandwidth DEL leaves its tbf and ingress qdisc on the
host veth (see docs/differences.md): they are removed untimed after it.

Each call is one process exec'd by bench/spawn.c from inside the host netns (the bench
enters it with setns: no `ip netns exec` cost on either side): wall time from vfork to
wait4, CPU (user + sys) and ru_maxrss of the plugin process alone.

  python bench/plugin_calls.py [--rounds N] [--quick]
      -> bench/results/plugin_calls.md, plugin_calls.png (every sample: results/raw/)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import (
    GO_BIN,
    SYSTEM_PATH,
    Call,
    Spawner,
    add_launcher_args,
    bar_chart,
    build_spawner,
    can_plot,
    header,
    markdown_table,
    median,
    our_plugins,
    quick_mode,
    results_dir,
    rotated,
    write_raw,
    write_result,
)
from tests.harness import netns as nslib
from tests.harness.netns import Netns

VERBS = ("VERSION", "ADD", "CHECK", "DEL")
PLUGINS = ("portmap (nftables)", "portmap (iptables)", "bandwidth", "tuning")
NETWORK = "benchnet"
VERSION = "1.0.0"
BANDWIDTH = {
    "ingressRate": 10_000_000,
    "ingressBurst": 1_000_000,
    "egressRate": 10_000_000,
    "egressBurst": 1_000_000,
}


def plugin_confs(workdir: Path, case: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """label -> (binary, the plugin's part of the conflist), as a runtime would send it."""
    portmap = {
        "type": "portmap",
        "capabilities": {"portMappings": True},
        "snat": True,
        "runtimeConfig": {
            "portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]
        },
    }
    return {
        "portmap (nftables)": ("portmap", {**portmap, "backend": "nftables"}),
        "portmap (iptables)": ("portmap", {**portmap, "backend": "iptables"}),
        "bandwidth": (
            "bandwidth",
            {
                "type": "bandwidth",
                "capabilities": {"bandwidth": True},
                "runtimeConfig": {"bandwidth": BANDWIDTH},
            },
        ),
        "tuning": (
            "tuning",
            {
                "type": "tuning",
                "mac": "02:42:0a:42:00:07",
                "mtu": 1400,
                "sysctl": {"net.ipv4.conf.eth0.accept_redirects": "0"},
                "dataDir": str(workdir / case / "tuning"),
            },
        ),
    }


def bridge_conf(workdir: Path, case: str) -> dict[str, Any]:
    return {
        "cniVersion": VERSION,
        "name": NETWORK,
        "type": "bridge",
        "bridge": "cmpb0",
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.66.0.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": str(workdir / case / "host-local"),
        },
    }


@dataclass
class Case:
    plugin: str  # table label, e.g. "portmap (nftables)"
    impl: str  # "Go", "ours"
    exe: str
    conf: dict[str, Any]
    host: Netns
    ctr: Netns
    env: dict[str, str]
    prev: dict[str, Any] = field(default_factory=dict)  # the bridge's result
    host_veth: str = ""
    calls: dict[str, list[Call]] = field(default_factory=dict)

    @property
    def exe_argv(self) -> list[str]:
        return [self.exe]

    @property
    def go_check_bug(self) -> bool:
        """Go's portmap 1.1.1 fails every CHECK of an IPv4-only attachment (it looks for
        IPv6 DNAT chains it never made, see docs/differences.md): its CHECK is timed all the
        same."""
        return self.impl == "Go" and self.plugin.startswith("portmap")

    def stdin(self, prev: dict[str, Any] | None) -> bytes:
        conf = {**self.conf, "name": NETWORK, "cniVersion": VERSION}
        if prev is not None:
            conf["prevResult"] = prev
        return json.dumps(conf).encode()

    def env_for(self, verb: str) -> dict[str, str]:
        if verb == "VERSION":
            return {**self.env, "CNI_COMMAND": verb}
        return {
            **self.env,
            "CNI_COMMAND": verb,
            "CNI_CONTAINERID": "bench-ctr",
            "CNI_NETNS": self.ctr.path,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": str(GO_BIN),
        }

    def cycle(self, spawn: Spawner, record: bool) -> None:
        """VERSION, ADD, CHECK, DEL of one attachment (the calls timed)."""
        with self.host.entered():
            out: dict[str, Call] = {}
            version = b'{"cniVersion":"1.0.0"}'
            out["VERSION"] = spawn.ok([self.exe], self.env_for("VERSION"), version)
            out["ADD"] = spawn.ok([self.exe], self.env_for("ADD"), self.stdin(self.prev))
            result = out["ADD"].json()
            check = spawn(self.exe_argv, self.env_for("CHECK"), self.stdin(result))
            if check.returncode != 0 and not self.go_check_bug:
                raise RuntimeError(f"{self.exe} CHECK failed: {check.stdout!r}")
            out["CHECK"] = check
            out["DEL"] = spawn.ok([self.exe], self.env_for("DEL"), self.stdin(result))
        if self.impl == "Go" and self.plugin == "bandwidth":
            # untimed: Go's DEL removes only the ifb; its next ADD would fail on the tbf
            self.host.run("tc", "qdisc", "del", "dev", self.host_veth, "root", check=False)
            self.host.run("tc", "qdisc", "del", "dev", self.host_veth, "ingress", check=False)
        if record:
            for verb, call in out.items():
                self.calls.setdefault(verb, []).append(call)


def attach(spawn: Spawner, case: Case, workdir: Path, label: str) -> None:
    """Go bridge + host-local ADD: the container's eth0 and a real prevResult."""
    case.host.sysctl("net.ipv4.ip_forward", "1")
    conf = json.dumps(bridge_conf(workdir, label)).encode()
    with case.host.entered():
        call = spawn.ok([str(GO_BIN / "bridge")], case.env_for("ADD"), conf)
    case.prev = call.json()
    case.host_veth = next(
        i["name"]
        for i in case.prev["interfaces"]
        if not i.get("sandbox") and i["name"] != "cmpb0" and "mac" in i
    )


def make_cases(
    stack: ExitStack,
    spawn: Spawner,
    workdir: Path,
    our_bin: Path,
    impls: list[str],
    plugins: list[str],
) -> list[Case]:
    cases = []
    for p_index, plugin in enumerate(plugins):
        for impl in impls:
            label = f"c{p_index}-{impl}"
            (workdir / label).mkdir()
            binary, conf = plugin_confs(workdir, label)[plugin]
            if impl == "Go":
                exe = str(GO_BIN / binary)
                conf = {k: v for k, v in conf.items() if k != "backend"}
            else:
                exe = str(our_bin / binary)
            host, ctr = stack.enter_context(nslib.namespaces("bhost", "bctr"))
            env = {
                "PATH": SYSTEM_PATH,
                "CNI_META_STATE_ROOT": str(workdir / label / "state"),
                "CNI_META_LOCK_TIMEOUT": "30",
            }
            case = Case(plugin, impl, exe, conf, host, ctr, env)
            attach(spawn, case, workdir, label)
            cases.append(case)
    return cases


def report(cases: list[Case], impls: list[str], rounds: int) -> str:
    plugins = list(dict.fromkeys(c.plugin for c in cases))
    by = {(c.plugin, c.impl): c for c in cases}
    ours_impls = [i for i in impls if i != "Go"]

    def cell(plugin: str, impl: str, verb: str, what: str) -> float:
        calls = by[(plugin, impl)].calls[verb]
        if what == "ms":
            return median([c.ms for c in calls])
        if what == "cpu":
            return median([c.cpu_seconds * 1000 for c in calls])
        return max(c.rss_mib for c in calls)

    time_rows, cpu_rows, rss_rows = [], [], []
    for plugin in plugins:
        for verb in VERBS:
            go_ms = cell(plugin, "Go", verb, "ms")
            failed = verb == "CHECK" and by[(plugin, "Go")].go_check_bug
            row: list[object] = [plugin, verb, f"{go_ms:.2f} (fails)" if failed else go_ms]
            for impl in ours_impls:
                ms = cell(plugin, impl, verb, "ms")
                row += [ms, f"{ms / go_ms:.1f}x"]
            time_rows.append(row)
            go_cpu = cell(plugin, "Go", verb, "cpu")
            cpu_row: list[object] = [plugin, verb, go_cpu]
            for impl in ours_impls:
                cpu = cell(plugin, impl, verb, "cpu")
                cpu_row += [cpu, f"{cpu / go_cpu:.1f}x"]
            cpu_rows.append(cpu_row)
            rss_row: list[object] = [plugin, verb]
            rss_row += [cell(plugin, impl, verb, "rss") for impl in impls]
            rss_rows.append(rss_row)
    ratio_cols = [c for impl in ours_impls for c in (f"{impl} ms", f"{impl}/Go")]
    cpu_cols = [c for impl in ours_impls for c in (f"{impl} CPU ms", f"{impl}/Go")]
    rss_cols = [f"{impl} MiB" for impl in impls]
    text = header(
        "Plugin calls as a runtime makes them: ours vs Go",
        f"{rounds} interleaved rounds (case order rotating), medians; one exec per call "
        "through bench/spawn.c from inside a throwaway host netns (setns, no `ip netns "
        "exec`); the attachment is a real Go bridge + host-local ADD. Ratios are ours/Go.",
    )
    notes = [
        'Go\'s portmap CHECK "(fails)": 1.1.1 fails every CHECK of an IPv4-only attachment '
        "(it looks for IPv6 DNAT chains it never made); the figure is its failing call.",
    ]
    text += "\n".join(f"- {n}" for n in notes) + "\n\n"
    text += "## Wall time per call (ms)\n\n"
    text += markdown_table(("plugin", "verb", "Go ms", *ratio_cols), time_rows)
    text += "\n\n## CPU time per call (user + sys of the exec'd process, ms)\n\n"
    text += markdown_table(("plugin", "verb", "Go CPU ms", *cpu_cols), cpu_rows)
    text += "\n\n## Peak RSS per call (ru_maxrss of the exec'd process, largest of all rounds)\n\n"
    text += markdown_table(("plugin", "verb", *rss_cols), rss_rows)
    return text + "\n"


def plot(cases: list[Case], impls: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plugins = list(dict.fromkeys(c.plugin for c in cases))
    by = {(c.plugin, c.impl): c for c in cases}
    groups = [p.replace(" (", "\n(") + "\n" + v for p in plugins for v in VERBS]
    fig, axes = plt.subplots(2, 1, figsize=(15, 9))
    ms = {
        impl: [median([c.ms for c in by[(p, impl)].calls[v]]) for p in plugins for v in VERBS]
        for impl in impls
    }
    rss = {
        impl: [max(c.rss_mib for c in by[(p, impl)].calls[v]) for p in plugins for v in VERBS]
        for impl in impls
    }
    bar_chart(path, "Wall time per call (median)", groups, ms, "ms (log)", log=True, ax=axes[0])
    bar_chart(path, "Peak RSS per call", groups, rss, "MiB", hline=40, ax=axes[1])
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7, rotation=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="3 rounds: a smoke test")
    ap.add_argument("--plugins", default=",".join(PLUGINS), help="a subset of: %(default)s")
    add_launcher_args(ap)
    args = ap.parse_args()
    quick_mode(args.quick)
    rounds = 3 if args.quick else args.rounds
    impls = ["Go", "ours"]
    plugins = args.plugins.split(",")
    with tempfile.TemporaryDirectory(prefix="cmpb-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        spawn = Spawner(build_spawner(workdir))
        our_bin = our_plugins(args.launcher, workdir)
        cases = make_cases(stack, spawn, workdir, our_bin, impls, plugins)
        for case in cases:  # warm the page cache and the Go plugins' chains
            case.cycle(spawn, record=False)
        for r in range(rounds):
            for plugin in plugins:
                for case in rotated([c for c in cases if c.plugin == plugin], r):
                    case.cycle(spawn, record=True)
            print(f"round {r + 1}/{rounds} done", flush=True)
        text = report(cases, impls, rounds)
        raw = {
            f"{c.plugin} / {c.impl}": {
                verb: [[x.ms, x.cpu_seconds * 1000, x.rss_kib] for x in calls]
                for verb, calls in c.calls.items()
            }
            for c in cases
        }
        write_raw("plugin_calls.json", {"columns": ["ms", "cpu_ms", "rss_kib"], "cases": raw})
        if can_plot():
            plot(cases, impls, results_dir() / "plugin_calls.png")
    path = write_result("plugin_calls.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

"""The meta chain of one container after the Go bridge: portmap + bandwidth + tuning, ADD + DEL.

One conflist (Go bridge + host-local, then portmap, bandwidth, tuning with a port mapping,
both directions shaped, a mac, an mtu and a sysctl), run the way libcni runs it: ADD in
order with each result threaded into the next plugin's prevResult, DEL in reverse with the
final result. Only which binaries run differs, chosen by CNI_PATH like a runtime does:
Go's (/usr/lib/cni) or ours first.

Each round and implementation (order rotating) gets a fresh container netns: bridge ADD
(untimed), the three meta plugins' ADDs, their DELs (reverse order), bridge DEL (untimed).
Only the six meta-plugin processes are timed, each exec'd by bench/spawn.c from inside the
implementation's own throwaway host netns (setns; no `ip netns exec`). The chain figure
is the median over rounds of the per-round sum of the six calls.

  python bench/meta_chain.py [--rounds N] [--quick] [--also NAME=DIR ...]
      -> bench/results/meta_chain.md, meta_chain.png (every sample: results/raw/)

--also times another build's plugins (DIR: its executables, e.g. what an older commit's
deploy/install.sh --bin-dir made) in the same rounds, as a column of its own: two commits
compared across separate runs also compare two machines' moods.
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
from cnichain.runner import ConfList, Runtime, find_plugin, plugin_config, retyped
from tests.harness import netns as nslib
from tests.harness.netns import Netns

META = ("portmap", "bandwidth", "tuning")
CALLS = tuple(f"{p} {verb}" for verb in ("ADD", "DEL") for p in META)
CAPABILITY_ARGS = {
    "portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}],
    "bandwidth": {
        "ingressRate": 10_000_000,
        "ingressBurst": 1_000_000,
        "egressRate": 10_000_000,
        "egressBurst": 1_000_000,
    },
    "mac": "02:42:0a:42:00:07",
}


def conflist(data_dir: Path) -> ConfList:
    return ConfList.from_json(
        {
            "cniVersion": "1.0.0",
            "name": "benchnet",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cmpb0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": "10.66.0.0/24"}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(data_dir / "host-local"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
                {"type": "bandwidth", "capabilities": {"bandwidth": True}},
                {
                    "type": "tuning",
                    "capabilities": {"mac": True},
                    "mtu": 1400,
                    "sysctl": {"net.ipv4.conf.eth0.accept_redirects": "0"},
                    "dataDir": str(data_dir / "tuning"),
                },
            ],
        }
    )


@dataclass
class Impl:
    name: str  # "Go", "ours"
    cni_path: str
    host: Netns
    workdir: Path
    env: dict[str, str]
    calls: dict[str, list[Call]] = field(default_factory=dict)
    totals: list[float] = field(default_factory=list)  # ms per round, the six calls

    def exec_env(self, command: str, rt: Runtime) -> dict[str, str]:
        return {
            **self.env,
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": rt.container_id,
            "CNI_NETNS": rt.netns,
            "CNI_IFNAME": rt.ifname,
            "CNI_ARGS": rt.cni_args,
            "CNI_PATH": rt.cni_path,
        }

    def round(self, spawn: Spawner, n: int, record: bool) -> None:
        """One container: bridge ADD, meta ADDs, meta DELs, bridge DEL; meta calls timed."""
        confs = conflist(self.workdir)
        version = confs.cni_version
        ctr = nslib.create("bctr")
        try:
            rt = Runtime(
                f"bench{n}", ctr.path, capability_args=CAPABILITY_ARGS, cni_path=self.cni_path
            )
            timed: dict[str, Call] = {}

            def run(command: str, plugin: dict[str, Any], prev: Any) -> Call:
                exe = find_plugin(str(plugin["type"]), rt.cni_path)
                stdin = json.dumps(plugin_config(confs, plugin, rt, prev)).encode()
                return spawn.ok([exe], self.exec_env(command, rt), stdin)

            with self.host.entered():
                result = retyped(run("ADD", confs.plugins[0], None).json(), version)
                for plugin in confs.plugins[1:]:
                    call = run("ADD", plugin, result)
                    timed[f"{plugin['type']} ADD"] = call
                    result = retyped(call.json(), version)
                for plugin in reversed(confs.plugins[1:]):
                    timed[f"{plugin['type']} DEL"] = run("DEL", plugin, result)
                run("DEL", confs.plugins[0], result)
        finally:
            nslib.delete(ctr)
        if record:
            for key, call in timed.items():
                self.calls.setdefault(key, []).append(call)
            self.totals.append(sum(c.ms for c in timed.values()))


def report(impls: list[Impl], rounds: int) -> str:
    go = impls[0]
    ours = impls[1:]
    rows: list[list[object]] = []
    for key in CALLS:
        go_ms = median([c.ms for c in go.calls[key]])
        row: list[object] = [key, go_ms]
        for impl in ours:
            ms = median([c.ms for c in impl.calls[key]])
            row += [ms, f"{ms / go_ms:.2f}x"]
        rows.append(row)
    go_total = median(go.totals)
    total: list[object] = ["**meta chain ADD + DEL**", go_total]
    for impl in ours:
        ms = median(impl.totals)
        total += [ms, f"**{ms / go_total:.2f}x**"]
    rows.append(total)
    cols = [c for impl in ours for c in (f"{impl.name} ms", f"{impl.name}/Go")]

    def cpu(impl: Impl) -> float:
        per_round = zip(*(impl.calls[k] for k in CALLS), strict=True)
        return median([sum(c.cpu_seconds for c in calls) * 1000 for calls in per_round])

    def rss(impl: Impl, plugin: str) -> float:
        return max(c.rss_mib for verb in ("ADD", "DEL") for c in impl.calls[f"{plugin} {verb}"])

    cpu_row: list[object] = ["CPU ms (user + sys of the six exec'd processes)", cpu(go)]
    for impl in ours:
        cpu_row += [cpu(impl), f"{cpu(impl) / cpu(go):.2f}x"]
    rss_rows = [[p, *(rss(impl, p) for impl in impls)] for p in META]
    rss_cols = [f"{i.name} MiB" for i in impls]
    text = header(
        "Meta chain after the Go bridge: portmap + bandwidth + tuning, ADD + DEL",
        f"{rounds} interleaved rounds (implementation order rotating), a fresh container per "
        "round; medians of each call and of the per-round sum of the six meta-plugin "
        "processes (bridge and netns set-up untimed). Each call is one exec through "
        "bench/spawn.c from inside a throwaway host netns (setns, no `ip netns exec`). "
        "Target: at most 1.5x Go's (wall time of the chain).",
    )
    text += markdown_table(("call", "Go ms", *cols), [*rows, cpu_row])
    text += "\n\n## Peak RSS (largest ru_maxrss of the plugin's ADD and DEL processes)\n\n"
    text += markdown_table(("plugin", *rss_cols), rss_rows)
    return text + "\n"


def plot(impls: list[Impl], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    names = [i.name for i in impls]
    bottoms = [0.0] * len(impls)
    for key in CALLS:
        values = [median([c.ms for c in i.calls[key]]) for i in impls]
        ax.bar(names, values, 0.6, bottom=bottoms, label=key)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    for x, impl in enumerate(impls):
        total = median(impl.totals)
        ax.annotate(f"{total:.0f} ms", (x, bottoms[x]), ha="center", va="bottom")
    ax.axhline(median(impls[0].totals), color="grey", linestyle="--", linewidth=1)
    ax.set_ylabel("ms (medians of each call; label: median of per-round sums)")
    ax.set_title("Meta chain ADD + DEL after the Go bridge")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="3 rounds: a smoke test")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                    help="another build's plugin executables, timed beside ours")  # fmt: skip
    add_launcher_args(ap)
    args = ap.parse_args()
    quick_mode(args.quick)
    rounds = 3 if args.quick else args.rounds
    others = dict(spec.split("=", 1) for spec in args.also)
    names = ["Go", "ours", *others]
    with tempfile.TemporaryDirectory(prefix="cmpb-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        spawn = Spawner(build_spawner(workdir))
        our_bin = our_plugins(args.launcher, workdir)
        impls = []
        for name in names:
            (host,) = stack.enter_context(nslib.namespaces("bhost"))
            host.sysctl("net.ipv4.ip_forward", "1")
            data = workdir / name
            data.mkdir()
            env = {
                "PATH": SYSTEM_PATH,
                "CNI_META_STATE_ROOT": str(data / "state"),
                "CNI_META_LOCK_TIMEOUT": "30",
            }
            plugins = others.get(name, our_bin)
            cni_path = str(GO_BIN) if name == "Go" else f"{plugins}:{GO_BIN}"
            impls.append(Impl(name, cni_path, host, data, env))
        for impl in impls:  # warm the page cache and the Go plugins' chains
            impl.round(spawn, 0, record=False)
        for r in range(rounds):
            for impl in rotated(impls, r):
                impl.round(spawn, r + 1, record=True)
            print(f"round {r + 1}/{rounds} done", flush=True)
        text = report(impls, rounds)
        write_raw(
            "meta_chain.json",
            {
                "columns": ["ms", "cpu_ms", "rss_kib"],
                "impls": {
                    i.name: {
                        "totals_ms": i.totals,
                        **{
                            k: [[c.ms, c.cpu_seconds * 1000, c.rss_kib] for c in v]
                            for k, v in i.calls.items()
                        },
                    }
                    for i in impls
                },
            },
        )
        if can_plot():
            plot(impls, results_dir() / "meta_chain.png")
    path = write_result("meta_chain.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

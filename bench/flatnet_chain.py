"""flatnet + flatnet-ipam against the Go bridge + host-local, ADD + DEL, whole processes.

Four cases, each run the way libcni runs a list (ADD in order, each result the next
plugin's prevResult; DEL in reverse with the final result), every call one exec through
bench/spawn.c from inside the implementation's own throwaway host netns:

  plain        main plugin alone: IPv4, isGateway
  ipmasq       main plugin alone: IPv4, isGateway, ipMasq
  dual-ipmasq  main plugin alone: IPv4 + IPv6, isGateway, ipMasq
  pod-chain    main plugin (ipMasq) + portmap + bandwidth + tuning: the whole pod chain

Go: bridge with host-local (exec'd by bridge), then Go's portmap, bandwidth, tuning, all
from /usr/lib/cni. Ours: flatnet with flatnet-ipam (in-process), then our portmap,
bandwidth, tuning; no Go plugin in its CNI_PATH. Rounds are interleaved (case and
implementation order rotating), a fresh container netns per call sequence; a case's
figure is the median over rounds of the per-round sum of its calls (ADD + DEL).

  python bench/flatnet_chain.py [--rounds N] [--quick] [--note TEXT]
      -> bench/results/flatnet_chain.md (every sample: results/raw/flatnet_chain.json)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import (
    GO_BIN,
    SYSTEM_PATH,
    Spawner,
    add_launcher_args,
    build_spawner,
    header,
    markdown_table,
    median,
    our_plugins,
    quick_mode,
    rotated,
    write_raw,
    write_result,
)
from cnichain.runner import ConfList, Runtime, find_plugin, plugin_config, retyped
from tests.harness import netns as nslib
from tests.harness.netns import Netns

CASES = ("plain", "ipmasq", "dual-ipmasq", "pod-chain")
TARGETS = {"plain": 1.5, "ipmasq": 1.0, "dual-ipmasq": 1.0, "pod-chain": 1.25}
CAPABILITY_ARGS = {
    "portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}],
    "bandwidth": {"ingressRate": 10_000_000, "ingressBurst": 1_000_000,
                  "egressRate": 10_000_000, "egressBurst": 1_000_000},
    "mac": "02:42:0a:42:00:07",
}  # fmt: skip


def conflist(case: str, impl: str, data: Path) -> ConfList:
    ranges = [[{"subnet": "10.66.0.0/24"}]]
    if case == "dual-ipmasq":
        ranges.append([{"subnet": "fd66::/64"}])
    main: dict[str, Any] = {
        "type": "bridge" if impl == "Go" else "flatnet",
        "bridge": "cmpb0",
        "isGateway": True,
        "ipMasq": case != "plain",
        "ipam": {"type": "host-local" if impl == "Go" else "flatnet-ipam", "ranges": ranges,
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(data / "leases")},
    }  # fmt: skip
    plugins = [main]
    if case == "pod-chain":
        plugins += [
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
            {"type": "bandwidth", "capabilities": {"bandwidth": True}},
            {"type": "tuning", "capabilities": {"mac": True}, "mtu": 1400,
             "dataDir": str(data / "tuning")},
        ]  # fmt: skip
    return ConfList.from_json({"cniVersion": "1.0.0", "name": f"bench-{case}", "plugins": plugins})


class Impl:
    def __init__(self, name: str, cni_path: str, host: Netns, data: Path, env: dict[str, str]):
        self.name = name
        self.cni_path = cni_path
        self.host = host
        self.data = data
        self.env = env
        self.totals: dict[str, list[float]] = {case: [] for case in CASES}
        self.cpu: dict[str, list[float]] = {case: [] for case in CASES}
        self.calls: dict[str, dict[str, list[float]]] = {case: {} for case in CASES}

    def round(self, spawn: Spawner, case: str, n: int, record: bool) -> None:
        confs = conflist(case, self.name, self.data)
        ctr = nslib.create("bctr")
        timed: dict[str, float] = {}
        cpu: list[float] = []
        try:
            rt = Runtime(f"bench{n}", ctr.path, capability_args=CAPABILITY_ARGS,
                         cni_path=self.cni_path)  # fmt: skip

            def run(command: str, plugin: dict[str, Any], prev: Any) -> Any:
                exe = find_plugin(str(plugin["type"]), rt.cni_path)
                stdin = json.dumps(plugin_config(confs, plugin, rt, prev)).encode()
                env = {**self.env, "CNI_COMMAND": command, "CNI_CONTAINERID": rt.container_id,
                       "CNI_NETNS": rt.netns, "CNI_IFNAME": rt.ifname, "CNI_ARGS": rt.cni_args,
                       "CNI_PATH": rt.cni_path}  # fmt: skip
                call = spawn.ok([exe], env, stdin)
                timed[f"{plugin['type']} {command}"] = call.ms
                cpu.append(call.cpu_seconds * 1000)
                return call

            result = None
            with self.host.entered():
                for plugin in confs.plugins:
                    result = retyped(run("ADD", plugin, result).json(), confs.cni_version)
                for plugin in reversed(confs.plugins):
                    run("DEL", plugin, result)
        finally:
            nslib.delete(ctr)
        if record:
            self.totals[case].append(sum(timed.values()))
            self.cpu[case].append(sum(cpu))
            for key, ms in timed.items():
                self.calls[case].setdefault(key, []).append(ms)


def report(impls: list[Impl], rounds: int, note: str) -> str:
    go, ours = impls
    rows: list[list[object]] = []
    for case in CASES:
        g, o = median(go.totals[case]), median(ours.totals[case])
        ok = "yes" if o / g <= TARGETS[case] else "no"
        gc, oc = median(go.cpu[case]), median(ours.cpu[case])
        rows.append([case, g, o, f"**{o / g:.2f}x**", f"{TARGETS[case]:.2f}x", ok, gc, oc,
                     f"{oc / gc:.2f}x"])  # fmt: skip
    detail: list[list[object]] = []
    for case in CASES:
        for (gk, gv), (ok_, ov) in zip(go.calls[case].items(), ours.calls[case].items(),
                                       strict=True):  # fmt: skip
            detail.append([case, gk, median(gv), ok_, median(ov)])
    how = (
        f"{rounds} interleaved rounds (case and implementation order rotating), a fresh "
        "container netns per call sequence; medians over rounds of the per-round sum of "
        "the case's exec'd processes, ADD then DEL (bench/spawn.c from inside a throwaway "
        "host netns). Go: bridge + host-local (+ Go's portmap, bandwidth, tuning); ours: "
        "flatnet with flatnet-ipam in-process (+ our portmap, bandwidth, tuning), no Go "
        "plugin in its CNI_PATH. Targets: issue 32, item 7 (wall time). CPU: user + sys "
        "of the case's processes, medians of per-round sums (less sensitive to a loaded "
        "machine than wall time)."
    )
    if note:
        how += f"\n\n**{note}**"
    text = header("flatnet + flatnet-ipam vs bridge + host-local, ADD + DEL", how)
    cols = ("case", "Go ms", "ours ms", "ours/Go", "target", "met", "Go CPU ms", "our CPU ms",
            "CPU ours/Go")  # fmt: skip
    text += markdown_table(cols, rows)
    text += "\n\n## Each call (medians, ms)\n\n"
    text += markdown_table(("case", "Go call", "Go ms", "our call", "ours ms"), detail)
    return text + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="3 rounds: a smoke test")
    ap.add_argument("--note", default="", help="a line for the result (e.g. a loaded machine)")
    add_launcher_args(ap)
    args = ap.parse_args()
    quick_mode(args.quick)
    rounds = 3 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="cmpb-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        spawn = Spawner(build_spawner(workdir))
        our_bin = our_plugins(args.launcher, workdir)
        impls = []
        for name in ("Go", "ours"):
            (host,) = stack.enter_context(nslib.namespaces("bhost"))
            host.sysctl("net.ipv4.ip_forward", "1")
            host.sysctl("net.ipv6.conf.all.forwarding", "1")
            data = workdir / name
            data.mkdir()
            env = {"PATH": SYSTEM_PATH, "CNI_META_STATE_ROOT": str(data / "state"),
                   "CNI_META_LOCK_TIMEOUT": "30"}  # fmt: skip
            cni_path = str(GO_BIN) if name == "Go" else str(our_bin)
            impls.append(Impl(name, cni_path, host, data, env))
        for case in CASES:  # warm: page cache, the bridge, the shared chains
            for impl in impls:
                impl.round(spawn, case, 0, record=False)
        for r in range(rounds):
            for case in rotated(CASES, r):
                for impl in rotated(impls, r):
                    impl.round(spawn, case, r + 1, record=True)
            print(f"round {r + 1}/{rounds} done", flush=True)
        text = report(impls, rounds, args.note)
        write_raw("flatnet_chain.json", {i.name: {"totals_ms": i.totals, "calls_ms": i.calls}
                                         for i in impls})  # fmt: skip
    path = write_result("flatnet_chain.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

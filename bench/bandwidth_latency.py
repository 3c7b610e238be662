"""ADD / CHECK / DEL latency of bandwidth, ours vs Go's, and where our time goes.

Each call is a cold process, as a runtime makes it: a host netns where the plugins run, a
container netns with eth0, the host end of the veth listed in a hand-made prevResult.
Both directions are shaped (so ADD makes the ifb, two tbfs, the ingress qdisc and the
filter). Ours and Go's alternate round by round; after Go's DEL (which leaves its tbf and
ingress qdisc on the veth, see docs/differences.md) the veth is cleaned untimed.

The second table splits our ADD: interpreter start, imports (python -X importtime style,
measured as cold-process wall time, medians) and the netlink work itself.

  python bench/bandwidth_latency.py [--rounds N] [--quick]   -> bench/results/bandwidth_latency.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import interleaved, machine_line, markdown_table, quick_mode, write_result
from tests.harness import netns as nslib

VENV_BIN = Path(sys.executable).parent
OURS = str(VENV_BIN / "bandwidth")
GO = "/usr/lib/cni/bandwidth"
BANDWIDTH = {
    "ingressRate": 10_000_000,
    "ingressBurst": 1_000_000,
    "egressRate": 10_000_000,
    "egressBurst": 1_000_000,
}


def timed(argv: list[str], env: dict[str, str], stdin: bytes) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, input=stdin, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} {env['CNI_COMMAND']} failed: {proc.stdout!r}")
    return elapsed


def import_costs(rounds: int) -> list[tuple[str, float]]:
    """Cold-process wall time of `python -c <imports>`, medians, minus the bare start."""
    py = sys.executable
    ours = "import bandwidth.verbs, bandwidth.tc as t; t.tc_modules()"  # what ADD loads
    iproute_lean = (
        "import bandwidth.verbs, common.rtnl as n\n"
        "n._register_package_without_init('pyroute2')\n"
        "from pyroute2.iproute.linux import IPRoute\n"
    )
    cases = {
        "interpreter start (python -c pass)": "pass",
        "common ADD path (skel, config, result)": "import common.skel, common.config",
        "... + bandwidth modules (no pyroute2)": "import bandwidth.verbs, bandwidth.tc",
        "... + pyroute2 messages + tc modules (ours)": ours,
        "... + pyroute2 IPRoute, __init__ deferred": iproute_lean,
        "... + pyroute2 IPRoute via `import pyroute2`": "import bandwidth.verbs, pyroute2",
        "asyncio alone (IPRoute needs it)": "import asyncio",
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, code in cases.items():
            start = time.perf_counter()
            subprocess.run([py, "-c", code], check=True)
            samples[name].append(time.perf_counter() - start)
    base = statistics.median(samples["interpreter start (python -c pass)"])
    out = []
    for name, values in samples.items():
        m = statistics.median(values)
        out.append((name, m * 1000 if name.startswith("interpreter") else (m - base) * 1000))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="a few rounds: a smoke test")
    args = ap.parse_args()
    quick_mode(args.quick)
    if args.quick:
        args.rounds = 3
    with tempfile.TemporaryDirectory() as tmp, nslib.namespaces("bhost", "bctr") as (host, ctr):
        host.ip("link", "add", "vbench", "type", "veth", "peer", "name", "eth0", "netns", ctr.name)
        host.ip("link", "set", "vbench", "up")
        ctr.ip("link", "set", "eth0", "up")
        prev = {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "vbench"}, {"name": "eth0", "sandbox": ctr.path}],
            "ips": [{"address": "10.0.0.2/24", "interface": 1}],
        }
        conf = json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "bench",
                "type": "bandwidth",
                "runtimeConfig": {"bandwidth": BANDWIDTH},
                "prevResult": prev,
            }
        ).encode()

        def env(command: str, cid: str) -> dict[str, str]:
            return {
                "PATH": "/usr/bin:/bin",
                "CNI_COMMAND": command,
                "CNI_CONTAINERID": cid,
                "CNI_NETNS": ctr.path,
                "CNI_IFNAME": "eth0",
                "CNI_PATH": "/usr/lib/cni",
                "CNI_META_STATE_ROOT": str(Path(tmp) / "state"),
            }

        def call(exe: str, command: str, cid: str) -> float:
            return timed([exe], env(command, cid), conf)

        def go_cleanup() -> float:
            # untimed: Go's DEL deletes only the ifb; its next ADD would fail on the tbf
            host.run("tc", "qdisc", "del", "dev", "vbench", "root", check=False)
            host.run("tc", "qdisc", "del", "dev", "vbench", "ingress", check=False)
            return 0.0

        with host.entered():
            cases = {
                "ADD ours": lambda: call(OURS, "ADD", "ours1"),
                "CHECK ours": lambda: call(OURS, "CHECK", "ours1"),
                "second ADD ours (converged)": lambda: call(OURS, "ADD", "ours1"),
                "DEL ours": lambda: call(OURS, "DEL", "ours1"),
                "ADD go": lambda: call(GO, "ADD", "go1"),
                "CHECK go": lambda: call(GO, "CHECK", "go1"),
                "DEL go": lambda: call(GO, "DEL", "go1"),
                "(cleanup)": go_cleanup,
            }
            for fn in cases.values():  # warm the page cache
                fn()
            series = interleaved(cases, args.rounds)
    rows = []
    for verb in ("ADD", "CHECK", "DEL"):
        go = series[f"{verb} go"].median_ms
        ours = series[f"{verb} ours"].median_ms
        rows.append((verb, ours, go, ours / go))
    second = series["second ADD ours (converged)"].median_ms
    imports = import_costs(max(5, args.rounds // 2))
    text = (
        "# bandwidth: ADD / CHECK / DEL latency, ours vs Go\n\n"
        f"{machine_line()}; {args.rounds} interleaved rounds, medians of cold process calls; "
        "both directions shaped (ifb, 2 tbf, ingress qdisc, u32 redirect).\n\n"
        + markdown_table(("verb", "ours ms", "Go ms", "ours/Go"), rows)
        + f"\n\nA second ADD on converged state (ours; Go fails with 'file exists'): "
        f"{second:.1f} ms.\n\n"
        "## Where our ADD time goes (cold process wall time, medians, ms)\n\n"
        "Rows after the first are the extra cost over a bare interpreter start.\n\n"
        + markdown_table(("what", "ms"), imports)
        + "\n"
    )
    path = write_result("bandwidth_latency.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

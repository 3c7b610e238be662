"""ADD and DEL latency of tuning, ours vs Go's, for a sysctl-only and a mac+mtu config.

Each round runs ADD then DEL of one attachment for every case, cases interleaved so noise
from the shared machine hits ours and Go's alike; figures are medians. Everything runs in
throwaway namespaces (a host netns where the plugins run, a container netns per case with
an eth0), never in the machine's own; dataDirs live in a temporary directory.

  python bench/tuning_latency.py [--rounds N] [--quick]   -> bench/results/tuning_latency.md
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import exec_seconds, machine_line, markdown_table, quick_mode, write_result
from tests.harness import netns as nslib
from tests.harness.netns import Netns

REPO = Path(__file__).resolve().parents[1]
OURS = str(Path(sys.executable).parent / "tuning")
GO = "/usr/lib/cni/tuning"
CONFIGS: dict[str, dict[str, object]] = {
    "sysctl only": {
        "sysctl": {
            "net.ipv4.conf.IFNAME.accept_redirects": "0",
            "net.core.somaxconn": "1024",
        }
    },
    "mac + mtu": {"mac": "02:42:0a:59:00:07", "mtu": 1400},
}


def attachment(host: Netns, ctr: Netns, n: int) -> None:
    host.ip("link", "add", f"vb{n}", "type", "veth", "peer", "name", "eth0", "netns", ctr.name)


def stdin_for(ctr: Netns, data_dir: str, keys: dict[str, object]) -> bytes:
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": ctr.path}],
        "ips": [{"address": "10.0.0.2/24", "interface": 0}],
    }
    conf = {
        "cniVersion": "1.0.0",
        "name": "bench",
        "type": "tuning",
        "dataDir": data_dir,
        "prevResult": prev,
        **keys,
    }
    return json.dumps(conf).encode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="a few rounds: a smoke test")
    args = ap.parse_args()
    quick_mode(args.quick)
    if args.quick:
        args.rounds = 3
    # What an installed plugin has: byte-compiled modules (PYTHONDONTWRITEBYTECODE in a
    # developer's shell would otherwise make every exec recompile the edited sources).
    for package in ("common", "tuning"):
        compileall.compile_dir(str(REPO / package), quiet=1)
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    cases: dict[tuple[str, str], tuple[Callable[[], float], Callable[[], float]]] = {}
    made: list[Netns] = []
    with tempfile.TemporaryDirectory() as tmp, nslib.namespaces("bhost") as (host,):
        try:
            for config_name, keys in CONFIGS.items():
                for impl, exe in (("go", GO), ("ours", OURS)):
                    ctr = nslib.create("bctr")
                    made.append(ctr)
                    attachment(host, ctr, len(made))
                    data = stdin_for(ctr, f"{tmp}/{impl}", keys)
                    env = {
                        **base_env,
                        "CNI_CONTAINERID": "bench1",
                        "CNI_NETNS": ctr.path,
                        "CNI_IFNAME": "eth0",
                        "CNI_PATH": "/usr/lib/cni",
                    }
                    add_env = {**env, "CNI_COMMAND": "ADD"}
                    del_env = {**env, "CNI_COMMAND": "DEL"}

                    def add(e: str = exe, a: dict[str, str] = add_env, d: bytes = data) -> float:
                        return exec_seconds([e], a, d)

                    def delete(e: str = exe, x: dict[str, str] = del_env, d: bytes = data) -> float:
                        return exec_seconds([e], x, d)

                    cases[(config_name, impl)] = (add, delete)
            samples: dict[tuple[str, str, str], list[float]] = {}
            with host.entered():  # children inherit the host netns; no `ip netns exec` cost
                for add_fn, del_fn in cases.values():  # warm the page cache once
                    add_fn()
                    del_fn()
                for _ in range(args.rounds):
                    for (config_name, impl), (add_fn, del_fn) in cases.items():
                        samples.setdefault((config_name, impl, "ADD"), []).append(add_fn())
                        samples.setdefault((config_name, impl, "DEL"), []).append(del_fn())
        finally:
            for ns in made:
                nslib.delete(ns)

    rows = []
    for config_name in CONFIGS:
        for verb in ("ADD", "DEL"):
            go_ms = statistics.median(samples[(config_name, "go", verb)]) * 1000
            ours_ms = statistics.median(samples[(config_name, "ours", verb)]) * 1000
            rows.append((config_name, verb, go_ms, ours_ms, ours_ms / go_ms))
    text = (
        "# tuning: ADD and DEL latency, ours vs Go\n\n"
        f"{machine_line()}; {args.rounds} interleaved rounds of ADD+DEL per case, medians. "
        "Each call is one exec of the plugin from a process already inside the host netns.\n\n"
        + markdown_table(("config", "verb", "Go ms", "ours ms", "ratio ours/Go"), rows)
        + "\n"
    )
    path = write_result("tuning_latency.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

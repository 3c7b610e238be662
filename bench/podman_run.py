"""`podman run -d` + `podman rm -f` wall time: our chain vs the Go chain, as users see it.

podman 4 (CNI backend, runc) runs exactly as in tests/runtimes/test_podman.py: inside a
throwaway host netns and a private mount namespace (private /var/lib and /run), with its
own storage, containers.conf, network dir and CNI cache; the image is the tests' local
busybox-static one (no registry). Nothing of the machine's own netns, podman storage or
/var/lib/cni is touched.

Implementations (each with its own podman world, so they never share a bridge or rules):
  Go           cni_plugin_dirs = /usr/lib/cni
  ours         our plugins installed by deploy/install.sh first, then /usr/lib/cni

Lists: "default" is conflists/podman-bridge.conflist (bridge, portmap, firewall, tuning:
podman's own default shape); "shaped" adds a static bandwidth plugin (podman never sends a
bandwidth capability), so that all three of ours run. Each round runs, per list and
implementation (order rotating), `podman run -d -p 18080:80 ... httpd` and then
`podman rm -f -t 0`, timed from the bench (the nsenter wrapper included, alike for all).

  python bench/podman_run.py [--rounds N] [--quick]
      -> bench/results/podman_run.md, podman_run.png (every sample: results/raw/)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import (
    bar_chart,
    can_plot,
    header,
    markdown_table,
    median,
    quick_mode,
    results_dir,
    rotated,
    write_raw,
    write_result,
)
from tests.harness import netns as nslib
from tests.harness.runtimes import (
    Podman,
    have,
    install_ours,
    plugin_dirs,
    podman,
    write_conflist,
)

LIST = "podman-bridge.conflist"
HTTPD = ("httpd", "-f", "-p", "80", "-h", "/www")
SHAPED = {
    "type": "bandwidth",
    "ingressRate": 8_000_000,
    "ingressBurst": 400_000,
    "egressRate": 8_000_000,
    "egressBurst": 400_000,
}
STEPS = ("run -d", "rm -f", "run + rm")


@dataclass
class World:
    name: str  # "Go", "ours"
    pm: Podman
    networks: dict[str, str]  # list label -> podman network name
    samples: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def cycle(self, label: str, n: int, record: bool) -> None:
        name = f"bench-{label}-{n}"
        start = time.perf_counter()
        self.pm.run(
            "run", "-d", "--name", name, "--network", self.networks[label],
            "-p", "18080:80", self.pm.image, *HTTPD,
        )  # fmt: skip
        ran = time.perf_counter()
        self.pm.run("rm", "-f", "-t", "0", name)
        removed = time.perf_counter()
        if record:
            for step, seconds in (
                ("run -d", ran - start),
                ("rm -f", removed - ran),
                ("run + rm", removed - start),
            ):
                self.samples.setdefault((label, step), []).append(seconds)


def add_networks(pm: Podman, workdir: Path) -> dict[str, str]:
    """The default list as the runtime tests use it, and a shaped one on its own bridge."""
    default = pm.add_network(LIST)
    raw: dict[str, Any] = write_conflist(LIST, workdir / "shaped-src", pm.workdir, (SHAPED,))
    raw["name"] = "cmp-podman-bw"
    raw["plugins"][0]["bridge"] = "cni-podman8"
    raw["plugins"][0]["ipam"]["ranges"] = [[{"subnet": "10.89.8.0/24", "gateway": "10.89.8.1"}]]
    (pm.net_dir / "podman-shaped.conflist").write_text(json.dumps(raw, indent=2))
    return {"default": default, "shaped": "cmp-podman-bw"}


def report(worlds: list[World], labels: list[str], rounds: int) -> str:
    go, ours = worlds[0], worlds[1:]
    rows: list[list[object]] = []
    for label in labels:
        for step in STEPS:
            go_s = median(go.samples[(label, step)]) * 1000
            row: list[object] = [label, step, go_s]
            for w in ours:
                ms = median(w.samples[(label, step)]) * 1000
                row += [ms, f"{ms / go_s:.2f}x"]
            rows.append(row)
    cols = [c for w in ours for c in (f"{w.name} ms", f"{w.name}/Go")]
    text = header(
        "podman run -d + podman rm -f: our chain vs the Go chain",
        f"podman 4 with the CNI backend and runc, vfs storage, in a throwaway host netns "
        f"and private mount namespace; {rounds} interleaved rounds (implementation order "
        "rotating), medians of wall time measured around each podman command. "
        "default = conflists/podman-bridge.conflist (bridge, portmap, firewall, tuning); "
        "shaped = the same plus a static bandwidth plugin.",
    )
    text += markdown_table(("list", "command", "Go ms", *cols), rows)
    return text + "\n"


def plot(worlds: list[World], labels: list[str], path: Path) -> None:
    groups = [f"{label}\n{step}" for label in labels for step in STEPS]
    series = {
        w.name: [median(w.samples[(label, step)]) * 1000 for label in labels for step in STEPS]
        for w in worlds
    }
    bar_chart(path, "podman run -d / rm -f wall time (median)", groups, series, "ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="2 rounds, default list: a smoke test")
    ap.add_argument("--lists", default="default,shaped")
    args = ap.parse_args()
    quick_mode(args.quick)
    if not (have("podman") and have("runc")):
        sys.exit("podman and runc are needed (make apt installs them)")
    rounds = 2 if args.quick else args.rounds
    labels = ["default"] if args.quick else args.lists.split(",")
    names = ["Go", "ours"]
    with tempfile.TemporaryDirectory(prefix="cmpb-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        our_bin = install_ours(workdir / "install" / "bin", workdir / "install" / "prefix")
        worlds = []
        for name in names:
            (host,) = stack.enter_context(nslib.namespaces("bhost"))
            host.sysctl("net.ipv4.ip_forward", "1")
            data = workdir / name
            dirs = plugin_dirs("go" if name == "Go" else "ours", our_bin)
            pm = stack.enter_context(podman(host, data / "podman", dirs, {}))
            worlds.append(World(name, pm, add_networks(pm, data)))
        for world in worlds:  # warm up: images, bridges, the Go plugins' chains
            for label in labels:
                world.cycle(label, 0, record=False)
        for r in range(rounds):
            for label in labels:
                for world in rotated(worlds, r):
                    world.cycle(label, r + 1, record=True)
            print(f"round {r + 1}/{rounds} done", flush=True)
        text = report(worlds, labels, rounds)
        write_raw(
            "podman_run.json",
            {w.name: {f"{k[0]} {k[1]}": v for k, v in w.samples.items()} for w in worlds},
        )
        if can_plot():
            plot(worlds, labels, results_dir() / "podman_run.png")
    path = write_result("podman_run.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

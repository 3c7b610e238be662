"""`podman run --rm -p`: our whole stack (podman's CNI backend) vs podman's own netavark.

podman 4 runs as in tests/runtimes/test_podman.py: inside a throwaway host netns and a
private mount namespace (private /var/lib and /run), with its own storage, containers.conf
(CONTAINERS_CONF), network dir and caches; the image is the tests' local busybox-static one
(no registry). Nothing of the machine's own netns, podman storage, /etc/containers or
/var/lib/cni is touched. Each backend has its own podman world, so they never share a
bridge or firewall rules:

  ours      network_backend = "cni", our plugins alone in cni_plugin_dirs, the network
            conflists/podman-flatnet.conflist (flatnet + flatnet-ipam, portmap,
            bandwidth, tuning): no Go plugin anywhere
  netavark  network_backend = "netavark" (Debian's netavark; aardvark-dns is not used:
            the network has DNS off, as the CNI one has no DNS either), a network made
            with `podman network create` on a subnet of the same size

Each round runs, per backend (order rotating), `podman run --rm -p 18080:80 IMAGE echo`
and times it from the bench (the nsenter wrapper included, alike for both): an attach and
a detach of one container with one published port, and podman's own work around them.

  python bench/podman_netavark.py [--rounds N] [--quick]
      -> bench/results/podman_netavark.md (every sample: results/raw/podman_netavark.json)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import header, markdown_table, median, quick_mode, rotated, write_raw, write_result
from tests.harness import netns as nslib
from tests.harness.runtimes import Podman, have, install_ours, mount_jail, podman, write_conflist

NETAVARK = "/usr/lib/podman/netavark"  # Debian's netavark package
LIST = "podman-flatnet.conflist"
NETAVARK_SUBNET = "10.86.0.0/24"
HOST_PORT = "18080"
NETWORK = "bench-netavark"


class NetavarkPodman(Podman):
    """The harness's podman with the netavark backend: its network definitions in the
    world's own directory (not /etc/containers/networks)."""

    def write_config(self) -> None:
        super().write_config()
        text = self.conf.read_text()
        text = text.replace('network_backend = "cni"', 'network_backend = "netavark"')
        text = text.replace(f'network_config_dir = "{self.net_dir}"',
                            f'network_config_dir = "{self.workdir / "networks"}"')  # fmt: skip
        text = "".join(line for line in text.splitlines(keepends=True)
                       if not line.startswith("cni_plugin_dirs"))  # fmt: skip
        (self.workdir / "networks").mkdir(parents=True, exist_ok=True)
        self.conf.write_text(text)


@contextmanager
def netavark_podman(host: nslib.Netns, workdir: Path) -> Iterator[Podman]:
    """tests.harness.runtimes.podman() with the netavark backend."""
    pm = NetavarkPodman(host, workdir, [], {})
    pm.write_config()
    with mount_jail(host, workdir / "var-lib", tmpfs_run=True) as jail:
        pm.jail = jail
        try:
            pm.import_image()
            yield pm
        finally:
            pm.remove_all()
            pm.run("network", "rm", "-f", NETWORK, check=False)
            shutil.rmtree(pm.runroot, ignore_errors=True)


class World:
    def __init__(self, name: str, pm: Podman, network: str) -> None:
        self.name = name
        self.pm = pm
        self.network = network
        self.samples: list[float] = []

    def cycle(self, n: int, record: bool) -> None:
        start = time.perf_counter()
        self.pm.run("run", "--rm", "--name", f"bench-{n}", "--network", self.network,
                    "-p", f"{HOST_PORT}:80", self.pm.image, "echo")  # fmt: skip
        if record:
            self.samples.append(time.perf_counter() - start)


def report(worlds: list[World], rounds: int, note: str) -> str:
    ours, nv = worlds
    o, g = median(ours.samples) * 1000, median(nv.samples) * 1000
    how = (
        f"podman 4 (runc, vfs storage) in a throwaway host netns and private mount "
        f"namespace, each backend with its own storage and containers.conf; {rounds} "
        "interleaved rounds (backend order rotating), medians of the wall time of "
        f"`podman run --rm -p {HOST_PORT}:80 busybox echo`. ours: network_backend cni with "
        "conflists/podman-flatnet.conflist (flatnet + flatnet-ipam, portmap, bandwidth, "
        "tuning), our plugins only; netavark: Debian's netavark 1.4 (iptables), a "
        f"`podman network create --subnet {NETAVARK_SUBNET}` network."
    )
    if note:
        how += f"\n\n**{note}**"
    text = header("podman run --rm -p: our CNI stack vs podman's netavark", how)
    rows = [["run --rm -p", g, o, f"**{o / g:.2f}x**", min(nv.samples) * 1000,
             min(ours.samples) * 1000]]  # fmt: skip
    text += markdown_table(
        ("command", "netavark ms", "ours ms", "ours/netavark", "netavark min ms", "ours min ms"),
        rows,
    )
    return text + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="2 rounds: a smoke test")
    ap.add_argument("--note", default="", help="a line for the result (e.g. a loaded machine)")
    args = ap.parse_args()
    quick_mode(args.quick)
    if not (have("podman") and have("runc")):
        sys.exit("podman and runc are needed (make apt installs them)")
    if not os.access(NETAVARK, os.X_OK):
        sys.exit(f"{NETAVARK} is missing: apt-get install netavark (make apt-bench)")
    rounds = 2 if args.quick else args.rounds
    with tempfile.TemporaryDirectory(prefix="cmpb-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        our_bin = install_ours(workdir / "install" / "bin", workdir / "install" / "prefix")
        worlds = []
        for name in ("ours", "netavark"):
            (host,) = stack.enter_context(nslib.namespaces("bhost"))
            host.sysctl("net.ipv4.ip_forward", "1")
            data = workdir / name
            if name == "ours":
                pm = stack.enter_context(podman(host, data / "podman", [str(our_bin)], {}))
                raw = write_conflist(LIST, pm.net_dir, pm.workdir)
                network = str(raw["name"])
            else:
                pm = stack.enter_context(netavark_podman(host, data / "podman"))
                network = NETWORK
                pm.run("network", "create", "--subnet", NETAVARK_SUBNET, network)
            backend = pm.run("info", "--format", "{{.Host.NetworkBackend}}").stdout.strip()
            want = "cni" if name == "ours" else "netavark"
            if backend != want:
                sys.exit(f"the {name} world runs podman's {backend!r} backend, not {want!r}")
            worlds.append(World(name, pm, network))
        for world in worlds:  # warm up: the image, the bridges, the firewall's chains
            world.cycle(0, record=False)
        for r in range(rounds):
            for world in rotated(worlds, r):
                world.cycle(r + 1, record=True)
            print(f"round {r + 1}/{rounds} done", flush=True)
        text = report(worlds, rounds, args.note)
        write_raw("podman_netavark.json", {w.name: w.samples for w in worlds})
    path = write_result("podman_netavark.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

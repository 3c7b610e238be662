"""flatnet-ipam vs Go's host-local: ADD, CHECK and DEL latency vs the number of leases
already held, and GC of them all.

For N in 0, 1,000, 10,000, 30,000 leases already in a /16, measure the wall time of one
more attachment's ADD, its CHECK and its DEL (whole plugin process, as a runtime sees
it), REPS times, for ours (flatnet-ipam) and Go's /usr/lib/cni/host-local (1.1.1), each
with a lease directory of its own, the two alternating (order rotating every rep). Then,
once per size, ours' GC with an empty valid list: every one of the N leases stale
(host-local's GC does nothing: not measured). Each call is exec'd by bench/spawn.c (no
`ip netns exec` in any figure); CNI_NETNS names a throwaway namespace, which an IPAM
plugin does not enter.

The N leases are written in bulk, shaped exactly as each plugin writes its own: host-local's
files and cursor; for ours the same files plus one index record per attachment and the
directory's `seen`, written through flatnet_ipam.store itself. Every directory is a
private temporary one; the machine's /var/lib/cni is never touched.

    .venv/bin/python bench/ipam_scale.py [--sizes 0,1000,10000,30000] [--reps 7] [--quick]
        -> bench/results/ipam_scale.md, .json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.util import (  # noqa: E402
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
    results_dir,
    rotated,
)

NETWORK = "benchnet"
SUBNET_BASE = (10 << 24) | (88 << 16)  # 10.88.0.0/16
FLAVOURS = ("go", "ours")


def address(i: int) -> str:
    """The i-th lease's address: from .0.2 on, as both hand them out in an empty /16."""
    value = SUBNET_BASE + 2 + i
    return ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))


def conf(data_dir: Path, version: str, **top: Any) -> bytes:
    return json.dumps({
        "cniVersion": version, "name": NETWORK, "type": "flatnet-ipam",
        "ipam": {"type": "flatnet-ipam", "subnet": "10.88.0.0/16", "dataDir": str(data_dir),
                 "routes": [{"dst": "0.0.0.0/0"}]},
        **top,
    }).encode()  # fmt: skip


def fill_host_local(lease_dir: Path, n: int) -> None:
    lease_dir.mkdir(parents=True)
    for i in range(n):
        (lease_dir / address(i)).write_bytes(f"filler{i}\r\neth0".encode())
    if n:
        (lease_dir / "last_reserved_ip.0").write_text(address(n - 1))


def fill_ours(data_dir: Path, n: int) -> None:
    """host-local's files, and our index as our own ADDs leave it (flatnet_ipam.store)."""
    from common.config import parse_netconf
    from common.log import Log
    from flatnet_ipam import lib
    from flatnet_ipam.store import Lease, LeaseStore, Owner

    fill_host_local(data_dir / NETWORK, n)
    config = lib.parse_config(parse_netconf(json.loads(conf(data_dir, "1.1.0"))))
    store = LeaseStore(config, Log())
    with store.lock():
        for i in range(n):
            owner = Owner(NETWORK, f"filler{i}", "eth0")
            store.save(owner, Lease(NETWORK, f"filler{i}", "eth0", True, [address(i)], store.boot))
        store.note_seen()


class Flavour:
    """host-local or ours, with a lease directory of its own holding N leases."""

    def __init__(self, name: str, n: int, our_bin: Path, workdir: Path, ctr: str) -> None:
        self.name, self.n = name, n
        self.exe = str(GO_BIN / "host-local") if name == "go" else str(our_bin / "flatnet-ipam")
        self.version = "1.0.0" if name == "go" else "1.1.0"  # host-local 1.1.1 ends at 1.0.0
        self.data_dir = workdir / f"{name}-{n}"
        self.env = {"PATH": SYSTEM_PATH, "CNI_IFNAME": "eth0", "CNI_NETNS": f"/run/netns/{ctr}",
                    "CNI_PATH": str(GO_BIN), "CNI_META_LOCK_TIMEOUT": "60"}  # fmt: skip
        self.samples: dict[str, list[float]] = {"ADD": [], "CHECK": [], "DEL": []}
        self.gc_ms: float | None = None
        self.rss_kib = 0

    def setup(self) -> None:
        if self.name == "go":
            fill_host_local(self.data_dir / NETWORK, self.n)
        else:
            fill_ours(self.data_dir, self.n)

    def call(self, spawn: Spawner, command: str, cid: str, **top: Any) -> float:
        env = {**self.env, "CNI_COMMAND": command, "CNI_CONTAINERID": cid}
        c = spawn.ok([self.exe], env, conf(self.data_dir, self.version, **top))
        self.rss_kib = max(self.rss_kib, c.rss_kib)
        return c.ms

    def cycle(self, spawn: Spawner, i: int, record: bool) -> None:
        for command in ("ADD", "CHECK", "DEL"):
            ms = self.call(spawn, command, f"bench{i}")
            if record:
                self.samples[command].append(ms)

    def collect(self, spawn: Spawner) -> None:
        """Ours only: GC with no attachment valid, every lease stale."""
        if self.name == "go":
            return
        self.gc_ms = self.call(spawn, "GC", "", **{"cni.dev/valid-attachments": []})
        left = [p for p in (self.data_dir / NETWORK).iterdir() if p.name[0].isdigit()]
        if left:
            raise RuntimeError(f"GC left {len(left)} leases")

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"flavour": self.name, "n": self.n, "peak_rss_kib": self.rss_kib,
                               "gc_ms": self.gc_ms, "samples": self.samples}  # fmt: skip
        for command, values in self.samples.items():
            out[f"{command.lower()}_ms"] = median(values)
        return out


def measure(sizes: list[int], reps: int, launcher: str) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="cmpb-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        spawn = Spawner(build_spawner(workdir))
        our_bin = our_plugins(launcher, workdir)
        ctr = f"cmpb-ipam-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", ctr], check=True)
        stack.callback(subprocess.run, ["ip", "netns", "del", ctr], check=False)
        for n in sizes:
            flavours = [Flavour(name, n, our_bin, workdir, ctr) for name in FLAVOURS]
            for f in flavours:
                f.setup()
                f.cycle(spawn, -1, record=False)  # warm-up: page cache, our first scan
            for r in range(reps):
                for f in rotated(flavours, r):
                    f.cycle(spawn, r, record=True)
            for f in flavours:
                f.collect(spawn)
                results.append(f.result())
                got = results[-1]
                gc = "" if got["gc_ms"] is None else f"  GC {got['gc_ms']:8.1f} ms"
                print(f"{f.name:5} N={n:6}  ADD {got['add_ms']:7.1f}  CHECK {got['check_ms']:7.1f}"
                      f"  DEL {got['del_ms']:7.1f} ms{gc}", flush=True)  # fmt: skip
    return results


def table(results: list[dict[str, Any]], reps: int, note: str) -> str:
    by = {(r["flavour"], r["n"]): r for r in results}
    empty = by.get(("ours", 0))
    rows: list[list[object]] = []
    for n in sorted({r["n"] for r in results}):
        go = by.get(("go", n))
        for name in FLAVOURS:
            r = by.get((name, n))
            if r is None:
                continue
            row: list[object] = [f"{n:,}", name, r["add_ms"], r["check_ms"], r["del_ms"]]
            keys = ("add_ms", "check_ms", "del_ms")
            faster = " / ".join(f"{go[k] / r[k]:.1f}x" for k in keys) if go else ""
            flat = " / ".join(f"{r[k] / empty[k]:.2f}" for k in keys) if empty else ""
            row += [faster, flat] if name == "ours" else ["", ""]
            row.append("" if r["gc_ms"] is None else f"{r['gc_ms']:.0f}")
            row.append(f"{r['peak_rss_kib'] / 1024:.1f}")
            rows.append(row)
    text = header(
        "flatnet-ipam vs host-local: ADD / CHECK / DEL with N leases held, GC of N",
        f"{note}Medians of {reps} interleaved ADD+CHECK+DEL rounds per flavour and size "
        "(order rotating), each flavour with its own lease directory pre-filled with N "
        "leases in a /16, shaped like its own; every call one process exec'd through "
        "bench/spawn.c. Go = Debian's host-local 1.1.1. GC: ours, once per size, an empty "
        "valid list (all N stale); host-local's GC does nothing. Targets (issue 31): ours' "
        "ADD, CHECK and DEL at 10,000 leases within 1.5x of the same call at 0; GC of "
        "10,000 stale leases under 1 s.",
    )
    text += markdown_table(
        ("N held", "flavour", "ADD ms", "CHECK ms", "DEL ms",
         "faster than Go (ADD / CHECK / DEL)", "ours vs ours at 0", "GC of N ms",
         "peak RSS MiB"),
        rows,
    )  # fmt: skip
    return text + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,1000,10000,30000")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="sizes 0,1000 and 2 reps: a smoke test")
    ap.add_argument("--note", default="", help="a line put above the table (e.g. the load)")
    add_launcher_args(ap)
    a = ap.parse_args()
    quick_mode(a.quick)
    if os.geteuid() != 0:
        print("needs root (a throwaway netns for CNI_NETNS)", file=sys.stderr)
        return 1
    sizes = [0, 1000] if a.quick else [int(s) for s in a.sizes.split(",")]
    reps = 2 if a.quick else a.reps
    results = measure(sizes, reps, a.launcher)
    text = table(results, reps, f"{a.note}\n\n" if a.note else "")
    print(text)
    out = results_dir()
    (out / "ipam_scale.json").write_text(json.dumps(results, indent=1))
    (out / "ipam_scale.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

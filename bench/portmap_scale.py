"""portmap ADD/DEL latency vs the number of attachments already present.

For N in 10, 100, 1000, 5000 existing attachments (one TCP host port each), measure the
wall time of one more attachment's ADD and then its DEL (whole plugin process, as a
runtime sees it), REPS times, for: ours with nftables, ours with iptables, and Go's
/usr/lib/cni/portmap (1.1.1: iptables, here iptables-nft). Every flavour has its own
throwaway network namespace filled with N attachments; the flavours' calls alternate
(order rotating every rep). Each call is exec'd by bench/spawn.c from inside that netns
(setns: no `ip netns exec` in any figure), which also gives each call's peak RSS.
Medians and ratios go to a markdown table, every sample to JSON, and a PNG plot
(latency vs attachments) is written.

The N existing attachments are injected in bulk, shaped exactly like each plugin's own
(nft elements with owner comments and state files; iptables chains, jumps and comments),
because creating 5,000 of them one by one through Go's plugin would take an hour.
Everything runs inside throwaway network namespaces; the machine's own is never touched.

    .venv/bin/python bench/portmap_scale.py [--sizes 10,100,1000,5000] [--reps 5] [--quick]
        -> bench/results/portmap_scale.md, .json, .png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import portmap_fill  # noqa: E402
from bench.portmap_fill import fill_iptables, fill_nft  # noqa: E402
from bench.util import (  # noqa: E402
    GO_BIN,
    Spawner,
    add_launcher_args,
    header,
    markdown_table,
    quick_mode,
    results_dir,
)

GO = str(GO_BIN / "portmap")
FLAVOURS = ("go", "ours-nftables", "ours-iptables")


# ---------------------------------------------------------------------------- measuring


class Flavour(portmap_fill.Flavour):
    """ours (nftables or iptables) or Go's portmap."""

    def __init__(self, name: str, n: int, our_bin: Path, workdir: Path) -> None:
        exe = GO if name == "go" else str(our_bin / "portmap")
        backend = None if name == "go" else name.removeprefix("ours-")
        super().__init__(name, n, exe, workdir, backend)
        self.adds: list[float] = []
        self.dels: list[float] = []

    def setup(self, stack: ExitStack) -> None:
        super().setup(stack)
        if self.backend == "nftables":
            fill_nft(self.ns, self.n, self.state)
        else:
            fill_iptables(self.ns, self.n, go_style=self.name == "go")

    def cycle(self, spawn: Spawner, i: int, record: bool) -> None:
        add = self.call(spawn, "ADD", i)
        delete = self.call(spawn, "DEL", i)
        if record:
            self.adds.append(add)
            self.dels.append(delete)

    def result(self) -> dict[str, Any]:
        return {"flavour": self.name, "n": self.n, "add_ms": statistics.median(self.adds),
               "del_ms": statistics.median(self.dels), "peak_rss_kib": self.rss_kib,
               "adds": self.adds, "dels": self.dels}  # fmt: skip

    @staticmethod
    def summary(r: dict[str, Any]) -> str:
        return (
            f"{r['flavour']:21} N={r['n']:5}  ADD {r['add_ms']:8.1f} ms  "
            f"DEL {r['del_ms']:8.1f} ms  peak RSS {r['peak_rss_kib'] / 1024:5.1f} MiB"
        )


def table(results: list[dict[str, Any]], reps: int) -> str:
    by = {(r["flavour"], r["n"]): r for r in results}
    rows: list[list[object]] = []
    for n in sorted({r["n"] for r in results}):
        go = by.get(("go", n))
        for name in FLAVOURS:
            r = by.get((name, n))
            if r is None:
                continue
            row: list[object] = [f"{n:,}", name, r["add_ms"], r["del_ms"]]
            if go and name != "go":
                add, delete = r["add_ms"], r["del_ms"]
                row += [
                    f"{add / go['add_ms']:.2f}x",
                    f"{delete / go['del_ms']:.2f}x",
                    f"{go['add_ms'] / add:.1f}x / {go['del_ms'] / delete:.1f}x",
                ]
            else:
                row += ["", "", ""]
            row.append(f"{r['peak_rss_kib'] / 1024:.2f}")
            rows.append(row)
    text = header(
        "portmap at scale: ADD / DEL with N attachments already present",
        f"Medians of {reps} interleaved ADD+DEL pairs per flavour and size (flavour order "
        "rotating), each flavour in its own throwaway netns pre-filled with N attachments "
        "shaped like its own; every call one process exec'd through bench/spawn.c from "
        "inside that netns (setns, no `ip netns exec`). Go = Debian's portmap 1.1.1 on "
        "iptables-nft. Target: one more ADD and one DEL each at least 6x faster than "
        "Go's at 1,000 attachments (default backend).",
    )
    text += markdown_table(
        ("N present", "flavour", "ADD ms", "DEL ms", "ADD ours/Go", "DEL ours/Go",
         "faster than Go (ADD / DEL)", "peak RSS MiB"),
        rows,
    )  # fmt: skip
    return text + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, title in ((axes[0], "add_ms", "ADD"), (axes[1], "del_ms", "DEL")):
        for flavour in [f for f in FLAVOURS if any(r["flavour"] == f for r in results)]:
            rows = sorted((r for r in results if r["flavour"] == flavour), key=lambda r: r["n"])
            ax.plot([r["n"] for r in rows], [r[key] for r in rows], marker="o", label=flavour)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("attachments already present")
        ax.set_ylabel("median latency per call (ms)")
        ax.set_title(f"portmap {title}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,100,1000,5000")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="sizes 10,100 and 2 reps: a smoke test")
    ap.add_argument("--flavours", default=",".join(FLAVOURS))
    add_launcher_args(ap)
    ap.add_argument("--out", help="directory for the results (default: bench/results)")
    a = ap.parse_args()
    quick_mode(a.quick)
    sizes = [10, 100] if a.quick else [int(s) for s in a.sizes.split(",")]
    reps = 2 if a.quick else a.reps
    names = [f for f in a.flavours.split(",") if f]
    out = Path(a.out) if a.out else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    results = portmap_fill.measure(Flavour, names, sizes, reps, a.launcher)
    text = table(results, reps)
    print(text)
    (out / "portmap_scale.json").write_text(json.dumps(results, indent=2))
    (out / "portmap_scale.md").write_text(text)
    try:
        plot(results, out / "portmap_scale.png")
        print(f"plot: {out / 'portmap_scale.png'}")
    except ImportError:
        print("matplotlib missing: .venv/bin/pip install matplotlib for the plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""portmap's iptables backend on each iptables variant (and, until commit 1422af4, the
libiptc backend it replaced: the libiptc rows of bench/results/xtables.md come from there).

For N in 1, 100, 1000 attachments already present (one TCP host port each, bulk-loaded
in the exact shape portmap writes), measure the wall time of one more attachment's ADD,
CHECK and DEL (whole plugin process, exec'd by bench/spawn.c from inside a throwaway
netns, which also gives the peak RSS of the call and of the tools it runs), REPS times,
flavours alternating. Also the cost of one `iptables-save -t nat` of each variant at that
size: what the restore backend reads on every call.

    .venv/bin/python bench/xtables.py [--sizes 1,100,1000] [--reps 7] [--quick]
        -> bench/results/xtables.md, .json
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
from bench.portmap_fill import ipt_rules, sh  # noqa: E402
from bench.util import (  # noqa: E402
    Spawner,
    add_launcher_args,
    header,
    markdown_table,
    quick_mode,
    results_dir,
)
from common.netns import entered  # noqa: E402

# flavour -> (CNI_META_IPTABLES, the variant its table lives in)
FLAVOURS = {
    "restore-legacy": ("legacy", "legacy"),
    "restore-nft": ("nft", "nft"),
    "restore-auto": ("auto", "nft"),
}
VERBS = ("ADD", "CHECK", "DEL")


class Flavour(portmap_fill.Flavour):
    """ours with the iptables backend on one variant, N attachments in portmap's shape."""

    def __init__(self, name: str, n: int, our_bin: Path, workdir: Path) -> None:
        super().__init__(name, n, str(our_bin / "portmap"), workdir, "iptables")
        setting, self.variant = FLAVOURS[name]
        self.env["CNI_META_IPTABLES"] = setting
        self.ms: dict[str, list[float]] = {v: [] for v in VERBS}
        self.save_ms: list[float] = []

    def setup(self, stack: ExitStack) -> None:
        super().setup(stack)
        restore = f"iptables-{self.variant}-restore"
        sh("ip", "netns", "exec", self.ns, restore, "--noflush", stdin=ipt_rules(self.n, False))

    def cycle(self, spawn: Spawner, i: int, record: bool) -> None:
        for verb in VERBS:
            ms = self.call(spawn, verb, i)
            if record:
                self.ms[verb].append(ms)
        with entered(f"/run/netns/{self.ns}"):
            save = spawn.ok([f"/usr/sbin/iptables-{self.variant}-save", "-t", "nat"], {}, b"")
        if record:
            self.save_ms.append(save.ms)

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"flavour": self.name, "n": self.n, "peak_rss_kib": self.rss_kib}
        for verb in VERBS:
            out[f"{verb.lower()}_ms"] = statistics.median(self.ms[verb])
            out[f"{verb.lower()}s"] = self.ms[verb]
        out["save_ms"] = statistics.median(self.save_ms)
        return out

    @staticmethod
    def summary(r: dict[str, Any]) -> str:
        return (
            f"{r['flavour']:15} N={r['n']:5}  ADD {r['add_ms']:7.1f}  CHECK "
            f"{r['check_ms']:7.1f}  DEL {r['del_ms']:7.1f} ms  "
            f"RSS {r['peak_rss_kib'] / 1024:5.1f} MiB"
        )


def table(results: list[dict[str, Any]], reps: int) -> str:
    base = {r["n"]: r for r in results if r["flavour"] == "libiptc"}
    rows: list[list[object]] = []
    for r in results:
        b = base.get(r["n"])
        ratio = " / ".join(
            f"{r[k] / b[k]:.2f}" if b else "-" for k in ("add_ms", "check_ms", "del_ms")
        )
        rows.append([r["n"], r["flavour"], f"{r['add_ms']:.1f}", f"{r['check_ms']:.1f}",
                     f"{r['del_ms']:.1f}", ratio, f"{r['peak_rss_kib'] / 1024:.1f}",
                     f"{r['save_ms']:.1f}"])  # fmt: skip
    how = (
        f"bench/xtables.py, medians of {reps} whole-process calls (bench/spawn.c, inside a "
        "throwaway netns holding N attachments in portmap's own shape). "
        "Peak RSS: the largest of the plugin and the iptables tools it ran. "
        "save: one `iptables-<variant>-save -t nat` at that size."
    )
    return header("portmap iptables backends: libiptc vs iptables-restore", how) + markdown_table(
        [
            "N",
            "backend",
            "ADD ms",
            "CHECK ms",
            "DEL ms",
            "x libiptc (A/C/D)",
            "peak RSS MiB",
            "save ms",
        ],
        rows,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,100,1000")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="sizes 1,100 and 2 reps: a smoke test")
    ap.add_argument("--flavours", default=",".join(FLAVOURS))
    add_launcher_args(ap)
    a = ap.parse_args()
    quick_mode(a.quick)
    sizes = [1, 100] if a.quick else [int(s) for s in a.sizes.split(",")]
    reps = 2 if a.quick else a.reps
    names = [f for f in a.flavours.split(",") if f]
    results = portmap_fill.measure(Flavour, names, sizes, reps, a.launcher)
    text = table(results, reps)
    print(text)
    out = results_dir()
    (out / "xtables.json").write_text(json.dumps(results, indent=2))
    (out / "xtables.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

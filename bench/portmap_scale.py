"""portmap ADD/DEL latency vs the number of attachments already present.

For N in 10, 100, 1000, 5000 existing attachments (one TCP host port each), measure the
wall time of one more attachment's ADD and then its DEL (whole plugin process, as a
runtime sees it), REPS times, for: ours with nftables, ours with iptables, ours with
nftables and the resident helper (when cnihelper/server.py exists), and Go's
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
    Helper,
    Spawner,
    add_launcher_args,
    build_spawner,
    header,
    helper_note,
    helper_unavailable,
    markdown_table,
    our_plugins,
    quick_mode,
    resident_helper,
    results_dir,
    rotated,
)
from common.netns import entered  # noqa: E402
from portmap.config import Attachment  # noqa: E402
from portmap.nft import T, skeleton_text  # noqa: E402
from portmap.xtables import COMMENT_PREFIX, chain_name  # noqa: E402

GO = str(GO_BIN / "portmap")
NETWORK = "benchnet"
FLAVOURS = ("go", "ours-nftables", "ours-iptables", "ours-nftables+helper")


def sh(*argv: str, stdin: str | None = None) -> str:
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... failed: {p.stderr[:500]}")
    return p.stdout


def ctr_ip(i: int) -> str:
    return f"10.{100 + i // 65536}.{(i // 256) % 256}.{i % 256 or 1}"


def conf(i: int, backend: str | None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "portmap",
        "runtimeConfig": {
            "portMappings": [{"hostPort": 10000 + i, "containerPort": 80, "protocol": "tcp"}]
        },
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": [{"address": f"{ctr_ip(i)}/16", "interface": 0}],
        },
    }
    if backend:
        raw["backend"] = backend
    return raw


# ---------------------------------------------------------------------------- bulk fill


def fill_nft(ns: str, n: int, state_root: Path) -> None:
    lines = skeleton_text()
    lines += [f"add chain {T} masq4-p16", f"flush chain {T} masq4-p16"]
    (state_root / "portmap").mkdir(parents=True, exist_ok=True)
    claims, anys, masq, hairpin = [], [], [], []
    for i in range(n):
        att = Attachment(NETWORK, f"fill{i}", "eth0")
        c = f'comment "{att.comment}"'
        port, ip = 10000 + i, ctr_ip(i)
        claims.append(f"0.0.0.0 . tcp . {port} {c}")
        anys.append(f"tcp . {port} {c} : {ip} . 80")
        masq.append(f"{ip} {c} : goto masq4-p16")
        hairpin.append(f"10.{100 + i // 65536}.0.0 . {ip} {c}")
        objs = [["any4", f"tcp . {port}"], ["claims4", f"0.0.0.0 . tcp . {port}"]]
        record = {"network": NETWORK, "containerID": f"fill{i}", "ifname": "eth0",
                  "backend": "nftables", "objects": objs, "committed": True}  # fmt: skip
        (state_root / "portmap" / f"{att.tag}.json").write_text(json.dumps(record))
    for name, items in (("claims4", claims), ("any4", anys), ("masq4", masq),
                        ("hairpin4", hairpin)):  # fmt: skip
        for k in range(0, len(items), 1000):
            lines.append(f"add element {T} {name} {{ {', '.join(items[k : k + 1000])} }}")
    sh("ip", "netns", "exec", ns, "nft", "-f", "-", stdin="\n".join(lines) + "\n")


def _ipt_rules(n: int, go_style: bool) -> str:
    out = ["*nat", ":CNI-HOSTPORT-DNAT - [0:0]", ":CNI-HOSTPORT-SETMARK - [0:0]",
           ":CNI-HOSTPORT-MASQ - [0:0]"]  # fmt: skip
    body = [
        "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
        "-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT",
        '-A POSTROUTING -m comment --comment "CNI portfwd requiring masquerade" '
        "-j CNI-HOSTPORT-MASQ",
        '-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" '
        "-j MARK --set-xmark 0x2000/0x2000",
        "-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE",
    ]
    for i in range(n):
        port, ip = 10000 + i, ctr_ip(i)
        if go_style:
            import hashlib

            chain = ("CNI-DN-" + hashlib.sha512(f"{NETWORK}fill{i}".encode()).hexdigest())[:28]
            comment = f'dnat name: \\"{NETWORK}\\" id: \\"fill{i}\\"'
            jump = (f'-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "{comment}" '
                    f"-m multiport --dports {port} -j {chain}")  # fmt: skip
        else:
            att = Attachment(NETWORK, f"fill{i}", "eth0")
            chain = chain_name(att)
            jump = (f"-A CNI-HOSTPORT-DNAT -p tcp -m tcp --dport {port} -m comment "
                    f'--comment "{COMMENT_PREFIX}{att.comment}" -j {chain}')  # fmt: skip
        out.append(f":{chain} - [0:0]")
        body += [
            jump,
            f"-A {chain} -s 10.{100 + i // 65536}.0.0/16 -p tcp -m tcp --dport {port} "
            "-j CNI-HOSTPORT-SETMARK",
            f"-A {chain} -s 127.0.0.1/32 -p tcp -m tcp --dport {port} -j CNI-HOSTPORT-SETMARK",
            f"-A {chain} -p tcp -m tcp --dport {port} -j DNAT --to-destination {ip}:80",
        ]
    return "\n".join(out + body + ["COMMIT", ""])


def fill_iptables(ns: str, n: int, go_style: bool) -> None:
    restore = "iptables-nft-restore" if go_style else "iptables-legacy-restore"
    sh("ip", "netns", "exec", ns, restore, "--noflush", stdin=_ipt_rules(n, go_style))


# ---------------------------------------------------------------------------- measuring


class Flavour:
    """One implementation in its own netns holding N attachments (and a container netns)."""

    def __init__(self, name: str, n: int, our_bin: Path, workdir: Path) -> None:
        self.name = name
        self.n = n
        tag = uuid.uuid4().hex[:8]
        self.ns = f"cmpb-{name.replace('+', '-')}-{tag}"
        self.ctr = f"cmpb-ctr-{tag}"
        self.state = workdir / f"{name}-{n}"
        self.exe = GO if name == "go" else str(our_bin / "portmap")
        self.backend = None if name == "go" else name.removeprefix("ours-").split("+")[0]
        self.env = {
            "PATH": SYSTEM_PATH,
            "CNI_META_STATE_ROOT": str(self.state),
            "CNI_META_LOCK_TIMEOUT": "60",
            "CNI_META_HELPER": "off",
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": f"/run/netns/{self.ctr}",
            "CNI_PATH": str(GO_BIN),
        }
        self.adds: list[float] = []
        self.dels: list[float] = []
        self.rss_kib = 0
        self.helper: Helper | None = None
        self.seen = 0  # helper stats lines from the warm-up

    def setup(self, stack: ExitStack) -> None:
        sh("ip", "netns", "add", self.ns)
        stack.callback(sh, "ip", "netns", "del", self.ns)
        sh("ip", "netns", "add", self.ctr)
        stack.callback(sh, "ip", "netns", "del", self.ctr)
        self.state.mkdir(parents=True)
        if self.backend == "nftables":
            fill_nft(self.ns, self.n, self.state)
        else:
            fill_iptables(self.ns, self.n, go_style=self.name == "go")
        if self.name.endswith("+helper"):
            with entered(f"/run/netns/{self.ns}"):
                self.helper = stack.enter_context(
                    resident_helper(self.state / "helper.sock", self.env, self.state)
                )
            self.env["CNI_META_HELPER"] = str(self.helper.socket)

    def call(self, spawn: Spawner, command: str, i: int) -> float:
        env = {**self.env, "CNI_COMMAND": command, "CNI_CONTAINERID": f"bench{i}"}
        with entered(f"/run/netns/{self.ns}"):
            c = spawn.ok([self.exe], env, json.dumps(conf(i, self.backend)).encode())
        self.rss_kib = max(self.rss_kib, c.rss_kib)
        return c.ms

    def cycle(self, spawn: Spawner, i: int, record: bool) -> None:
        add = self.call(spawn, "ADD", i)
        delete = self.call(spawn, "DEL", i)
        if record:
            self.adds.append(add)
            self.dels.append(delete)

    def result(self) -> dict[str, Any]:
        out = {"flavour": self.name, "n": self.n, "add_ms": statistics.median(self.adds),
               "del_ms": statistics.median(self.dels), "peak_rss_kib": self.rss_kib,
               "adds": self.adds, "dels": self.dels}  # fmt: skip
        if self.helper is not None:  # what a call adds in the forked worker (helper stats lines)
            stats = self.helper.worker_stats(self.seen)
            out["worker_private_kib"] = max((x["private_kb"] for x in stats), default=0)
            calls = len(self.adds) + len(self.dels)
            out["note"] = helper_note(f"{self.name} N={self.n}", self.helper, len(stats), calls)
        return out


def run_size(n: int, names: list[str], reps: int, spawn: Spawner, our_bin: Path, workdir: Path
             ) -> list[dict[str, Any]]:  # fmt: skip
    with ExitStack() as stack:
        flavours = [Flavour(name, n, our_bin, workdir) for name in names]
        for f in flavours:
            f.setup(stack)
        for f in flavours:  # warm up: page cache, the helper, Go's top-level chains
            f.cycle(spawn, n + reps, record=False)
            f.seen = len(f.helper.worker_stats()) if f.helper else 0
        for r in range(reps):
            for f in rotated(flavours, r):
                f.cycle(spawn, n + r, record=True)
        return [f.result() for f in flavours]


def table(results: list[dict[str, Any]], reps: int, notes: list[str]) -> str:
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
            rss = f"{r['peak_rss_kib'] / 1024:.2f}"
            if "worker_private_kib" in r:
                rss += f" (client; worker +{r['worker_private_kib'] / 1024:.2f} private)"
            row.append(rss)
            rows.append(row)
    text = header(
        "portmap at scale: ADD / DEL with N attachments already present",
        f"Medians of {reps} interleaved ADD+DEL pairs per flavour and size (flavour order "
        "rotating), each flavour in its own throwaway netns pre-filled with N attachments "
        "shaped like its own; every call one process exec'd through bench/spawn.c from "
        "inside that netns (setns, no `ip netns exec`). Go = Debian's portmap 1.1.1 on "
        "iptables-nft. Targets: at most 1.0x Go per call at one attachment (see "
        "plugin_calls.md), at least 10x faster than Go at 1,000.",
    )
    text += "".join(f"- {note}\n" for note in notes) + ("\n" if notes else "")
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
    notes = []
    skip = "skipped by --no-helper" if a.no_helper else helper_unavailable()
    if skip and "ours-nftables+helper" in names:
        names.remove("ours-nftables+helper")
        notes.append(f"ours-nftables+helper: {skip}")
    out = Path(a.out) if a.out else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="cmpb-") as tmp:
        workdir = Path(tmp)
        spawn = Spawner(build_spawner(workdir))
        our_bin = our_plugins(a.launcher, workdir)
        for n in sizes:
            for r in run_size(n, names, reps, spawn, our_bin, workdir):
                results.append(r)
                print(f"{r['flavour']:21} N={n:5}  ADD {r['add_ms']:8.1f} ms  "
                      f"DEL {r['del_ms']:8.1f} ms  peak RSS {r['peak_rss_kib'] / 1024:5.1f} MiB",
                      flush=True)  # fmt: skip
    notes += [r["note"] for r in results if r.get("note")]
    text = table(results, reps, notes)
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

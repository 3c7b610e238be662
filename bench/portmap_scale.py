"""portmap ADD/DEL latency vs the number of attachments already present.

For N in 10, 100, 1000, 5000 existing attachments (one TCP host port each), measure the
wall time of one more attachment's ADD and then its DEL (whole plugin process, as a
runtime sees it), REPS times, for: ours with nftables, ours with iptables, and Go's
/usr/lib/cni/portmap (1.1.1: iptables, here iptables-nft). Medians and ratios are printed
and a PNG plot (latency vs attachments) is written.

The N existing attachments are injected in bulk, shaped exactly like each plugin's own
(nft elements with owner comments and state files; iptables chains, jumps and comments),
because creating 5,000 of them one by one through Go's plugin would take an hour.
Everything runs inside throwaway network namespaces; the machine's own is never touched.

    .venv/bin/python bench/portmap_scale.py [--sizes 10,100,1000,5000] [--reps 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from portmap.config import Attachment  # noqa: E402
from portmap.iptables import COMMENT_PREFIX, chain_name  # noqa: E402
from portmap.nft import T, skeleton_text  # noqa: E402

OURS = str(Path(sys.executable).parent / "portmap")
GO = "/usr/lib/cni/portmap"
NETWORK = "benchnet"


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


def timed(ns: str, exe: str, command: str, cid: str, data: dict[str, Any], env: dict[str, str]
          ) -> float:  # fmt: skip
    full = {**os.environ, **env, "CNI_COMMAND": command, "CNI_CONTAINERID": cid,
            "CNI_IFNAME": "eth0", "CNI_NETNS": "/run/netns/" + env["BENCH_CTR"],
            "CNI_PATH": "/usr/lib/cni"}  # fmt: skip
    start = time.perf_counter()
    p = subprocess.run(["ip", "netns", "exec", ns, exe], input=json.dumps(data).encode(),
                       env=full, capture_output=True, check=False)  # fmt: skip
    elapsed = time.perf_counter() - start
    if p.returncode != 0:
        raise RuntimeError(f"{exe} {command} failed: {p.stdout.decode()} {p.stderr.decode()}")
    return elapsed * 1000


def baseline(ns: str, env: dict[str, str]) -> float:
    """`ip netns exec ns true`: the cost every measurement shares, reported separately."""
    start = time.perf_counter()
    subprocess.run(["ip", "netns", "exec", ns, "true"], env={**os.environ, **env}, check=True)
    return (time.perf_counter() - start) * 1000


def run_one(flavour: str, n: int, reps: int) -> dict[str, Any]:
    ns = f"cmpb-{flavour}-{uuid.uuid4().hex[:8]}"
    ctr = f"cmpb-ctr-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", ns)
    sh("ip", "netns", "add", ctr)
    with tempfile.TemporaryDirectory() as tmp:
        env = {"CNI_META_STATE_ROOT": tmp, "BENCH_CTR": ctr}
        try:
            if flavour == "ours-nftables":
                fill_nft(ns, n, Path(tmp))
            else:
                fill_iptables(ns, n, go_style=flavour == "go")
            exe = GO if flavour == "go" else OURS
            backend = None if flavour == "go" else flavour.split("-")[1]
            adds, dels = [], []
            for r in range(reps):
                i = n + r
                data = conf(i, backend)
                adds.append(timed(ns, exe, "ADD", f"bench{i}", data, env))
                dels.append(timed(ns, exe, "DEL", f"bench{i}", data, env))
            base = statistics.median(baseline(ns, env) for _ in range(3))
        finally:
            sh("ip", "netns", "del", ns)
            sh("ip", "netns", "del", ctr)
    return {"flavour": flavour, "n": n, "add_ms": statistics.median(adds),
            "del_ms": statistics.median(dels), "netns_exec_ms": base,
            "adds": adds, "dels": dels}  # fmt: skip


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, key, title in ((axes[0], "add_ms", "ADD"), (axes[1], "del_ms", "DEL")):
        for flavour in sorted({r["flavour"] for r in results}):
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,100,1000,5000")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--flavours", default="ours-nftables,ours-iptables,go")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in (int(s) for s in a.sizes.split(",")):
        for flavour in a.flavours.split(","):
            r = run_one(flavour, n, a.reps)
            results.append(r)
            print(f"{flavour:15} N={n:5}  ADD {r['add_ms']:8.1f} ms  DEL {r['del_ms']:8.1f} ms"
                  f"  (ip netns exec alone: {r['netns_exec_ms']:.1f} ms)", flush=True)  # fmt: skip
    print("\nratios (Go / ours-nftables; ours-nftables ADD vs its own N=10):")
    by = {(r["flavour"], r["n"]): r for r in results}
    for n in sorted({r["n"] for r in results}):
        ours, go = by.get(("ours-nftables", n)), by.get(("go", n))
        first = by.get(("ours-nftables", min(r["n"] for r in results)))
        if ours and go:
            print(f"  N={n:5}: ADD {go['add_ms'] / ours['add_ms']:5.1f}x faster, "
                  f"DEL {go['del_ms'] / ours['del_ms']:5.1f}x faster", end="")  # fmt: skip
        if ours and first:
            growth = ours["add_ms"] / first["add_ms"]
            print(f"; ADD at N={n} is {growth:.2f}x ADD at the smallest N")
        else:
            print()
    (out / "portmap_scale.json").write_text(json.dumps(results, indent=2))
    try:
        plot(results, out / "portmap_scale.png")
        print(f"plot: {out / 'portmap_scale.png'}")
    except ImportError:
        print("matplotlib missing: .venv/bin/pip install matplotlib for the plot")
    return 0


if __name__ == "__main__":
    sys.exit(main())

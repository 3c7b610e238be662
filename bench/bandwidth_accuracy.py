"""Shaping accuracy of bandwidth: achieved / configured rate, ours vs Go's, both directions.

For each rate, a container is attached twice through cni-chain with
conflists/bandwidth.conflist (Go bridge + host-local + bandwidth): once with our
bandwidth, once with Go's (CNI_PATH decides which one `bandwidth` is), each in fresh
throwaway namespaces. TCP bulk traffic then runs host -> container (container ingress,
the tbf on the host veth) and container -> host (container egress, the ifb's tbf).

The rate is measured at the receiver between the first and the last chunk received
after a warm-up (so the initial burst and the sender's final drain are excluded). tbf
limits Ethernet frames; TCP goodput is at most 1448/1514 = 95.6% of that with a 1500
MTU and timestamps, so the table shows goodput/configured and the corresponding frame
rate (goodput x 1514/1448)/configured, which is what tbf actually enforces.

  python bench/bandwidth_accuracy.py [--rounds N] [--seconds S] [--quick]
      -> bench/results/bandwidth_accuracy.md
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import machine_line, markdown_table, quick_mode, write_result
from tests.harness import netns as nslib
from tests.harness.netns import Netns
from tests.harness.plugins import GO_BIN, OUR_BIN, Chain, container_address, load_conflist

GATEWAY = "10.88.7.1"  # the bridge address of conflists/bandwidth.conflist
RATES_MBIT = (1, 10, 100, 1000)
FRAME_PER_PAYLOAD = 1514 / 1448
IMPLEMENTATIONS = {"ours": f"{OUR_BIN}:{GO_BIN}", "go": f"{GO_BIN}:{OUR_BIN}"}


def goodput(sender: Netns, receiver: Netns, dst: str, port: int, seconds: float) -> float:
    """TCP payload bits/s from sender to receiver, measured at the receiver."""
    warmup = 1.0
    with receiver.entered():
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(1)
    stamps: list[tuple[float, int]] = []
    stop_at = time.monotonic() + warmup + seconds

    def receive() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            start_at = time.monotonic() + warmup
            while True:
                try:
                    chunk = conn.recv(1 << 16)
                except OSError:
                    return
                now = time.monotonic()
                if not chunk:
                    return
                if start_at <= now <= stop_at:
                    stamps.append((now, len(chunk)))

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    with sender.entered():
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    block = b"\0" * (1 << 16)
    try:
        client.settimeout(5)
        client.connect((dst, port))
        while time.monotonic() < stop_at:
            client.send(block)
    finally:
        client.close()
        thread.join(30)
        listener.close()
    if len(stamps) < 2:
        raise RuntimeError("no traffic measured")
    # bytes after the first chunk, over the time from the first chunk to the last
    payload = sum(n for _, n in stamps[1:])
    return payload * 8 / (stamps[-1][0] - stamps[0][0])


def window(mbit: int, seconds: float) -> float:
    """Measurement time for a rate. Over any window T a token bucket lets through up to
    rate x T + burst; with cni-chain's 32 KiB minimum burst that is +6.5% at 1 Mbit/s
    over 4 s, so slow rates get a longer window (12 s: at most +2.2%)."""
    return max(seconds, 12.0) if mbit <= 1 else seconds


def measure(impl: str, mbit: int | None, seconds: float, rounds: int) -> tuple[float, float]:
    """Median (ingress, egress) goodput in bit/s for one implementation and rate."""
    with tempfile.TemporaryDirectory() as tmp, nslib.namespaces("bhost", "bctr") as (host, ctr):
        host.sysctl("net.ipv4.ip_forward", "1")
        for ns in (host, ctr):  # small send buffers: little left to drain at the end
            ns.sysctl("net.ipv4.tcp_wmem", "4096 16384 262144")
        work = Path(tmp)
        env = {"CNI_META_STATE_ROOT": str(work / "state")}
        chain = Chain(host, work, cni_path=IMPLEMENTATIONS[impl], env=env)
        conflist = load_conflist("bandwidth.conflist", work)
        flags = ["--bandwidth", f"{mbit}mbit"] if mbit else []
        result = chain.run("add", str(conflist), ctr.path, *flags).json
        ip = container_address(result)
        ingress = [goodput(host, ctr, ip, 5201 + i, seconds) for i in range(rounds)]
        egress = [goodput(ctr, host, GATEWAY, 5301 + i, seconds) for i in range(rounds)]
        chain.run("del", str(conflist), ctr.path)
    return statistics.median(ingress), statistics.median(egress)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--quick", action="store_true", help="10 and 100 Mbit/s, 1 s: a smoke test")
    args = ap.parse_args()
    quick_mode(args.quick)
    rates: tuple[int, ...] = RATES_MBIT
    if args.quick:
        args.rounds, args.seconds, rates = 1, 1.0, (10, 100)
    rows = []
    base_in, base_out = measure("ours", None, args.seconds, 1)
    for mbit in rates:
        configured = mbit * 1_000_000
        seconds = window(mbit, args.seconds)
        for impl in IMPLEMENTATIONS:
            ingress, egress = measure(impl, mbit, seconds, args.rounds)
            for direction, value in (("ingress", ingress), ("egress", egress)):
                ratio = value / configured
                rows.append(
                    (
                        f"{mbit} Mbit/s",
                        direction,
                        impl,
                        f"{value / 1e6:.3f}",
                        f"{ratio:.3f}",
                        f"{ratio * FRAME_PER_PAYLOAD:.3f}",
                    )
                )
            print(rows[-2], rows[-1], flush=True)
    text = (
        "# bandwidth: shaping accuracy, ours vs Go\n\n"
        f"{machine_line()}; medians of {args.rounds} TCP transfers of {args.seconds:g} s per "
        f"cell ({window(1, args.seconds):g} s at 1 Mbit/s, see window()) after 1 s warm-up, "
        "Go bridge + host-local, burst = max(rate/50, 32 KiB) (cni-chain's default).\n\n"
        "ingress = host -> container (tbf on the host veth); egress = container -> host "
        "(redirected to the ifb's tbf). 'frames/configured' = goodput x 1514/1448: the "
        "Ethernet frame rate tbf limits.\n\n"
        + markdown_table(
            (
                "configured",
                "direction",
                "plugin",
                "goodput Mbit/s",
                "goodput/configured",
                "frames/configured",
            ),
            rows,
        )
        + f"\n\nUnshaped, same setup: ingress {base_in / 1e6:.0f} Mbit/s, "
        f"egress {base_out / 1e6:.0f} Mbit/s (what this machine can push at all).\n"
    )
    path = write_result("bandwidth_accuracy.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

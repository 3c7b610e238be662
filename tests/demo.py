"""make demo: the whole meta chain on a throwaway "machine", with real traffic.

Creates three network namespaces - a "host" where the plugins run, a "container", and a
"client" (another machine on the host's uplink) - runs conflists/demo.conflist (flatnet with
flatnet-ipam, portmap, bandwidth and tuning: our code alone, no Go plugin in CNI_PATH)
through cni-chain with a port mapping, a bandwidth limit and a MAC, serves HTTP in the
container, fetches it through the host port, measures the shaped rates, shows what the
plugins applied, tears everything down and proves nothing is left. Nothing touches the
machine's own network namespace.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness import netns as nslib
from tests.harness.plugins import OUR_BIN, Chain, container_address, load_conflist
from tests.harness.traffic import measure_throughput

HOST_PORT = 8080
MAC = "02:42:ac:11:00:99"
RATE = 20_000_000  # bits/s, both directions
UPLINK_HOST, UPLINK_CLIENT = "203.0.113.1", "203.0.113.2"  # TEST-NET-3, inside our namespaces only

results: list[tuple[str, bool]] = []


def step(title: str) -> None:
    print(f"\n== {title}")


def check(what: str, ok: bool, detail: str = "") -> bool:
    results.append((what, ok))
    print(f"  [{'ok' if ok else 'FAIL'}] {what}{': ' + detail if detail else ''}")
    return ok


def show(argv: list[str], netns: nslib.Netns | None = None) -> str:
    out = nslib.sh(*argv, check=False, netns=netns.name if netns else None)
    for line in out.strip().splitlines():
        print("    " + line)
    return out


def http_server(ctr: nslib.Netns) -> http.server.HTTPServer:
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name is http.server's API
            body = f"hello from the container, you are {self.client_address[0]}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with ctr.entered():
        server = http.server.HTTPServer(("0.0.0.0", 80), Hello, bind_and_activate=False)
        server.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.server_bind()
    server.server_activate()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def curl(ns: nslib.Netns, url: str) -> str:
    proc = subprocess.run(
        ["ip", "netns", "exec", ns.name, "curl", "-s", "-m", "3", url],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip()


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="cni-demo-") as tmp,
        nslib.namespaces("dhost", "dctr", "dclient") as (host, ctr, client),
    ):
        work = Path(tmp)
        env = {"CNI_META_STATE_ROOT": str(work / "state"), "CNI_META_LOG_FILE": str(work / "log")}
        chain = Chain(host, work, cni_path=str(OUR_BIN), env=env)  # no Go plugin reachable
        step("namespaces: host (runs the plugins), container, client (another machine)")
        host.sysctl("net.ipv4.ip_forward", "1")
        host.ip(
            "link", "add", "uplink", "type", "veth", "peer", "name", "eth0", "netns", client.name
        )
        host.ip("addr", "add", f"{UPLINK_HOST}/24", "dev", "uplink")
        host.ip("link", "set", "uplink", "up")
        client.ip("addr", "add", f"{UPLINK_CLIENT}/24", "dev", "eth0")
        client.ip("link", "set", "eth0", "up")
        print(f"  host={host.name} container={ctr.name} client={client.name}")

        step("cni-chain add conflists/demo.conflist (flatnet, portmap, bandwidth, tuning)")
        conflist = load_conflist("demo.conflist", work)
        flags = ["--port", f"{HOST_PORT}:80/tcp", "--bandwidth", f"{RATE}", "--mac", MAC]
        print("  flags: " + " ".join(flags))
        run = chain.run("add", str(conflist), ctr.path, *flags, check=False)
        if not check("ADD of the whole chain", run.returncode == 0, run.stderr.strip()):
            return report()
        result = run.json
        print("    " + json.dumps(result, indent=2).replace("\n", "\n    "))
        ip = container_address(result, 4)

        step("HTTP in the container, fetched through the host port")
        server = http_server(ctr)
        try:
            for label, ns, url in (
                ("the container directly", host, f"http://{ip}:80/"),
                ("127.0.0.1 on the host", host, f"http://127.0.0.1:{HOST_PORT}/"),
                ("the host's own address", host, f"http://{UPLINK_HOST}:{HOST_PORT}/"),
                ("another machine (client netns)", client, f"http://{UPLINK_HOST}:{HOST_PORT}/"),
            ):
                body = curl(ns, url)
                check(f"GET via {label}", body.startswith("hello"), body or "no answer")
        finally:
            server.shutdown()
            server.server_close()

        step(f"shaped throughput (configured {RATE / 1e6:.0f} Mbit/s each way)")
        for label, sender, receiver, dst, port in (
            ("into the container (ingress)", host, ctr, ip, 5201),
            ("out of the container (egress)", ctr, host, "10.89.0.1", 5202),
        ):
            t = measure_throughput(sender, receiver, dst, port, seconds=2.0)
            ratio = t.bits_per_second / RATE
            check(
                f"{label}: {t.bits_per_second / 1e6:.1f} Mbit/s = {ratio:.0%} of configured",
                0.5 <= ratio <= 1.10,
            )

        step("what the plugins applied")
        link = ctr.ip("link", "show", "eth0")
        print("    " + link.strip().replace("\n", "\n    "))
        check("MAC set by tuning", MAC in link)
        check("MTU 1400 set by tuning", "mtu 1400" in link)
        redirects = ctr.sysctl("net.ipv4.conf.eth0.accept_redirects")
        check("sysctl net.ipv4.conf.eth0.accept_redirects = 0", redirects == "0", redirects)
        print("  nft ruleset in the host netns:")
        show(["nft", "list", "ruleset"], host)
        print("  qdiscs in the host netns:")
        show(["tc", "qdisc", "show"], host)

        step("cni-chain check, then del")
        check("CHECK", chain.run("check", str(conflist), ctr.path, check=False).returncode == 0)
        run = chain.run("del", str(conflist), ctr.path, check=False)
        check("DEL", run.returncode == 0, run.stderr.strip())
        tables = nslib.sh("nft", "list", "tables", netns=host.name).strip()
        check("no nft tables left in the host netns", tables == "", tables)
        ifbs = host.ip("-o", "link", "show", "type", "ifb").strip()
        check("no ifb devices left", ifbs == "", ifbs)
        state = [str(p) for p in (work / "state").rglob("*.json")]
        check("no plugin state files left", not state, " ".join(state))
        check("container has no eth0 any more", "eth0" not in ctr.ip("link"))

    step("teardown")
    left = nslib.leftover_namespaces()
    check("all demo namespaces removed", not left, " ".join(left))
    return report()


def report() -> int:
    failed = [w for w, ok in results if not ok]
    print(f"\n{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("make demo needs root (it creates network namespaces)")
    sys.exit(main())

"""What portmap's benches share: a throwaway netns pre-filled with N attachments in the
exact shape a portmap writes them (bulk-loaded: creating 5,000 one by one through Go's
plugin would take an hour), and the loop that measures flavours against each other in
such namespaces (bench/portmap_scale.py, bench/xtables.py).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.util import GO_BIN, SYSTEM_PATH, Spawner, build_spawner, our_plugins, rotated
from common.config import parse_netconf
from common.identity import Attachment
from common.netns import entered
from common.result import Result
from common.store import AttachmentStore
from portmap import config as cfg
from portmap import nft
from portmap.config import go_chain_name, owner_comment
from portmap.nft import T, skeleton_text
from portmap.plan import make_plan
from portmap.state import Recorded

NETWORK = "benchnet"


def sh(*argv: str, stdin: str | None = None) -> str:
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])}... failed: {p.stderr[:500]}")
    return p.stdout


def ctr_ip(i: int) -> str:
    """Attachment i's container address in 10.100.0.0/16 (then 10.101.0.0/16...): one of
    its own, as a runtime's IPAM would give (never the network address)."""
    n = i + 1
    return f"10.{100 + n // 65536}.{(n // 256) % 256}.{n % 256}"


def ctr_subnet(i: int) -> str:
    return f"10.{100 + (i + 1) // 65536}.0.0/16"


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
    """N attachments exactly as our nftables backend's ADD leaves them: planned from their
    configs, their elements (ownership proof included) and masq chains written by the
    backend's own text functions, their committed records saved through the store."""
    store = AttachmentStore(str(state_root / "portmap"), Recorded)
    store.ensure()
    by_set: dict[str, list[str]] = {}
    masq: set[tuple[int, int]] = set()
    for i in range(n):
        raw = conf(i, "nftables")
        att = Attachment(NETWORK, f"fill{i}", "eth0")
        plan = make_plan(
            cfg.parse(parse_netconf(raw)), att, Result.from_json(raw["prevResult"], "1.0.0")
        )
        elements = nft.plan_elements(plan)
        masq.update(nft.plan_masq_chains(plan))
        for e in elements:
            by_set.setdefault(e.set, []).append(e.text(owner_comment(att)))
        store.save(att, nft.record_of(att, elements).replace(committed=True))
    lines = skeleton_text()
    for fp in sorted(masq):
        lines += nft.masq_chain_text(*fp)
    for name, items in by_set.items():
        for k in range(0, len(items), 1000):
            lines.append(f"add element {T} {name} {{ {', '.join(items[k : k + 1000])} }}")
    sh("ip", "netns", "exec", ns, "nft", "-f", "-", stdin="\n".join(lines) + "\n")


def ipt_rules(n: int, go_style: bool) -> str:
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
        # Go's rules and ours are the same (go_style only picks the variant)
        chain = go_chain_name(NETWORK, f"fill{i}")
        comment = f'dnat name: \\"{NETWORK}\\" id: \\"fill{i}\\"'
        jump = (f'-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "{comment}" '
                f"-m multiport --dports {port} -j {chain}")  # fmt: skip
        out.append(f":{chain} - [0:0]")
        body += [
            jump,
            f"-A {chain} -s {ctr_subnet(i)} -p tcp -m tcp --dport {port} -j CNI-HOSTPORT-SETMARK",
            f"-A {chain} -s 127.0.0.1/32 -p tcp -m tcp --dport {port} -j CNI-HOSTPORT-SETMARK",
            f"-A {chain} -p tcp -m tcp --dport {port} -j DNAT --to-destination {ip}:80",
        ]
    return "\n".join(out + body + ["COMMIT", ""])


def fill_iptables(ns: str, n: int, go_style: bool) -> None:
    restore = "iptables-nft-restore" if go_style else "iptables-legacy-restore"
    sh("ip", "netns", "exec", ns, restore, "--noflush", stdin=ipt_rules(n, go_style))


# ---------------------------------------------------------------------------- measuring


class Flavour:
    """One portmap flavour in its own netns (self.ns) filled with N attachments, beside a
    container netns; a subclass fills it (setup) and says what a round is (cycle)."""

    def __init__(self, name: str, n: int, exe: str, workdir: Path, backend: str | None) -> None:
        self.name, self.n, self.exe, self.backend = name, n, exe, backend
        tag = uuid.uuid4().hex[:8]
        self.ns = f"cmpb-{name.replace('+', '-')}-{tag}"
        self.ctr = f"cmpb-ctr-{tag}"
        self.state = workdir / f"{name}-{n}"
        self.env = {
            "PATH": SYSTEM_PATH,
            "CNI_META_STATE_ROOT": str(self.state),
            "CNI_META_LOCK_TIMEOUT": "60",
            "CNI_IFNAME": "eth0",
            "CNI_NETNS": f"/run/netns/{self.ctr}",
            "CNI_PATH": str(GO_BIN),
        }
        self.rss_kib = 0

    def setup(self, stack: ExitStack) -> None:
        for ns in (self.ns, self.ctr):
            sh("ip", "netns", "add", ns)
            stack.callback(sh, "ip", "netns", "del", ns)
        self.state.mkdir(parents=True)

    def call(self, spawn: Spawner, command: str, i: int) -> float:
        """One whole plugin call, exec'd from inside self.ns; its wall time in ms."""
        env = {**self.env, "CNI_COMMAND": command, "CNI_CONTAINERID": f"bench{i}"}
        with entered(f"/run/netns/{self.ns}"):
            c = spawn.ok([self.exe], env, json.dumps(conf(i, self.backend)).encode())
        self.rss_kib = max(self.rss_kib, c.rss_kib)
        return c.ms

    def cycle(self, spawn: Spawner, i: int, record: bool) -> None:
        raise NotImplementedError

    def result(self) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def summary(result: dict[str, Any]) -> str:
        raise NotImplementedError


def measure(
    flavour: Callable[[str, int, Path, Path], Flavour],
    names: list[str],
    sizes: list[int],
    reps: int,
    launcher: str,
) -> list[dict[str, Any]]:
    """For each size N, every named flavour with N attachments: one warm-up round (page
    cache, Go's top-level chains), then `reps` recorded rounds, the flavours'
    order rotating every round. Prints each result's `flavour.summary` as it comes."""
    results = []
    with tempfile.TemporaryDirectory(prefix="cmpb-") as tmp:
        workdir = Path(tmp)
        spawn = Spawner(build_spawner(workdir))
        our_bin = our_plugins(launcher, workdir)
        for n in sizes:
            with ExitStack() as stack:
                flavours = [flavour(name, n, our_bin, workdir) for name in names]
                for f in flavours:
                    f.setup(stack)
                for f in flavours:
                    f.cycle(spawn, n + reps, record=False)
                for r in range(reps):
                    for f in rotated(flavours, r):
                        f.cycle(spawn, n + r, record=True)
                for f in flavours:
                    results.append(f.result())
                    print(f.summary(results[-1]), flush=True)
    return results

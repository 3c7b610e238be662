"""Many containers on one bridge in one host netns, made and removed in bulk.

`ip netns add` and `ip link add` once per container would cost hundreds of execs; here
all namespaces come from one `ip -batch`, all veths (host end on the bridge, the other end
created directly in its container as eth0) from one `ip -n HOST -batch`, and each
container's own setup (lo, eth0 up, address, default route) from one `ip -n CTR -batch`.

    host:  cbr0 10.77.0.1/16  <- vh0 .. vhN-1 (bridge ports)
    ctr i: eth0 10.77.(i+2)//256.(i+2)%256/16, default via 10.77.0.1
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.harness import netns as nslib
from tests.harness.netns import Netns

BRIDGE = "cbr0"
GATEWAY = "10.77.0.1"
PREFIX_LEN = 16


def _batch(lines: list[str], netns: str | None = None) -> None:
    argv = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()[:500]}")


@dataclass(frozen=True)
class Member:
    index: int
    ctr: Netns

    @property
    def host_veth(self) -> str:
        return f"vh{self.index}"

    @property
    def address(self) -> str:
        n = self.index + 2
        return f"10.77.{n // 256}.{n % 256}"

    @property
    def container_id(self) -> str:
        return f"ctr{self.index:04d}"

    def prev_result(self, version: str = "1.0.0") -> dict[str, object]:
        """What the bridge plugin would have reported for this container."""
        return {
            "cniVersion": version,
            "interfaces": [
                {"name": BRIDGE, "mac": "02:77:00:00:00:01"},
                {"name": self.host_veth, "mac": "02:77:01:00:00:01"},
                {"name": "eth0", "mac": "02:77:02:00:00:01", "sandbox": self.ctr.path},
            ],
            "ips": [
                {
                    "address": f"{self.address}/{PREFIX_LEN}",
                    "gateway": GATEWAY,
                    "interface": 2,
                }
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
        }


@dataclass
class Fleet:
    host: Netns
    members: list[Member]


def _names(role: str, n: int) -> list[Netns]:
    run = uuid.uuid4().hex[:6]
    return [Netns(f"{nslib.PREFIX}-{role}-{run}-{i}") for i in range(n)]


@contextmanager
def fleet(host: Netns, n: int) -> Iterator[Fleet]:
    """`n` containers bridged into `host`; every namespace is deleted afterwards."""
    ctrs = _names("fl", n)
    nslib._created.update(ns.name for ns in ctrs)  # the session leak check holds us to them
    try:
        _batch([f"netns add {ns.name}" for ns in ctrs])
        members = [Member(i, ns) for i, ns in enumerate(ctrs)]
        lines = [
            f"link add {BRIDGE} type bridge",
            f"addr add {GATEWAY}/{PREFIX_LEN} dev {BRIDGE}",
            f"link set {BRIDGE} up",
        ]
        for m in members:
            lines.append(f"link add {m.host_veth} type veth peer name eth0 netns {m.ctr.name}")
            lines.append(f"link set {m.host_veth} master {BRIDGE} up")
        _batch(lines, host.name)
        for m in members:
            _batch(
                [
                    "link set lo up",
                    "link set eth0 up",
                    f"addr add {m.address}/{PREFIX_LEN} dev eth0",
                    f"route add default via {GATEWAY}",
                ],
                m.ctr.name,
            )
        yield Fleet(host, members)
    finally:
        doomed = [f"netns del {ns.name}" for ns in ctrs if os.path.exists(ns.path)]
        if doomed:
            _batch(doomed)

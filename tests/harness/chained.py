"""One fleet member's configs for portmap, bandwidth and tuning, and running them.

Each config is what libcni would hand the plugin from a conflist
`bridge -> portmap -> bandwidth -> tuning`: the runtime's capability arguments in
`runtimeConfig`, the bridge's result as `prevResult`. Member i gets host ports
20000+i/tcp -> 80 and 30000+i/udp -> 53, 10 Mbit/s each way, MAC 02:77:aa:00:HI:LO,
MTU 1400 and accept_redirects=0 on eth0.
"""

from __future__ import annotations

from typing import Any

from tests.harness.fleet import Member
from tests.harness.netns import Netns
from tests.harness.plugins import Invocation as Invocation  # the tests' names for them
from tests.harness.plugins import invocation as plugin_invocation
from tests.harness.plugins import our
from tests.harness.plugins import run as run

NETWORK = "cmp-rel"
PLUGINS = ("portmap", "bandwidth", "tuning")
RATE = 10_000_000  # bit/s
BURST = 1_000_000  # bits
MTU = 1400
SYSCTL = "net.ipv4.conf.IFNAME.accept_redirects"


def tcp_port(m: Member) -> int:
    return 20000 + m.index


def udp_port(m: Member) -> int:
    return 30000 + m.index


def mac(m: Member) -> str:
    return f"02:77:aa:00:{m.index >> 8:02x}:{m.index & 0xFF:02x}"


def static_conf(plugin: str, *, backend: str | None = None) -> dict[str, Any]:
    """The plugin's entry in the conflist (what does not depend on the container)."""
    base: dict[str, Any] = {"cniVersion": "1.0.0", "name": NETWORK, "type": plugin}
    if plugin == "portmap":
        base.update(capabilities={"portMappings": True}, snat=True)
        if backend:
            base["backend"] = backend
    elif plugin == "bandwidth":
        base["capabilities"] = {"bandwidth": True}
    elif plugin == "tuning":
        base.update(capabilities={"mac": True}, mtu=MTU, sysctl={SYSCTL: "0"})
    else:
        raise ValueError(plugin)
    return base


def conf(plugin: str, m: Member, *, backend: str | None = None) -> dict[str, Any]:
    """ADD/CHECK/DEL config of member `m`: runtimeConfig and the bridge's prevResult."""
    body = static_conf(plugin, backend=backend)
    if plugin == "portmap":
        body["runtimeConfig"] = {
            "portMappings": [
                {"hostPort": tcp_port(m), "containerPort": 80, "protocol": "tcp"},
                {"hostPort": udp_port(m), "containerPort": 53, "protocol": "udp"},
            ]
        }
    elif plugin == "bandwidth":
        rates = {"ingressRate": RATE, "ingressBurst": BURST}
        rates.update(egressRate=RATE, egressBurst=BURST)
        body["runtimeConfig"] = {"bandwidth": rates}
    else:
        body["runtimeConfig"] = {"mac": mac(m)}
    body["prevResult"] = m.prev_result()
    return body


def gc_conf(plugin: str, valid: list[Member], *, backend: str | None = None) -> dict[str, Any]:
    """A 1.1.0 GC config naming `valid` as the attachments still alive."""
    body = static_conf(plugin, backend=backend)
    body["cniVersion"] = "1.1.0"
    body["cni.dev/valid-attachments"] = [
        {"containerID": v.container_id, "ifname": "eth0"} for v in valid
    ]
    return body


def invocation(
    plugin: str,
    command: str,
    m: Member,
    host: Netns,
    env: dict[str, str],
    body: dict[str, Any] | None = None,
) -> Invocation:
    """Member `m`'s call of our `plugin` (a GC names no attachment)."""
    gc = command == "GC"
    return plugin_invocation(
        our(plugin), command, body if body is not None else conf(plugin, m), host=host,
        container_id=m.container_id, netns="" if gc else m.ctr.path, env=env,
        drop=("CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS") if gc else (),
    )  # fmt: skip

"""podman 4 (CNI backend) drives conflists/podman-bridge.conflist with Go's plugins and ours.

podman runs inside the test's host netns and a private mount namespace (see
tests/harness/runtimes.py), with its own storage, containers.conf, network dir and CNI
cache; curl and the UDP client run in the host netns or in a client netns on its uplink.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.lab import Lab
from tests.harness.runtimes import (
    Podman,
    Uplink,
    files_under,
    have,
    kernel_snapshot,
    leftover_state,
    podman,
)
from tests.harness.traffic import echo_server, reaches

pytestmark = [
    pytest.mark.root,
    pytest.mark.runtime,
    pytest.mark.skipif(not have("podman") or not have("runc"), reason="podman/runc not installed"),
]

LIST = "podman-bridge.conflist"
HTTPD = ("httpd", "-f", "-p", "80", "-h", "/www")


@pytest.fixture
def pm(lab: Lab, cni_dirs: list[str]) -> Iterator[Podman]:
    # No CNI_META_* variables: podman's cleanup process (started by conmon) would not pass
    # them on anyway, so the plugins use their defaults, inside podman's private /run.
    with podman(lab.host, lab.workdir / "podman", cni_dirs, {}) as p:
        yield p


def curl(ns_name: str, url: str) -> str | None:
    """Body of a GET via curl inside a netns, or None when nothing answered."""
    proc = subprocess.run(
        ["ip", "netns", "exec", ns_name, "curl", "-s", "-m", "3", url],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return proc.stdout if proc.returncode == 0 else None


def run_web(pm: Podman, net: str, name: str, *publish: str, extra: tuple[str, ...] = ()) -> None:
    flags = [f for p in publish for f in ("-p", p)]
    pm.run("run", "-d", "--name", name, "--network", net, *flags, *extra, pm.image, *HTTPD)


def test_published_port_answers_on_localhost_host_address_and_uplink(
    lab: Lab, pm: Podman, uplink: Uplink
) -> None:
    net = pm.add_network(LIST)
    run_web(pm, net, "web", "18080:80")
    assert curl(lab.host.name, "http://127.0.0.1:18080/") == "hello from busybox\n"
    assert curl(lab.host.name, f"http://{uplink.host_addr}:18080/") == "hello from busybox\n"
    assert curl(uplink.client.name, f"http://{uplink.host_addr}:18080/") == "hello from busybox\n"


def test_publish_on_127_0_0_1_is_not_reachable_from_the_uplink(
    lab: Lab, pm: Podman, uplink: Uplink
) -> None:
    net = pm.add_network(LIST)
    run_web(pm, net, "local", "127.0.0.1:18081:80")
    assert curl(lab.host.name, "http://127.0.0.1:18081/") == "hello from busybox\n"
    assert curl(uplink.client.name, f"http://{uplink.host_addr}:18081/") is None


def test_udp_port_reaches_the_container(lab: Lab, pm: Podman, uplink: Uplink) -> None:
    net = pm.add_network(LIST)
    pm.run("run", "-d", "--name", "udp", "--network", net, "-p", "15353:5353/udp",
           pm.image, "sleep", "3600")  # fmt: skip
    with echo_server(pm.sandbox("udp"), 5353, "udp", tag="ctr"):
        assert reaches(uplink.client, uplink.host_addr, 15353, "udp", payload=b"q") == b"ctr:q"
        assert reaches(lab.host, "127.0.0.1", 15353, "udp", payload=b"l") == b"ctr:l"


def test_several_containers_each_answer_on_their_own_port(lab: Lab, pm: Podman) -> None:
    net = pm.add_network(LIST)
    for i in range(3):
        script = f"mkdir -p /w && echo c{i} > /w/index.html && exec httpd -f -p 80 -h /w"
        pm.run("run", "-d", "--name", f"c{i}", "--network", net, "-p", f"1809{i}:80",
               pm.image, "sh", "-c", script)  # fmt: skip
    for i in range(3):
        assert curl(lab.host.name, f"http://127.0.0.1:1809{i}/") == f"c{i}\n"
    pm.run("rm", "-f", "-t", "0", "c1")
    assert curl(lab.host.name, "http://127.0.0.1:18091/") is None
    assert curl(lab.host.name, "http://127.0.0.1:18090/") == "c0\n"
    assert curl(lab.host.name, "http://127.0.0.1:18092/") == "c2\n"


def test_port_range_maps_each_port(lab: Lab, pm: Podman) -> None:
    net = pm.add_network(LIST)
    script = "; ".join(
        f"mkdir -p /w{p} && echo p{p} > /w{p}/index.html && httpd -p {p} -h /w{p}"
        for p in (80, 81, 82)
    )
    pm.run("run", "-d", "--name", "range", "--network", net, "-p", "18100-18102:80-82",
           pm.image, "sh", "-c", script + "; exec sleep 3600")  # fmt: skip
    for host_port, ctr_port in ((18100, 80), (18101, 81), (18102, 82)):
        assert curl(lab.host.name, f"http://127.0.0.1:{host_port}/") == f"p{ctr_port}\n"


def test_host_port_conflict_is_a_readable_error_and_leaves_the_first_alone(
    lab: Lab, pm: Podman
) -> None:
    net = pm.add_network(LIST)
    run_web(pm, net, "first", "18200:80")
    second = pm.run("run", "-d", "--name", "second", "--network", net, "-p", "18200:80",
                    pm.image, *HTTPD, check=False)  # fmt: skip
    assert second.returncode != 0
    message = second.stderr
    assert "18200" in message, message
    assert "Traceback" not in message and "panic" not in message, message
    assert curl(lab.host.name, "http://127.0.0.1:18200/") == "hello from busybox\n"


def test_mac_address_from_cni_args_is_applied_by_tuning_and_restored(lab: Lab, pm: Podman) -> None:
    net = pm.add_network(LIST)
    mac = "02:42:ac:11:00:99"
    run_web(pm, net, "mac", "18300:80", extra=("--mac-address", mac))
    link = pm.run("exec", "mac", "ip", "link", "show", "eth0").stdout
    assert f"link/ether {mac}" in link
    assert curl(lab.host.name, "http://127.0.0.1:18300/") == "hello from busybox\n"
    pm.run("rm", "-f", "-t", "0", "mac")
    assert leftover_state(pm.workdir / "tuning") == []


def test_rm_leaves_no_rules_ifbs_leases_or_backup_files(lab: Lab, pm: Podman) -> None:
    # podman never sends bandwidth itself: a static rate makes every container get an ifb.
    shaped = {"type": "bandwidth", "ingressRate": 8_000_000, "ingressBurst": 400_000,
              "egressRate": 8_000_000, "egressBurst": 400_000}  # fmt: skip
    net = pm.add_network(LIST, extra_plugins=(shaped,))
    # Warm up: the bridge and the Go plugins' shared top-level chains outlive containers.
    run_web(pm, net, "warmup", "18400:80")
    pm.run("rm", "-f", "-t", "0", "warmup")
    before = kernel_snapshot(lab.host)
    leases_before = files_under(pm.workdir / "host-local")

    run_web(pm, net, "web", "18401:80", "127.0.0.1:18402:80", "18403:80/udp",
            extra=("--mac-address", "02:42:ac:11:00:42"))  # fmt: skip
    during = kernel_snapshot(lab.host)
    assert "ifb" in lab.host.ip("-d", "link", "show")
    assert during != before
    assert curl(lab.host.name, "http://127.0.0.1:18401/") == "hello from busybox\n"

    pm.run("rm", "-f", "-t", "0", "web")
    assert kernel_snapshot(lab.host) == before
    assert "ifb" not in lab.host.ip("-d", "link", "show")
    assert files_under(pm.workdir / "host-local") == leases_before
    assert leftover_state(pm.workdir / "tuning") == []
    assert leftover_state(pm.state_root) == []
    assert files_under(pm.workdir / "var-lib" / "cni" / "results") == []


def test_every_network_survives_podmans_version_probe(pm: Podman, our_bin: Path) -> None:
    # podman calls VERSION (CNI_NETNS=dummy) on every plugin of every conflist and drops
    # a network whose plugin fails. Configs that would be invalid for ADD must not matter.
    pm.add_network(LIST)
    odd = {
        "cniVersion": "1.0.0",
        "name": "cmp-odd",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cmp-odd0",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.77.0.0/24"}]]},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "markMasqBit": 99},
            {"type": "bandwidth", "ingressRate": "fast"},
            {"type": "tuning", "sysctl": {"kernel.panic": "1"}},
        ],
    }
    (pm.net_dir / "90-odd.conflist").write_text(json.dumps(odd))
    listed = pm.run("network", "ls", "--format", "{{.Name}}")
    names = listed.stdout.split()
    assert "cmp-podman" in names and "cmp-odd" in names, listed.stdout + listed.stderr
    assert "cmp-odd" not in listed.stderr and "cmp-podman" not in listed.stderr, listed.stderr


# ---------------------------------------------------------------------------- flatnet


@pytest.fixture
def pm_flatnet(lab: Lab, our_bin: Path) -> Iterator[Podman]:
    """podman with our plugins alone in its plugin path: no Go plugin can be reached."""
    with podman(lab.host, lab.workdir / "podman", [str(our_bin)], {}) as p:
        yield p


def test_flatnet_chain_alone_runs_podman_run_rm_p(
    lab: Lab, pm_flatnet: Podman, uplink: Uplink
) -> None:
    """`podman run --rm -p` through flatnet + portmap + bandwidth + tuning (and
    flatnet-ipam in-process): the published port answers, and removing the container
    leaves the host as the first container left it."""
    pm = pm_flatnet
    net = pm.add_network("podman-flatnet.conflist")
    run_web(pm, net, "warmup", "18500:80")  # the bridge and the network's nft chain stay
    pm.run("rm", "-f", "-t", "0", "warmup")
    before = kernel_snapshot(lab.host)
    leases_before = files_under(pm.workdir / "host-local")

    run_web(pm, net, "web", "18501:80")
    assert curl(lab.host.name, "http://127.0.0.1:18501/") == "hello from busybox\n"
    assert curl(uplink.client.name, f"http://{uplink.host_addr}:18501/") == "hello from busybox\n"
    assert "master cni-podman8" in lab.host.ip("link", "show", "type", "veth")

    pm.run("rm", "-f", "-t", "0", "web")
    assert kernel_snapshot(lab.host) == before
    assert files_under(pm.workdir / "host-local") == leases_before
    assert leftover_state(pm.state_root) == []

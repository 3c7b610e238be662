"""containerd 1.6 CRI (the Kubernetes path) drives conflists/containerd-bridge.conflist.

A private containerd runs in the test's host netns (tests/harness/containerd.py); the test
is the kubelet: RunPodSandbox with port mappings and the kubernetes.io/ingress-bandwidth
and egress-bandwidth annotations, then StopPodSandbox and RemovePodSandbox (each of which
tears the network down: DEL arrives twice). containerd sends the bandwidth with a burst of
4294967295 bits (math.MaxUint32) that nobody asked for.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.containerd import Containerd, containerd
from tests.harness.lab import Lab
from tests.harness.runtimes import Uplink, files_under, kernel_snapshot, leftover_state, plugin_dirs
from tests.harness.traffic import echo_server, measure_throughput, reaches

pytestmark = [
    pytest.mark.root,
    pytest.mark.runtime,
    pytest.mark.skipif(
        shutil.which("containerd") is None or shutil.which("ctr") is None,
        reason="containerd not installed",
    ),
]

RATE = 8_000_000  # bits/s: "8M" in the annotations
SHAPED = {"kubernetes.io/ingress-bandwidth": "8M", "kubernetes.io/egress-bandwidth": "8M"}


@pytest.fixture
def ctd(lab: Lab, cni_dirs: list[str]) -> Iterator[Containerd]:
    pytest.importorskip("cri_api", reason="container-runtime-interface-api (test extra)")
    # containerd passes its environment on to the plugins, but kubelet-started containerd
    # has none of ours: the plugins use their defaults, inside the daemon's private /run.
    with containerd(lab.host, lab.workdir, cni_dirs, "containerd-bridge.conflist", {}) as c:
        yield c


def test_pod_host_ports_reach_the_pod_and_teardown_leaves_nothing(
    lab: Lab, ctd: Containerd, uplink: Uplink
) -> None:
    warm = ctd.run_pod("warmup", ((18790, 80, "tcp"),))  # the bridge and shared chains stay
    ctd.stop_pod(warm)
    ctd.remove_pod(warm)
    before = kernel_snapshot(lab.host)

    pod = ctd.run_pod("web", ((18700, 8080, "tcp"), (18701, 5353, "udp")))
    pod_ns = ctd.pod_netns(pod)
    with echo_server(pod_ns, 8080, "tcp", tag="pod"), echo_server(pod_ns, 5353, "udp", tag="u"):
        assert reaches(uplink.client, uplink.host_addr, 18700, "tcp", payload=b"x") == b"pod:x"
        assert reaches(uplink.client, uplink.host_addr, 18701, "udp", payload=b"y") == b"u:y"
        assert reaches(lab.host, "127.0.0.1", 18700, "tcp", payload=b"z") == b"pod:z"

    ctd.stop_pod(pod)  # TearDown: DEL with the netns still there
    assert reaches(uplink.client, uplink.host_addr, 18700, "tcp") is None
    ctd.remove_pod(pod)  # TearDown again: DEL for something already deleted
    assert kernel_snapshot(lab.host) == before
    assert ctd.jail is not None
    assert leftover_state(ctd.jail.path("/run/cni/meta-plugins")) == []
    assert files_under(lab.workdir / "var-lib" / "cni" / "results") == []


def test_bandwidth_annotations_shape_the_pod_both_ways(
    lab: Lab, ctd: Containerd, uplink: Uplink
) -> None:
    pod = ctd.run_pod("shaped", ((18710, 18710, "tcp"),), annotations=SHAPED)
    qdiscs = lab.host.run("tc", "qdisc", "show")
    assert qdiscs.count("tbf") == 2, qdiscs  # host veth (ingress) and the ifb (egress)
    assert "rate 8Mbit" in qdiscs, qdiscs
    pod_ns = ctd.pod_netns(pod)
    # containerd's 4294967295-bit burst lets the first ~260 MB through at line rate: the
    # warmup drains it, then the configured rate must hold.
    into_pod = measure_throughput(
        uplink.client, pod_ns, uplink.host_addr, 18710, seconds=2, warmup=3.0
    )
    out_of_pod = measure_throughput(
        pod_ns, uplink.client, uplink.client_addr, 18711, seconds=2, warmup=3.0
    )
    for direction, got in (("ingress", into_pod), ("egress", out_of_pod)):
        print(f"{direction}: {got.bits_per_second / 1e6:.2f} Mbit/s for {RATE / 1e6:.0f} Mbit/s")
        assert got.bytes_received > 0, f"{direction}: no traffic at all"
        assert got.bits_per_second < 2 * RATE, f"{direction} not shaped: {got}"
    ctd.stop_pod(pod)
    ctd.remove_pod(pod)
    assert "ifb" not in lab.host.ip("-d", "link", "show")
    assert "tbf" not in lab.host.run("tc", "qdisc", "show")


@pytest.fixture
def ctd_flatnet(lab: Lab, our_bin: Path) -> Iterator[Containerd]:
    """containerd whose pod network is flatnet + portmap + bandwidth + tuning (our code);
    Go's directory stays in the path only for the loopback plugin CRI runs itself."""
    pytest.importorskip("cri_api", reason="container-runtime-interface-api (test extra)")
    dirs = plugin_dirs("ours", our_bin)
    with containerd(lab.host, lab.workdir, dirs, "containerd-flatnet.conflist", {}) as c:
        yield c


def test_pod_through_flatnet_chain_reaches_and_teardown_leaves_nothing(
    lab: Lab, ctd_flatnet: Containerd, uplink: Uplink
) -> None:
    ctd = ctd_flatnet
    warm = ctd.run_pod("warmup", ((18890, 80, "tcp"),))  # the bridge and the nft chain stay
    ctd.stop_pod(warm)
    ctd.remove_pod(warm)
    before = kernel_snapshot(lab.host)

    pod = ctd.run_pod("web", ((18800, 8080, "tcp"),), annotations=SHAPED)
    pod_ns = ctd.pod_netns(pod)
    assert "master cni1" in lab.host.ip("link", "show", "type", "veth")
    assert lab.host.run("tc", "qdisc", "show").count("tbf") == 2
    with echo_server(pod_ns, 8080, "tcp", tag="pod"):
        assert reaches(uplink.client, uplink.host_addr, 18800, "tcp", payload=b"x") == b"pod:x"
        assert reaches(lab.host, "127.0.0.1", 18800, "tcp", payload=b"z") == b"pod:z"

    ctd.stop_pod(pod)  # TearDown: DEL with the netns still there
    ctd.remove_pod(pod)  # and again, for what is already gone
    assert kernel_snapshot(lab.host) == before
    assert ctd.jail is not None
    assert leftover_state(ctd.jail.path("/run/cni/meta-plugins")) == []

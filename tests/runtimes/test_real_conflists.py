"""The conflists real distributions write (conflists/real/, see SOURCES.md) through libcni.

Each list keeps upstream's meta-plugin entries as written (flannel, k3s, calico, cilium,
aws-vpc-cni, containerd's install script, podman 4) with the main plugin replaced by the
Go bridge + host-local. cnitool (libcni) runs ADD, CHECK, DEL and DEL again with the
runtime arguments of the runtime that reads the list (CHECK only where libcni runs it):

  * containerd / CRI (the Kubernetes lists): go-cni's structs have no JSON tags, so the
    keys arrive capitalised ("HostPort", "IngressRate"), "HostIP" is always there (empty
    when unset) and an unset burst is 4294967295;
  * podman 4 (libnetwork/cni): lower-case keys, hostIP omitted when empty, one mapping
    per port, `MAC=` in CNI_ARGS for --mac-address.

Each must forward a host port with real TCP traffic (from a client on the uplink and from
the host itself through 127.0.0.1, IPv6 too for the dual-stack list), shape where the list
has bandwidth, apply tuning where it has it, pass CHECK, and leave the host and container
netns as before (rules, links, qdiscs) with no state files after DEL.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import cnitool
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import CONFLISTS, PluginRun
from tests.harness.runtimes import (
    MountJail,
    Uplink,
    files_under,
    kernel_snapshot,
    leftover_state,
    mount_jail,
    write_conflist,
)
from tests.harness.traffic import echo_server, reaches

pytestmark = [pytest.mark.root, pytest.mark.runtime]

REAL = CONFLISTS / "real"
LISTS = sorted(p.name for p in REAL.glob("*.conflist"))
PODMAN_LISTS = {"podman-4.conflist"}
HOST_PORT, CTR_PORT = 18700, 8080
RATE = 8_000_000
MAC = "02:42:ac:11:00:78"
MAX_UINT32 = 4294967295

CONTAINERD_CAPS: dict[str, Any] = {
    "portMappings": [
        {"HostPort": HOST_PORT, "ContainerPort": CTR_PORT, "Protocol": "tcp", "HostIP": ""}
    ],
    "bandwidth": {
        "IngressRate": RATE,
        "IngressBurst": MAX_UINT32,
        "EgressRate": RATE,
        "EgressBurst": MAX_UINT32,
    },
}
PODMAN_CAPS: dict[str, Any] = {
    "portMappings": [{"hostPort": HOST_PORT, "containerPort": CTR_PORT, "protocol": "tcp"}]
}

# Debian's Go plugins (1.1.1) fail CHECK of healthy attachments (fixed upstream in 1.3.0):
# portmap checks IPv6 chains of IPv4-only attachments, tuning does not expand IFNAME.
GO_CHECK_BUGS = ("could not check ipv6 dnat", "/IFNAME/")


def runtime_env(listname: str, cid: str) -> dict[str, str]:
    if listname in PODMAN_LISTS:
        return {
            "CAP_ARGS": json.dumps(PODMAN_CAPS),
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAME={cid};MAC={MAC}",
        }
    return {
        "CAP_ARGS": json.dumps(CONTAINERD_CAPS),
        "CNI_ARGS": (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid};"
            f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=uid-{cid}"
        ),
    }


def install_list(listname: str, conf_dir: Path, data_dir: Path) -> dict[str, Any]:
    """conflists/real/<name> into conf_dir, with host-local's and tuning's state in data_dir."""
    return write_conflist(listname, conf_dir, data_dir, source=REAL)


class Tool:
    def __init__(self, jail: MountJail, conf_dir: Path, cni_dirs: list[str], env: dict[str, str]):
        self.jail = jail
        self.env = {
            **os.environ,
            **env,
            "NETCONFPATH": str(conf_dir),
            "CNI_PATH": os.pathsep.join(cni_dirs),
        }
        self.exe = cnitool.build()

    def run(self, verb: str, listname: str, net: str, ctr: Netns, cid: str) -> PluginRun:
        env = {**self.env, **runtime_env(listname, cid), "CNI_CONTAINERID": cid}
        argv = self.jail.argv(self.exe, verb, net, ctr.path)
        proc = subprocess.run(argv, env=env, capture_output=True, check=False, timeout=60)
        return PluginRun(proc.returncode, proc.stdout.decode(), proc.stderr.decode())

    def ok(self, verb: str, listname: str, net: str, ctr: Netns, cid: str) -> PluginRun:
        out = self.run(verb, listname, net, ctr, cid)
        assert out.returncode == 0, f"cnitool {verb} {listname}: {out.stderr} {out.stdout}"
        return out


def snapshot(lab: Lab) -> dict[str, str]:
    """Host rules, links and qdiscs, and the container's links."""
    return {
        **kernel_snapshot(lab.host),
        "qdiscs": lab.host.run("tc", "qdisc", "show"),
        "ctr links": "\n".join(
            sorted(line.split(":")[1].strip() for line in lab.ctr.ip("-o", "link").splitlines())
        ),
    }


def answer(client: Netns, dst: str) -> bytes | None:
    # A fresh IPv6 address may still be settling (DAD in the container): retry briefly.
    for _ in range(20):
        got = reaches(client, dst, HOST_PORT, "tcp", payload=b"x", timeout=0.5)
        if got is not None:
            return got
        time.sleep(0.1)
    return None


def has_v6(raw: dict[str, Any]) -> bool:
    ranges = raw["plugins"][0].get("ipam", {}).get("ranges", [])
    return any(":" in r["subnet"] for group in ranges for r in group)


@pytest.mark.parametrize("listname", LISTS)
def test_real_conflist_add_check_traffic_del(
    lab: Lab, uplink: Uplink, cni_dirs: list[str], flavour: str, listname: str
) -> None:
    conf_dir = lab.workdir / "net.d"
    raw = install_list(listname, conf_dir, lab.workdir)
    net = str(raw["name"])
    types = {str(p["type"]): p for p in raw["plugins"]}
    warm = lab.new_netns("warm")
    with mount_jail(lab.host, lab.workdir / "var-lib") as jail:
        tool = Tool(jail, conf_dir, cni_dirs, lab.env)
        # Warm up: the bridge and Go portmap's/firewall's shared chains outlive attachments.
        tool.ok("add", listname, net, warm, "warm")
        tool.ok("del", listname, net, warm, "warm")
        before = snapshot(lab)

        result = json.loads(tool.ok("add", listname, net, lab.ctr, "ctr1").stdout)
        assert result["cniVersion"] == raw["cniVersion"]

        with echo_server(lab.ctr, CTR_PORT, "tcp", tag="tcp"):
            assert answer(uplink.client, uplink.host_addr) == b"tcp:x", "uplink -> host port"
            assert answer(lab.host, "127.0.0.1") == b"tcp:x", "localhost -> host port"
            if has_v6(raw):
                assert answer(uplink.client, uplink.host_addr6) == b"tcp:x", "IPv6 host port"

        qdiscs = lab.host.run("tc", "qdisc", "show")
        if "bandwidth" in types:
            # Both directions at the rate containerd sent in capitalised keys.
            assert qdiscs.count("rate 8Mbit") == 2, qdiscs
            assert "ifb" in lab.host.ip("-d", "link", "show")
        else:
            assert "tbf" not in qdiscs
        tuning = types.get("tuning")
        if tuning is not None and listname in PODMAN_LISTS:
            assert f"link/ether {MAC}" in lab.ctr.ip("link", "show", "eth0")
        for key, value in (tuning or {}).get("sysctl", {}).items():
            assert lab.ctr.sysctl(key) == value, key

        # libcni refuses CHECK below 0.4.0 (flannel, calico 3.29, cilium: runtimes never
        # check those) and skips the plugins with disableCheck (aws-vpc-cni).
        check = tool.run("check", listname, net, lab.ctr, "ctr1")
        if raw["cniVersion"] in ("0.3.0", "0.3.1"):
            assert "does not support the CHECK command" in check.stderr, check
        elif flavour == "ours" or check.returncode == 0:
            assert check.returncode == 0, f"CHECK {listname}: {check.stderr} {check.stdout}"
        else:
            assert any(bug in check.stderr for bug in GO_CHECK_BUGS), check.stderr

        tool.ok("del", listname, net, lab.ctr, "ctr1")
        tool.ok("del", listname, net, lab.ctr, "ctr1")  # kubelet/containerd send DEL twice
        assert snapshot(lab) == before
        assert leftover_state(lab.workdir / "tuning") == []
        assert leftover_state(lab.state_root) == []
        assert files_under(lab.workdir / "var-lib" / "cni" / "results") == []
    if flavour == "ours":  # Go's tuning never puts sysctls back
        for key in (tuning or {}).get("sysctl", {}):
            assert lab.ctr.sysctl(key) == "0", f"{key} not restored"

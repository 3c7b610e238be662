"""cni-chain drives a real conflist: Go bridge + host-local first, our plugins after."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import Lab
from tests.harness.plugins import container_address, load_conflist
from tests.harness.traffic import echo_server, request

pytestmark = pytest.mark.root


def test_add_check_del_ipv4_chain_with_traffic(lab: Lab) -> None:
    conflist = load_conflist("ipv4.conflist", lab.workdir)
    result = lab.chain.add(conflist, lab.ctr)
    assert result["cniVersion"] == "1.0.0"
    ip = container_address(result, 4)
    assert ip in lab.ctr.ip("-4", "addr", "show", "eth0")
    with echo_server(lab.ctr, 7000, "tcp", tag="c1"):
        assert request(lab.host, ip, 7000, "tcp", b"hi") == b"c1:hi"
    lab.chain.check(conflist, lab.ctr)
    cache = lab.workdir / "cache"
    assert len(os.listdir(cache)) == 1
    lab.chain.delete(conflist, lab.ctr)
    assert os.listdir(cache) == []
    assert "eth0" not in lab.ctr.ip("link")
    lab.chain.delete(conflist, lab.ctr)  # DEL twice: still fine


def test_dual_stack_chain_gives_both_families(lab: Lab) -> None:
    conflist = load_conflist("dual-stack.conflist", lab.workdir)
    result = lab.chain.add(conflist, lab.ctr)
    assert result["cniVersion"] == "1.0.0"
    v6 = container_address(result, 6)
    assert container_address(result, 4)
    with echo_server(lab.ctr, 7001, "udp", tag="c6"):
        # IPv6 DAD may hold the address briefly: retry a few times.
        for _ in range(30):
            try:
                assert request(lab.host, v6, 7001, "udp", b"x", timeout=0.3) == b"c6:x"
                break
            except OSError:
                continue
        else:
            pytest.fail(f"no UDP answer from [{v6}]")
    lab.chain.delete(conflist, lab.ctr)


def test_gc_and_status_reach_every_plugin_of_a_1_1_0_list(lab: Lab) -> None:
    # Debian's Go plugins stop at 1.0.0, so a 1.1.0 list holds only ours here.
    meta = {
        "cniVersion": "1.1.0",
        "name": "cmp-meta",
        "plugins": [{"type": "portmap"}, {"type": "bandwidth"}, {"type": "tuning"}],
    }
    path = lab.workdir / "meta.conflist"
    path.write_text(json.dumps(meta))
    lab.chain.run("status", str(path))
    lab.chain.run("gc", str(path), "--valid", "c1/eth0")
    assert (
        lab.chain.run(
            "status", str(load_conflist("ipv4.conflist", lab.workdir)), check=False
        ).returncode
        == 1
    )


def test_del_after_netns_is_gone(lab: Lab) -> None:
    conflist = load_conflist("ipv4.conflist", lab.workdir)
    lab.chain.add(conflist, lab.ctr)
    ctr_path = lab.ctr.path
    lab.ctr.run("true")
    from tests.harness import netns as nslib

    nslib.delete(lab.ctr)
    lab.chain.run("del", str(conflist), ctr_path)


def test_failing_plugin_is_reported_readably(lab: Lab) -> None:
    raw = json.loads(load_conflist("ipv4.conflist", lab.workdir).read_text())
    raw["cniVersion"] = "9.9.9"
    bad = lab.workdir / "bad.conflist"
    bad.write_text(json.dumps(raw))
    run = lab.chain.run("add", str(bad), lab.ctr.path, check=False)
    assert run.returncode == 1
    assert "plugin #1 'bridge'" in run.stderr
    assert "Traceback" not in run.stderr


def test_version_of_every_plugin_in_the_list(lab: Lab) -> None:
    conflist = load_conflist("demo.conflist", lab.workdir)
    info = lab.chain.run("version", str(conflist)).json
    assert set(info) == {"bridge", "portmap", "bandwidth", "tuning"}
    assert "1.1.0" in info["portmap"]["supportedVersions"]

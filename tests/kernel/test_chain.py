"""Real conflists through cnichain's API, its pytest fixtures and the cni-chain program:
Go bridge + host-local first, our plugins after."""

from __future__ import annotations

import json
import os

import pytest

from cnichain import Network, PluginError
from cnichain.pytest_plugin import ChainLab
from tests.harness.lab import Lab
from tests.harness.netns import Netns
from tests.harness.plugins import CONFLISTS, GO_BIN, OUR_BIN, load_conflist
from tests.harness.traffic import echo_server, request

pytestmark = pytest.mark.root

PLUGIN_PATH = [str(OUR_BIN), str(GO_BIN)]


def ipv4(cni_chain: ChainLab) -> Network:
    return cni_chain.network(CONFLISTS / "ipv4.conflist", PLUGIN_PATH)


def test_add_check_del_ipv4_chain_with_traffic(cni_chain: ChainLab) -> None:
    net = ipv4(cni_chain)
    ctr = Netns(cni_chain.ctr.name)
    att = cni_chain.attach(net)
    assert att.result["cniVersion"] == "1.0.0"
    (ip,) = att.addresses(4)
    assert ip in ctr.ip("-4", "addr", "show", "eth0")
    with echo_server(ctr, 7000, "tcp", tag="c1"):
        assert request(Netns(cni_chain.host.name), ip, 7000, "tcp", b"hi") == b"c1:hi"
    att.check()
    cache = cni_chain.workdir / "cache"
    assert len(os.listdir(cache)) == 1
    cni_chain.detach(att)
    assert os.listdir(cache) == []
    assert "eth0" not in ctr.ip("link")
    att.delete()  # DEL twice: still fine


def test_attach_deletes_when_the_body_raises(cni_chain: ChainLab) -> None:
    net = ipv4(cni_chain)
    with pytest.raises(ZeroDivisionError), net.attach("ctr-raise", cni_chain.ctr.path) as att:
        assert att.addresses(4)
        _ = 1 // 0
    assert "eth0" not in cni_chain.ctr.ip("link")
    assert os.listdir(cni_chain.workdir / "cache") == []


def test_plugin_error_names_the_plugin_and_carries_its_cni_error(cni_chain: ChainLab) -> None:
    raw = json.loads((CONFLISTS / "ipv4.conflist").read_text())
    raw["plugins"][1]["backend"] = "no-such-backend"
    net = cni_chain.network(raw, PLUGIN_PATH)
    with pytest.raises(PluginError) as caught:
        cni_chain.attach(net)
    err = caught.value
    assert (err.command, err.plugin, err.index) == ("ADD", "portmap", 1)
    assert isinstance(err.code, int) and err.msg
    assert "plugin #2 'portmap'" in str(err)
    # the fixture DELs the half-made attachment after the test: the bridge's veth goes


def test_dual_stack_chain_gives_both_families(cni_chain: ChainLab) -> None:
    net = cni_chain.network(CONFLISTS / "dual-stack.conflist", PLUGIN_PATH)
    att = cni_chain.attach(net)
    assert att.result["cniVersion"] == "1.0.0"
    (v6,) = att.addresses(6)
    assert att.addresses(4)
    ctr, host = Netns(cni_chain.ctr.name), Netns(cni_chain.host.name)
    with echo_server(ctr, 7001, "udp", tag="c6"):
        # IPv6 DAD may hold the address briefly: retry a few times.
        for _ in range(30):
            try:
                assert request(host, v6, 7001, "udp", b"x", timeout=0.3) == b"c6:x"
                break
            except OSError:
                continue
        else:
            pytest.fail(f"no UDP answer from [{v6}]")


def test_gc_and_status_of_a_1_1_0_list_through_the_api(cni_chain: ChainLab) -> None:
    # Debian's Go plugins stop at 1.0.0, so a 1.1.0 list holds only ours here.
    meta = {
        "cniVersion": "1.1.0",
        "name": "cmp-meta-api",
        "plugins": [{"type": "portmap"}, {"type": "bandwidth"}, {"type": "tuning"}],
    }
    net = cni_chain.network(meta, PLUGIN_PATH)
    net.status()
    net.gc([("c1", "eth0")])
    net.gc()
    assert set(net.versions()) == {"portmap", "bandwidth", "tuning"}


def test_gc_and_status_reach_every_plugin_of_a_1_1_0_list(lab: Lab) -> None:
    # Debian's Go plugins stop at 1.0.0, so a 1.1.0 list holds only ours here.
    meta = {
        "cniVersion": "1.1.0",
        "name": "cmp-meta",
        "plugins": [{"type": "portmap"}, {"type": "bandwidth"}, {"type": "tuning"}],
    }
    path = lab.workdir / "meta.conflist"
    path.write_text(json.dumps(meta))
    lab.cli.run("status", str(path))
    lab.cli.run("gc", str(path), "--valid", "c1/eth0")
    assert (
        lab.cli.run(
            "status", str(load_conflist("ipv4.conflist", lab.workdir)), check=False
        ).returncode
        == 1
    )


def test_del_after_netns_is_gone(lab: Lab) -> None:
    conflist = load_conflist("ipv4.conflist", lab.workdir)
    lab.cli.add(conflist, lab.ctr)
    ctr_path = lab.ctr.path
    lab.ctr.run("true")
    from tests.harness import netns as nslib

    nslib.delete(lab.ctr)
    lab.cli.run("del", str(conflist), ctr_path)


def test_failing_plugin_is_reported_readably(lab: Lab) -> None:
    raw = json.loads(load_conflist("ipv4.conflist", lab.workdir).read_text())
    raw["cniVersion"] = "9.9.9"
    bad = lab.workdir / "bad.conflist"
    bad.write_text(json.dumps(raw))
    run = lab.cli.run("add", str(bad), lab.ctr.path, check=False)
    assert run.returncode == 1
    assert "plugin #1 'bridge'" in run.stderr
    assert "Traceback" not in run.stderr


def test_version_of_every_plugin_in_the_list(lab: Lab) -> None:
    conflist = load_conflist("demo.conflist", lab.workdir)
    info = lab.cli.run("version", str(conflist)).json
    assert set(info) == {"flatnet", "portmap", "bandwidth", "tuning"}
    assert "1.1.0" in info["portmap"]["supportedVersions"]

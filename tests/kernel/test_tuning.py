"""tuning against a real kernel: a veth end named eth0 in the lab's container namespace.

Every assertion about the kernel reads the live state back with iproute2 or /proc/sys of
the container namespace; nothing here trusts the plugin's own report of what it did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.harness import netns as nslib
from tests.harness.lab import Lab
from tests.harness.plugins import container_address, go, load_conflist, run_plugin
from tests.harness.traffic import echo_server, reaches
from tests.harness.tuning_world import (
    EVERYTHING,
    MAC,
    NS_WIDE,
    PER_IF,
    SOMAXCONN,
    TUNING,
    backup_file,
    config,
    failed,
    link,
    live,
    make_veth,
    run,
    sysctl,
)

pytestmark = pytest.mark.root

# ---------------------------------------------------------------------------- ADD and DEL


def test_add_sets_every_option_and_del_restores_all_of_it(lab: Lab) -> None:
    make_veth(lab)
    sysctl(lab.ctr, PER_IF)  # exists
    before = live(lab.ctr, PER_IF, NS_WIDE, SOMAXCONN)
    assert before["link"]["mtu"] == 1500 and before[PER_IF] == "1"

    out = run(lab, "ADD", config(lab, **EVERYTHING)).ok().json
    assert out["interfaces"][1]["mac"] == MAC
    assert out["interfaces"][0]["mac"] == "aa:bb:cc:00:00:01"  # host side untouched
    now = live(lab.ctr, PER_IF, NS_WIDE, SOMAXCONN)
    assert now["link"] == {"mac": MAC, "mtu": 1400, "promisc": True, "allmulti": True, "txqlen": 77}
    assert (now[PER_IF], now[NS_WIDE], now[SOMAXCONN]) == ("0", "80", "1234")

    saved = backup_file(lab)
    assert saved.stat().st_mode & 0o777 == 0o600
    assert json.loads(saved.read_text())["mtu"] == 1500

    run(lab, "DEL", config(lab, **EVERYTHING)).ok()
    assert live(lab.ctr, PER_IF, NS_WIDE, SOMAXCONN) == before
    assert not saved.exists()


@pytest.mark.parametrize("source", ["config", "args.cni"])
def test_every_option_from_config_and_from_args_cni(lab: Lab, source: str) -> None:
    make_veth(lab)
    before = live(lab.ctr, PER_IF, NS_WIDE, SOMAXCONN)
    keys = EVERYTHING if source == "config" else {"args": {"cni": EVERYTHING}}
    run(lab, "ADD", config(lab, **keys)).ok()
    now = live(lab.ctr, PER_IF, NS_WIDE, SOMAXCONN)
    assert now["link"] == {"mac": MAC, "mtu": 1400, "promisc": True, "allmulti": True, "txqlen": 77}
    assert (now[PER_IF], now[NS_WIDE], now[SOMAXCONN]) == ("0", "80", "1234")
    run(lab, "DEL", config(lab)).ok()
    assert live(lab.ctr, PER_IF, NS_WIDE, SOMAXCONN) == before


def test_mac_precedence_in_the_kernel(lab: Lab) -> None:
    """conf mac < CNI_ARGS MAC < runtimeConfig.mac < args.cni.mac, read back from the link."""
    make_veth(lab)
    original = link(lab.ctr)["mac"]
    sources: dict[str, tuple[dict[str, Any], str]] = {
        "conf": ({"mac": "02:00:00:00:00:01"}, ""),
        "env": ({}, "IgnoreUnknown=1;K8S_POD_NAME=p;MAC=02:00:00:00:00:02"),
        "rc": ({"runtimeConfig": {"mac": "02:00:00:00:00:03"}}, ""),
        "args": ({"args": {"cni": {"mac": "02:00:00:00:00:04"}}}, ""),
    }
    order = ["conf", "env", "rc", "args"]
    for n in range(1, 5):
        keys: dict[str, Any] = {}
        cni_args = ""
        for name in order[:n]:
            keys.update(sources[name][0])
            cni_args = cni_args or sources[name][1]
        out = run(lab, "ADD", config(lab, **keys), cni_args=cni_args).ok().json
        expected = f"02:00:00:00:00:0{n}"
        assert link(lab.ctr)["mac"] == expected, order[:n]
        assert out["interfaces"][1]["mac"] == expected
        run(lab, "DEL", config(lab)).ok()
        assert link(lab.ctr)["mac"] == original


def test_second_add_keeps_the_first_originals(lab: Lab) -> None:
    make_veth(lab)
    before = live(lab.ctr, SOMAXCONN, PER_IF)
    run(lab, "ADD", config(lab, mtu=1400, sysctl={SOMAXCONN: "1000"})).ok()
    run(lab, "ADD", config(lab, mtu=1300, mac=MAC, sysctl={SOMAXCONN: "2000", PER_IF: "0"})).ok()
    assert link(lab.ctr)["mtu"] == 1300 and sysctl(lab.ctr, SOMAXCONN) == "2000"
    run(lab, "DEL", config(lab)).ok()
    assert live(lab.ctr, SOMAXCONN, PER_IF) == before


def test_del_without_add_and_del_twice_succeed(lab: Lab) -> None:
    make_veth(lab)
    run(lab, "DEL", config(lab, mtu=1400)).ok()
    run(lab, "ADD", config(lab, mtu=1400)).ok()
    run(lab, "DEL", config(lab, mtu=1400)).ok()
    run(lab, "DEL", config(lab, mtu=1400)).ok()
    assert link(lab.ctr)["mtu"] == 1500


def test_del_succeeds_and_forgets_when_the_netns_is_gone(lab: Lab) -> None:
    ctr = lab.new_netns("gone")
    make_veth(lab, ctr)
    run(lab, "ADD", config(lab, ctr, mtu=1400, sysctl={SOMAXCONN: "999"}), ctr).ok()
    assert backup_file(lab).exists()
    nslib.delete(ctr)
    run(lab, "DEL", config(lab, ctr), ctr).ok()
    assert not backup_file(lab).exists()
    # and when the runtime no longer even passes a netns
    make_veth(lab)
    run(lab, "ADD", config(lab, mtu=1400)).ok()
    run_plugin(TUNING, "DEL", config(lab), host=lab.host, netns="", env=lab.env).ok()
    assert not backup_file(lab).exists()


def test_del_restores_namespace_sysctls_when_the_link_is_gone(lab: Lab) -> None:
    make_veth(lab)
    before = sysctl(lab.ctr, SOMAXCONN)
    run(lab, "ADD", config(lab, mac=MAC, sysctl={SOMAXCONN: "777", PER_IF: "0"})).ok()
    lab.ctr.ip("link", "del", "eth0")
    run(lab, "DEL", config(lab)).ok()
    assert sysctl(lab.ctr, SOMAXCONN) == before
    assert not backup_file(lab).exists()


def test_write_only_sysctl_is_set_without_an_original(lab: Lab) -> None:
    """net.ipv4.route.flush is mode 0200: settable, never readable, so nothing to restore."""
    make_veth(lab)
    conf = config(lab, sysctl={"net.ipv4.route.flush": "1", SOMAXCONN: "700"})
    run(lab, "ADD", conf).ok()
    saved = json.loads(backup_file(lab).read_text())["sysctls"]
    assert [entry["path"] for entry in saved] == ["net/core/somaxconn"]
    run(lab, "CHECK", conf).ok()
    run(lab, "DEL", conf).ok()


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "key",
    [
        "net/../kernel/hostname",
        "net.ipv4.conf.IFNAME/../../..",
        "net.ipv4.conf.IFNAME/../../../kernel/hostname",
        "/proc/sys/kernel/hostname",
        "/proc/sys/net/core/somaxconn",
        "kernel.hostname",
    ],
)
def test_traversal_keys_are_refused_with_nothing_written(lab: Lab, key: str) -> None:
    make_veth(lab)
    before = live(lab.ctr, SOMAXCONN)
    hostname = lab.ctr.run("cat", "/proc/sys/kernel/hostname")
    sysctls = {SOMAXCONN: "321", key: "pwned"}  # a valid key first: it must not be written
    err = failed(run(lab, "ADD", config(lab, mac=MAC, sysctl=sysctls)), 7)
    assert key[:20] in err["msg"]
    assert live(lab.ctr, SOMAXCONN) == before
    assert lab.ctr.run("cat", "/proc/sys/kernel/hostname") == hostname
    assert not backup_file(lab).exists()


def test_allowlist_accepts_listed_keys_and_refuses_others_whole_key(lab: Lab) -> None:
    make_veth(lab)
    allow = lab.workdir / "allowlist.conf"
    allow.write_text(
        "# only these\n^net\\.core\\.somaxconn$\nnet\\.ipv4\\.conf\\.IFNAME\\.accept\n"
    )
    env = {"CNI_TUNING_ALLOWLIST": str(allow)}
    run(lab, "ADD", config(lab, sysctl={SOMAXCONN: "2048"}), env=env).ok()
    assert sysctl(lab.ctr, SOMAXCONN) == "2048"
    run(lab, "DEL", config(lab), env=env).ok()

    before = live(lab.ctr, SOMAXCONN, PER_IF)
    # PER_IF only starts with an allowed pattern: Go's unanchored match lets it through
    err = failed(
        run(lab, "ADD", config(lab, mtu=1400, sysctl={SOMAXCONN: "99", PER_IF: "0"}), env=env), 7
    )
    assert PER_IF in err["msg"] and str(allow) in err["msg"]
    assert live(lab.ctr, SOMAXCONN, PER_IF) == before
    # args.cni (what a pod may pass) is held to the same list
    args: dict[str, Any] = {"args": {"cni": {"sysctl": {NS_WIDE: "1"}}}}
    failed(run(lab, "ADD", config(lab, **args), env=env), 7)
    assert not backup_file(lab).exists()


def test_allowlist_prefix_pattern_written_for_go_allows_its_subtree(lab: Lab) -> None:
    """`^net\\.ipv4\\.conf\\.` is how a Go admin allows a subtree: it works here too."""
    make_veth(lab)
    allow = lab.workdir / "allowlist.conf"
    allow.write_text("^net\\.ipv4\\.conf\\.\n")
    env = {"CNI_TUNING_ALLOWLIST": str(allow)}
    run(lab, "ADD", config(lab, sysctl={PER_IF: "0"}), env=env).ok()
    assert sysctl(lab.ctr, PER_IF) == "0"
    run(lab, "DEL", config(lab), env=env).ok()
    before = live(lab.ctr, SOMAXCONN)
    err = failed(run(lab, "ADD", config(lab, sysctl={SOMAXCONN: "99"}), env=env), 7)
    assert SOMAXCONN in err["msg"]
    assert live(lab.ctr, SOMAXCONN) == before


@pytest.mark.parametrize(
    ("keys", "cni_args", "words"),
    [
        ({"mac": "01:00:5e:00:00:01"}, "", "multicast"),
        ({"mac": "00:00:00:00:00:00"}, "", "all-zero"),
        ({"runtimeConfig": {"mac": "nonsense"}}, "", "not a MAC"),
        ({}, "MAC=02:00:00:00:00", "not a MAC"),
        ({"args": {"cni": {"mac": "ff:ff:ff:ff:ff:ff"}}}, "", "multicast"),
        ({"mtu": 67}, "", "between 68"),
        ({"mtu": 65536}, "", "between 68"),
        ({"txQLen": -1}, "", "negative"),
        ({"sysctl": {SOMAXCONN: "1\nnet.core.x=2"}}, "", "newline"),
        ({"sysctl": {"net.core.nonexistent": "1"}}, "", "does not exist"),
        ({"sysctl": {SOMAXCONN: "lots"}}, "", "refused"),
    ],
)
def test_bad_values_are_error_7_and_change_nothing(
    lab: Lab, keys: dict[str, Any], cni_args: str, words: str
) -> None:
    make_veth(lab)
    before = live(lab.ctr, SOMAXCONN, NS_WIDE)
    conf = config(lab, promisc=True, **{"sysctl": {NS_WIDE: "100"}, **keys})
    err = failed(run(lab, "ADD", conf, cni_args=cni_args), 7)
    assert words in err["msg"] + err.get("details", "")
    assert live(lab.ctr, SOMAXCONN, NS_WIDE) == before
    assert not backup_file(lab).exists()


def test_duplicated_sysctl_keys_are_refused(lab: Lab) -> None:
    make_veth(lab)
    text = json.dumps(config(lab, sysctl={SOMAXCONN: "1"}))
    text = text.replace(f'"{SOMAXCONN}": "1"', f'"{SOMAXCONN}": "1", "{SOMAXCONN}": "2"')
    before = sysctl(lab.ctr, SOMAXCONN)
    err = failed(run(lab, "ADD", text), 7)
    assert "more than once" in err["msg"]
    assert sysctl(lab.ctr, SOMAXCONN) == before


def test_kernel_refusal_midway_puts_back_what_was_changed(lab: Lab) -> None:
    """A macvlan cannot take an MTU above its lower device's: the kernel has already set
    the MAC in the same request when it refuses the MTU, and the plugin must undo it."""
    lab.ctr.ip("link", "add", "lower0", "type", "veth", "peer", "name", "peer0")
    lab.ctr.ip("link", "add", "mv0", "link", "lower0", "type", "macvlan", "mode", "bridge")
    before = link(lab.ctr, "mv0")
    conf = config(lab, mac=MAC, mtu=9000, sysctl={SOMAXCONN: "555"})
    somaxconn = sysctl(lab.ctr, SOMAXCONN)
    err = failed(run(lab, "ADD", conf, ifname="mv0"), 7)
    assert "mtu" in err["msg"] + err.get("details", "")
    assert link(lab.ctr, "mv0") == before
    assert sysctl(lab.ctr, SOMAXCONN) == somaxconn
    assert not backup_file(lab, ifname="mv0").exists()


# ---------------------------------------------------------------------------- CHECK


def test_check_passes_after_add_and_fails_when_the_state_drifts(lab: Lab) -> None:
    make_veth(lab)
    conf = config(lab, **EVERYTHING)
    run(lab, "ADD", conf).ok()
    run(lab, "CHECK", conf).ok()
    lab.ctr.ip("link", "set", "eth0", "mtu", "1450")
    err = failed(run(lab, "CHECK", conf), 102)
    assert "MTU is 1450, configured 1400" in err["details"]
    lab.ctr.ip("link", "set", "eth0", "mtu", "1400")
    lab.ctr.sysctl("net.ipv4.conf.eth0.accept_redirects", "1")
    err = failed(run(lab, "CHECK", conf), 102)
    assert "accept_redirects is '1', configured '0'" in err["details"]


@pytest.mark.parametrize(
    ("keys", "promisc_before"),
    [
        ({"mac": MAC.upper()}, False),  # Go compares MAC strings exactly
        ({"sysctl": {"net.ipv4.ip_local_port_range": "20000 30000"}}, False),  # kernel: a tab
        ({"mtu": 1400}, True),  # promisc not configured: Go demands it off
    ],
)
def test_check_passes_where_gos_check_fails_a_correct_setup(
    lab: Lab, keys: dict[str, Any], promisc_before: bool
) -> None:
    make_veth(lab)
    if promisc_before:
        lab.ctr.ip("link", "set", "eth0", "promisc", "on")
    conf = config(lab, **keys)
    run(lab, "ADD", conf).ok()
    run(lab, "CHECK", conf).ok()
    go_check = run(lab, "CHECK", conf, exe=go("tuning"))
    assert go_check.returncode != 0 and go_check.json["code"] == 999


def test_explicit_promisc_false_is_applied_and_checked(lab: Lab) -> None:
    make_veth(lab)
    lab.ctr.ip("link", "set", "eth0", "promisc", "on")
    conf = config(lab, promisc=False)
    run(lab, "ADD", conf).ok()
    assert link(lab.ctr)["promisc"] is False
    run(lab, "CHECK", conf).ok()
    lab.ctr.ip("link", "set", "eth0", "promisc", "on")
    assert (
        "promiscuous mode is on, configured off" in failed(run(lab, "CHECK", conf), 102)["details"]
    )
    run(lab, "DEL", conf).ok()
    assert link(lab.ctr)["promisc"] is True  # the original, as it was before ADD


# ---------------------------------------------------------------------------- GC, STATUS


def test_gc_forgets_only_this_networks_dead_attachments(lab: Lab) -> None:
    make_veth(lab)
    conf = config(lab, version="1.1.0", mtu=1400)
    for cid in ("alive", "dead"):
        run(lab, "ADD", conf, container_id=cid).ok()
    other = {**conf, "name": "othernet"}
    run(lab, "ADD", other, container_id="othernet-ctr").ok()
    gc_conf = {
        "cniVersion": "1.1.0",
        "name": "tunenet",
        "type": "tuning",
        "cni.dev/valid-attachments": [{"containerID": "alive", "ifname": "eth0"}],
    }
    run_plugin(TUNING, "GC", gc_conf, host=lab.host, env=lab.env).ok()
    assert backup_file(lab, "alive").exists()
    assert not backup_file(lab, "dead").exists()
    assert backup_file(lab, "othernet-ctr").exists()


def test_status_is_ready_and_unavailable_with_a_broken_allowlist(lab: Lab) -> None:
    conf = {"cniVersion": "1.1.0", "name": "tunenet", "type": "tuning"}
    run_plugin(TUNING, "STATUS", conf, host=lab.host, env=lab.env).ok()
    broken = lab.workdir / "allow.conf"
    broken.write_text("net\\.core\\.(\n")
    env = {**lab.env, "CNI_TUNING_ALLOWLIST": str(broken)}
    failed(run_plugin(TUNING, "STATUS", conf, host=lab.host, env=env), 50)


# ---------------------------------------------------------------------------- versions, Go


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_result_in_the_config_version_with_the_new_mac(lab: Lab, version: str) -> None:
    make_veth(lab)
    out = run(lab, "ADD", config(lab, version=version, mac=MAC, mtu=1400)).ok().json
    assert out["cniVersion"] == version
    assert out["interfaces"][1]["mac"] == MAC
    assert out["interfaces"][1].get("mtu") == (1400 if version == "1.1.0" else None)
    assert out["ips"][0]["address"] == "10.99.0.2/24"


def test_legacy_versions_and_a_missing_prev_result(lab: Lab) -> None:
    make_veth(lab)
    legacy = {
        "cniVersion": "0.2.0",
        "name": "tunenet",
        "type": "tuning",
        "mtu": 1400,
        "prevResult": {"cniVersion": "0.2.0", "ip4": {"ip": "10.99.0.2/24"}},
    }
    out = run(lab, "ADD", legacy).ok().json
    assert out["ip4"]["ip"] == "10.99.0.2/24" and link(lab.ctr)["mtu"] == 1400
    run(lab, "DEL", legacy).ok()
    bare = {"cniVersion": "1.0.0", "name": "tunenet", "type": "tuning", "sysctl": {NS_WIDE: "90"}}
    assert run(lab, "ADD", bare).ok().json["cniVersion"] == "1.0.0"
    assert sysctl(lab.ctr, NS_WIDE) == "90"


def test_same_kernel_state_and_result_as_go(lab: Lab) -> None:
    ours_ns, go_ns = lab.ctr, lab.new_netns("goctr")
    make_veth(lab, ours_ns)
    make_veth(lab, go_ns)
    keys: dict[str, Any] = {"mac": MAC, "mtu": 1400, "promisc": True, "allmulti": True,
            "sysctl": {PER_IF: "0", SOMAXCONN: "1500"}}  # fmt: skip
    ours = run(lab, "ADD", config(lab, ours_ns, **keys), ours_ns).ok().json
    gos = run(lab, "ADD", config(lab, go_ns, **keys, dataDir=str(lab.workdir / "go")), go_ns,
              exe=go("tuning")).ok().json  # fmt: skip
    for result in (ours, gos):
        result["interfaces"][1].pop("sandbox")
    assert ours == gos
    assert live(ours_ns, PER_IF, SOMAXCONN) == live(go_ns, PER_IF, SOMAXCONN)


def test_del_restores_what_gos_tuning_saved(lab: Lab) -> None:
    """Same file name and keys: a container set up by Go's tuning is cleaned up by ours."""
    make_veth(lab)
    before = link(lab.ctr)
    data_dir = str(lab.workdir / "shared")
    conf = config(lab, mac=MAC, mtu=1400, promisc=True, dataDir=data_dir)
    run(lab, "ADD", conf, exe=go("tuning")).ok()
    assert Path(data_dir, "ctr1_eth0.json").exists()
    run(lab, "DEL", conf).ok()
    assert link(lab.ctr) == before
    assert not Path(data_dir, "ctr1_eth0.json").exists()


def test_gos_del_restores_what_ours_saved(lab: Lab) -> None:
    """The other direction: our file keeps Go's keys, so rolling back to Go is safe too."""
    make_veth(lab)
    before = link(lab.ctr)
    data_dir = str(lab.workdir / "shared")
    conf = config(lab, mac=MAC, mtu=1400, promisc=True, dataDir=data_dir)
    run(lab, "ADD", conf).ok()
    assert link(lab.ctr)["mtu"] == 1400
    run(lab, "DEL", conf, exe=go("tuning")).ok()
    assert link(lab.ctr) == before
    assert not Path(data_dir, "ctr1_eth0.json").exists()


def test_a_data_dir_others_could_swap_on_the_way_is_refused(lab: Lab) -> None:
    """Each component of the dataDir is checked, not only the last. Under a directory
    uid 65534 owns, that user can make a symlink: root's backup would land wherever it
    points (here another program's private directory). A directory on the way that others
    can write without the sticky bit is refused too; a sticky one (/tmp-like) is fine
    for a directory of ours inside it."""
    make_veth(lab)
    before = link(lab.ctr)
    users = lab.workdir / "users"
    users.mkdir()
    os.chown(users, 65534, 65534)
    private = lab.workdir / "other-program"
    (private / "tuning").mkdir(parents=True, mode=0o700)
    (users / "via").symlink_to(private)
    os.lchown(users / "via", 65534, 65534)
    out = run(lab, "ADD", config(lab, mtu=1400, dataDir=str(users / "via" / "tuning")))
    assert out.returncode != 0 and out.json["code"] == 7, out.stdout
    assert f"{users} belongs to uid 65534" in out.json["msg"]
    assert list((private / "tuning").iterdir()) == [] and link(lab.ctr) == before

    shared = lab.workdir / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    out = run(lab, "ADD", config(lab, mtu=1400, dataDir=str(shared / "tuning")))
    assert out.json["code"] == 7 and "without the sticky bit" in out.json["msg"], out.stdout
    assert not (shared / "tuning").exists() and link(lab.ctr) == before

    shared.chmod(0o1777)
    conf = config(lab, mtu=1400, dataDir=str(shared / "tuning"))
    run(lab, "ADD", conf).ok()
    assert (shared / "tuning" / "ctr1_eth0.json").exists()
    run(lab, "DEL", conf).ok()
    assert link(lab.ctr) == before


def test_a_lone_surrogate_sysctl_value_is_error_7_before_the_link_changes(lab: Lab) -> None:
    """JSON "\\ud800" decodes to a string no write(2) can carry: refused at parse (it was
    error 999 with the MTU already changed)."""
    make_veth(lab)
    before = link(lab.ctr)
    out = run(lab, "ADD", config(lab, mtu=1400, sysctl={SOMAXCONN: "\ud800"}))
    assert out.returncode != 0 and out.json["code"] == 7, out.stdout
    assert "lone UTF-16 surrogate" in out.json["msg"]
    assert link(lab.ctr) == before
    assert not (lab.state_root / "tuning" / "ctr1_eth0.json").exists()


def test_sysctl_only_config_does_not_import_pyroute2(lab: Lab) -> None:
    make_veth(lab)
    env = {"PYTHONPROFILEIMPORTTIME": "1"}
    sysctl_only = run(lab, "ADD", config(lab, sysctl={SOMAXCONN: "600"}), env=env).ok()
    assert "common.skel" in sysctl_only.stderr  # the import trace is there
    assert "pyroute2" not in sysctl_only.stderr
    with_link = run(lab, "ADD", config(lab, mtu=1400), env=env).ok()
    assert "pyroute2" in with_link.stderr


# ---------------------------------------------------------------------------- a real chain


def test_chained_after_bridge_with_mac_capability_and_traffic(lab: Lab) -> None:
    conflist = load_conflist("tuning.conflist", lab.workdir)
    result = lab.chain.add(conflist, lab.ctr, mac=MAC)
    ctr_iface = next(i for i in result["interfaces"] if i.get("sandbox"))
    assert ctr_iface["mac"] == MAC
    assert link(lab.ctr)["mac"] == MAC and link(lab.ctr)["mtu"] == 1400
    assert sysctl(lab.ctr, PER_IF) == "0"
    lab.chain.check(conflist, lab.ctr)
    address = container_address(result)
    with echo_server(lab.ctr, 8080, tag="tuned"):
        # the host's ARP entry for the container must carry the new MAC for this to answer
        assert reaches(lab.host, address, 8080) == b"tuned:ping"
    neighbours = lab.host.ip("neigh", "show", address)
    assert MAC in neighbours
    lab.chain.delete(conflist, lab.ctr)
    assert not any(lab.state_root.joinpath("tuning").glob("*.json"))
    assert os.path.exists(lab.ctr.path)

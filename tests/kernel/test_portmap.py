"""portmap against a real kernel, with real TCP and UDP traffic.

Containers are attached through cnichain with the Go bridge + host-local and our portmap,
exactly as a runtime runs a conflist. Every path a host port must serve is exercised:
another host (a routed netns), the host itself (its own address), 127.0.0.1 (snat),
a neighbour on the same bridge, and the container itself (hairpin).
"""

from __future__ import annotations

import json
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.harness.crash import at_crash_point, crash_points
from tests.harness.lab import Lab
from tests.harness.plugins import invocation, our, run_plugin
from tests.harness.portmap_world import (
    EXT4,
    EXT6,
    HOST4,
    HOST4B,
    HOST6,
    TABLE,
    comments,
    conntrack_udp,
    make_world,
    nft_elements,
    udp_flow,
)
from tests.harness.traffic import echo_server, reaches

pytestmark = pytest.mark.root

PORTMAP = our("portmap")
# `backend` (tests/conftest.py): nftables, or the iptables backend forced to iptables-nft
# or iptables-legacy


def rules_text(lab: Lab, backend: str) -> str:
    if backend == "nftables":
        return lab.host.run("nft", "list", "ruleset", check=False)
    variant = lab.env["CNI_META_IPTABLES"]
    text = lab.host.run(f"iptables-{variant}-save", "-t", "nat", check=False) + lab.host.run(
        f"ip6tables-{variant}-save", "-t", "nat", check=False
    )
    lines = (re.sub(r"\[\d+:\d+\]", "", line) for line in text.splitlines())
    return "\n".join(line for line in lines if not line.startswith("#"))


# ---------------------------------------------------------------------------- every path


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_every_path_reaches_the_container_ipv4(lab: Lab, backend: str, proto: str) -> None:
    w = make_world(lab, backend=backend)
    ctr, sib = lab.ctr, lab.new_netns("sib")
    w.attach(ctr, f"8080:80/{proto}")
    w.attach(sib)
    with echo_server(ctr, 80, proto, "ctr") as peers:
        # another host: the client's address is preserved (no masquerade needed)
        assert reaches(w.ext, HOST4, 8080, proto) == b"ctr:ping"
        assert peers[-1].endswith(EXT4)
        # the host itself, through its own address
        assert reaches(lab.host, HOST4, 8080, proto) == b"ctr:ping"
        # localhost (snat: route_localnet + masquerade)
        assert reaches(lab.host, "127.0.0.1", 8080, proto) == b"ctr:ping"
        # a neighbour on the same bridge, and the container itself (hairpin)
        assert reaches(sib, HOST4, 8080, proto) == b"ctr:ping"
        assert reaches(ctr, HOST4, 8080, proto) == b"ctr:ping"
        assert reaches(ctr, w.gateway(), 8080, proto) == b"ctr:ping"
    w.detach(ctr)
    with echo_server(ctr, 80, proto, "ctr"):
        assert reaches(w.ext, HOST4, 8080, proto, timeout=0.5) is None


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_every_path_reaches_the_container_ipv6(lab: Lab, backend: str, proto: str) -> None:
    w = make_world(lab, "portmap-dualstack.conflist", backend=backend)
    ctr, sib = lab.ctr, lab.new_netns("sib")
    w.attach(ctr, f"8080:80/{proto}")
    w.attach(sib)
    with echo_server(ctr, 80, proto, "ctr") as peers:
        assert reaches(w.ext, HOST6, 8080, proto) == b"ctr:ping"
        assert peers[-1] == EXT6
        assert reaches(w.ext, HOST4, 8080, proto) == b"ctr:ping"  # dual-stack: both
        assert reaches(lab.host, HOST6, 8080, proto) == b"ctr:ping"
        assert reaches(sib, HOST6, 8080, proto) == b"ctr:ping"
        assert reaches(ctr, HOST6, 8080, proto) == b"ctr:ping"


def test_port_range_maps_each_port_to_its_partner(lab: Lab, backend: str) -> None:
    w = make_world(lab, backend=backend)
    w.attach(lab.ctr, "9000-9002:7000/tcp")
    for i in range(3):
        with echo_server(lab.ctr, 7000 + i, "tcp", f"p{i}"):
            assert reaches(w.ext, HOST4, 9000 + i) == f"p{i}:ping".encode()


def test_hostip_mapping_wins_over_wildcard_for_its_address(lab: Lab, backend: str) -> None:
    """Precedence: a specific hostIP serves its own address; the wildcard every other one."""
    w = make_world(lab, backend=backend)
    specific, wild = lab.ctr, lab.new_netns("wild")
    w.attach(wild, "8080:80/tcp")
    w.attach(specific, f"{HOST4}:8080:80/tcp")
    with echo_server(specific, 80, "tcp", "specific"), echo_server(wild, 80, "tcp", "wild"):
        assert reaches(w.ext, HOST4, 8080) == b"specific:ping"
        assert reaches(w.ext, HOST4B, 8080) == b"wild:ping"
        w.detach(specific)
        assert reaches(w.ext, HOST4, 8080) == b"wild:ping"


def test_snat_off_keeps_outside_traffic_but_not_hairpin_or_localhost(
    lab: Lab, backend: str
) -> None:
    w = make_world(lab, backend=backend, snat=False)
    w.attach(lab.ctr, "8080:80/tcp")
    with echo_server(lab.ctr, 80, "tcp", "ctr"):
        assert reaches(w.ext, HOST4, 8080) == b"ctr:ping"
        assert reaches(lab.host, "127.0.0.1", 8080, timeout=0.5) is None
        assert reaches(lab.ctr, HOST4, 8080, timeout=0.5) is None


def test_masq_all_masquerades_outside_clients_too(lab: Lab, backend: str) -> None:
    w = make_world(lab, backend=backend, masqAll=True)
    w.attach(lab.ctr, "8080:80/tcp")
    with echo_server(lab.ctr, 80, "tcp", "ctr") as peers:
        assert reaches(w.ext, HOST4, 8080) == b"ctr:ping"
        assert peers[-1].endswith(w.gateway())


@pytest.mark.parametrize(
    "conditions",
    [["ip saddr 192.168.77.0/24"], ["-s", "192.168.77.0/24"]],
    ids=["nft-syntax", "iptables-syntax"],
)
def test_conditions_admit_and_exclude_per_attachment(
    lab: Lab, backend: str, conditions: list[str]
) -> None:
    if backend == "iptables" and not conditions[0].startswith("-"):
        pytest.skip("nft syntax conditions are for the nftables backend")
    w = make_world(lab, backend=backend, conditionsV4=conditions)
    w.attach(lab.ctr, "8080:80/tcp")
    other = lab.new_netns("other")
    excluded = make_world_conflist_without(lab, w, backend)
    with echo_server(lab.ctr, 80, "tcp", "ctr"), echo_server(other, 80, "tcp", "other"):
        assert reaches(w.ext, HOST4, 8080) == b"ctr:ping"  # 192.168.77.2 is admitted
        # a second network whose conditions exclude the client: its mapping is not used
        excluded.attach(other, "8081:80/tcp")
        assert reaches(w.ext, HOST4, 8081, timeout=0.5) is None


def make_world_conflist_without(lab: Lab, w: Any, backend: str) -> Any:
    from tests.harness.portmap_world import World, conflist

    cond = ["ip saddr 10.0.0.0/8"] if backend == "nftables" else ["-s", "10.0.0.0/8"]
    return World(lab, w.ext, conflist(lab, "portmap-ipv4.conflist", backend=backend,
                                      conditionsV4=cond))  # fmt: skip


# ---------------------------------------------------------------------------- conflicts


def test_conflict_names_the_owner_and_installs_nothing(lab: Lab, backend: str) -> None:
    w = make_world(lab, backend=backend)
    first, second = lab.ctr, lab.new_netns("second")
    w.attach(first, "8080:80/tcp")
    before = rules_text(lab, backend)
    failed = w.attach(second, "8081:81/tcp", "8080:80/tcp", check=False)
    assert "8080/tcp is already mapped by attachment" in failed["error"]
    assert "cmp-portmap4/cnichain-" in failed["error"]  # the owner: network/container/ifname
    assert rules_text(lab, backend) == before  # not even the free port 8081
    with echo_server(first, 80, "tcp", "first"):
        assert reaches(w.ext, HOST4, 8080) == b"first:ping"


def test_same_port_on_another_protocol_or_address_is_no_conflict(lab: Lab, backend: str) -> None:
    w = make_world(lab, backend=backend)
    a, b, c = lab.ctr, lab.new_netns("b"), lab.new_netns("c")
    w.attach(a, "8080:80/tcp")
    w.attach(b, "8080:80/udp")
    w.attach(c, f"{HOST4B}:8080:80/tcp")
    with (
        echo_server(a, 80, "tcp", "a"),
        echo_server(b, 80, "udp", "b"),
        echo_server(c, 80, "tcp", "c"),
    ):
        assert reaches(w.ext, HOST4, 8080, "tcp") == b"a:ping"
        assert reaches(w.ext, HOST4, 8080, "udp") == b"b:ping"
        assert reaches(w.ext, HOST4B, 8080, "tcp") == b"c:ping"


@pytest.mark.parametrize(
    ("second", "conflicts"),
    [
        ("9003-9005:7000/udp", True),  # overlaps the wildcard range's end
        ("8990-9000:7000/udp", True),  # overlaps its start
        ("9005-9006:7000/udp", False),  # just after it
        ("9000-9004:7000/tcp", False),  # same ports, other protocol
        ("[fd77::1]:8443:443/tcp", True),  # the same IPv6 host address and port
        ("[fd77::1]:8444:443/tcp", False),
        ("[fd77::3]:8443:443/tcp", False),  # another IPv6 host address
    ],
)
def test_conflicts_compare_protocol_address_and_range_in_both_families(
    lab: Lab, backend: str, second: str, conflicts: bool
) -> None:
    """Every field of an existing mapping that a conflict depends on is read back from the
    kernel: protocol, host address (IPv6 here), first and last port of a range."""
    w = make_world(lab, "portmap-dualstack.conflist", backend=backend)
    lab.host.ip("-6", "addr", "add", "fd77::3/64", "dev", "lo")
    w.attach(lab.ctr, "9000-9004:7000/udp", "[fd77::1]:8443:443/tcp")
    other = lab.new_netns("other")
    before = rules_text(lab, backend)
    run = w.attach(other, second, check=False)
    if conflicts:
        assert "is already mapped by attachment" in run["error"], run
        assert rules_text(lab, backend) == before
    else:
        assert "error" not in run, run
        w.detach(other)
    w.detach(lab.ctr)
    assert "9000" not in rules_text(lab, backend) and "8443" not in rules_text(lab, backend)


# ---------------------------------------------------------------------------- DEL


def test_del_removes_only_its_own_mappings_and_is_idempotent(lab: Lab, backend: str) -> None:
    w = make_world(lab, backend=backend)
    a, b = lab.ctr, lab.new_netns("b")
    w.attach(a, "8080:80/tcp")
    w.attach(b, "8081:80/tcp")
    w.detach(a)
    w.detach(a)  # the second DEL finds nothing and succeeds
    with echo_server(a, 80, "tcp", "a"), echo_server(b, 80, "tcp", "b"):
        assert reaches(w.ext, HOST4, 8080, timeout=0.5) is None
        assert reaches(w.ext, HOST4, 8081) == b"b:ping"
    w.detach(b)
    assert "8081" not in rules_text(lab, backend)
    if backend == "nftables":
        assert TABLE not in lab.host.run("nft", "list", "tables")  # the last one leaves no table


def _direct_conf(lab: Lab, backend: str, **extra: Any) -> dict[str, Any]:
    prev = {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": lab.ctr.path}],
        "ips": [{"address": "10.66.0.2/24", "interface": 0}],
    }
    conf = {"cniVersion": "1.0.0", "name": "direct", "type": "portmap", "backend": backend}
    return {**conf, "prevResult": prev, **extra}


def _run(lab: Lab, command: str, conf: Any, **kw: Any) -> Any:
    kw.setdefault("netns", lab.ctr.path)
    return run_plugin(PORTMAP, command, conf, host=lab.host, env=lab.env, **kw)


def test_del_without_prevresult_or_runtimeconfig_or_netns_still_cleans_up(
    lab: Lab, backend: str
) -> None:
    rc = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
    for variant in ("no-prevresult", "no-runtimeconfig", "no-netns"):
        _run(lab, "ADD", _direct_conf(lab, backend, runtimeConfig=rc)).ok()
        assert "8080" in rules_text(lab, backend)
        conf = _direct_conf(lab, backend, runtimeConfig=rc)
        kw: dict[str, Any] = {}
        if variant == "no-prevresult":
            del conf["prevResult"]
        elif variant == "no-runtimeconfig":
            del conf["runtimeConfig"]
        else:
            kw["netns"] = "/run/netns/does-not-exist"
        _run(lab, "DEL", conf, **kw).ok()
        assert "8080" not in rules_text(lab, backend), variant
    # and DEL of something never added
    _run(lab, "DEL", _direct_conf(lab, backend), container_id="never").ok()


# ---------------------------------------------------------------------------- CHECK


def test_check_verifies_content_and_names_what_differs(lab: Lab, backend: str) -> None:
    rc = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
    conf = _direct_conf(lab, backend, runtimeConfig=rc)
    _run(lab, "ADD", conf).ok()
    _run(lab, "CHECK", conf).ok()
    # the config now says another container port: CHECK names the difference
    moved = _direct_conf(lab, backend, runtimeConfig={
        "portMappings": [{"hostPort": 8080, "containerPort": 81, "protocol": "tcp"}]})  # fmt: skip
    out = _run(lab, "CHECK", moved)
    assert out.returncode != 0 and out.json["code"] == 102
    assert "81" in out.json["details"]
    # something removed behind our back: CHECK names it
    if backend == "nftables":
        lab.host.run("nft", "delete", "element", *TABLE.split(), "any4", "{ tcp . 8080 }")
        out = _run(lab, "CHECK", conf)
        assert out.json["code"] == 102 and "any4 has no element tcp . 8080" in out.json["details"]
    _run(lab, "DEL", conf).ok()


def test_check_compares_the_conditions_of_the_installed_forwarding(lab: Lab, backend: str) -> None:
    """Installed with two source prefixes (iptables expands the list into two jumps, nft
    into one lane); CHECK passes for that config and fails for other or no conditions."""
    rc = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                           {"hostPort": 8443, "containerPort": 443}]}  # fmt: skip
    if backend == "iptables":
        mine, other = ["-s", "192.168.77.0/24,10.1.0.0/16"], ["-s", "10.0.0.0/8"]
    else:
        mine, other = ["ip saddr { 192.168.77.0/24, 10.1.0.0/16 }"], ["ip saddr 10.0.0.0/8"]
    conf = _direct_conf(lab, backend, runtimeConfig=rc, conditionsV4=mine)
    _run(lab, "ADD", conf).ok()
    _run(lab, "CHECK", conf).ok()
    for conditions in (other, []):
        out = _run(lab, "CHECK", {**conf, "conditionsV4": conditions})
        assert out.returncode != 0 and out.json["code"] == 102, conditions
    _run(lab, "DEL", conf).ok()
    assert "8080" not in rules_text(lab, backend)


def test_check_names_a_masq_chain_flushed_by_hand(lab: Lab) -> None:
    """A repeated ADD does not rewrite the subnet's masq chain (its fast path sends
    elements only): CHECK is what tells that someone flushed it. DEL and ADD repair it."""
    rc = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
    conf = _direct_conf(lab, "nftables", runtimeConfig=rc)
    _run(lab, "ADD", conf).ok()
    _run(lab, "CHECK", conf).ok()
    lab.host.run("nft", "flush", "chain", *TABLE.split(), "masq4-p24")
    _run(lab, "ADD", conf).ok()
    out = _run(lab, "CHECK", conf)
    assert out.returncode != 0 and out.json["code"] == 102, out.stdout
    assert out.json["details"].startswith("chain masq4-p24 holds [], expected [ip saddr"), out.json
    _run(lab, "DEL", conf).ok()
    _run(lab, "ADD", conf).ok()
    _run(lab, "CHECK", conf).ok()
    assert "ip saddr & 255.255.255.0 . ip daddr @hairpin4 masquerade" in rules_text(lab, "nftables")
    _run(lab, "DEL", conf).ok()


# ---------------------------------------------------------------------------- GC / STATUS


def test_gc_removes_every_mapping_of_attachments_no_longer_valid(lab: Lab, backend: str) -> None:
    """GC reads the whole table back (the text listing of every set and map, maps whose
    data is a concatenation among them)."""
    base = _direct_conf(lab, backend)
    for i, cid in enumerate(["keep", "gone1", "gone2"]):
        rc = {"portMappings": [{"hostPort": 8080 + i, "containerPort": 80, "protocol": "udp"}]}
        _run(lab, "ADD", {**base, "runtimeConfig": rc}, container_id=cid).ok()
    valid = [{"containerID": "keep", "ifname": "eth0"}]
    gc_conf = {"cniVersion": "1.1.0", "name": "direct", "type": "portmap", "backend": backend,
               "cni.dev/valid-attachments": valid}  # fmt: skip
    _run(lab, "GC", gc_conf).ok()
    text = rules_text(lab, backend)
    assert "8080" in text and "8081" not in text and "8082" not in text
    state_files = sorted(p.name for p in (lab.state_root / "portmap").glob("*.json"))
    assert len(state_files) == 1
    # an attachment of another network is never GC'd by this one
    other = {**gc_conf, "name": "othernet", "cni.dev/valid-attachments": []}
    _run(lab, "GC", other).ok()
    assert "8080" in rules_text(lab, backend)


def test_iptables_status_reads_no_table(lab: Lab) -> None:
    """A runtime polls STATUS every few seconds: the iptables backend checks that the
    tools of the host's variant are there, and neither loads libnftables nor saves a
    table (one iptables-save grows with the attachments)."""
    from common.log import Log
    from common.store import AttachmentStore
    from portmap import xtables
    from portmap.kernel import NftKernel, XtablesKernel
    from portmap.state import Recorded

    status = {"cniVersion": "1.1.0", "name": "direct", "type": "portmap", "backend": "iptables"}
    trace = {**lab.env, "PYTHONPROFILEIMPORTTIME": "1"}
    run = run_plugin(PORTMAP, "STATUS", status, host=lab.host, env=trace).ok()
    assert "portmap.xtables" in run.stderr and "common.libnftables" not in run.stderr
    ran: list[list[str]] = []

    class Recording(XtablesKernel):
        def run(self, argv: list[str], data: bytes = b"") -> tuple[int, str]:
            ran.append(argv)
            return 0, ""

    store = AttachmentStore(str(lab.state_root / "portmap"), Recorded)
    backend = xtables.XtablesBackend(store, Log(""), Recording(NftKernel()))
    backend.status()
    assert not [argv for argv in ran if argv[0].endswith("-save")]


def test_status_and_pass_through(lab: Lab, backend: str) -> None:
    status = {"cniVersion": "1.1.0", "name": "direct", "type": "portmap", "backend": backend}
    _run(lab, "STATUS", status).ok()
    # no mappings: prevResult printed back in the config's version (0.4.0: ips[].version)
    conf = _direct_conf(lab, backend)
    conf["cniVersion"] = "0.4.0"
    out = _run(lab, "ADD", conf).ok().json
    assert out["cniVersion"] == "0.4.0" and out["ips"][0]["version"] == "4"


# ---------------------------------------------------------------------------- conntrack


def test_udp_conntrack_of_the_host_port_is_flushed_on_add_and_del(lab: Lab, backend: str) -> None:
    w = make_world(lab, backend=backend)
    w.attach(lab.new_netns("first"), "7777:77/tcp")  # NAT rules exist: conntrack is on
    udp_flow(w.ext, HOST4, 5353)  # a flow to the host before the mapping exists
    udp_flow(w.ext, HOST4, 5354)  # another port: must survive
    assert "dport=5353" in conntrack_udp(lab.host, 5353)
    w.attach(lab.ctr, "5353:53/udp")
    assert "dport=5353" not in conntrack_udp(lab.host, 5353)
    assert "dport=5354" in conntrack_udp(lab.host, 5354)
    with echo_server(lab.ctr, 53, "udp", "ctr"):
        assert reaches(w.ext, HOST4, 5353, "udp") == b"ctr:ping"
    assert "dport=5353" in conntrack_udp(lab.host, 5353)
    w.detach(lab.ctr)
    assert "dport=5353" not in conntrack_udp(lab.host, 5353)
    assert "dport=5354" in conntrack_udp(lab.host, 5354)


# ---------------------------------------------------------------------------- concurrency


def test_fifty_parallel_adds_all_land_and_del_cleans_all(lab: Lab, backend: str) -> None:
    base = _direct_conf(lab, backend)

    def add(i: int) -> Any:
        rc = {"portMappings": [{"hostPort": 20000 + i, "containerPort": 80, "protocol": "tcp"}]}
        return _run(lab, "ADD", {**base, "runtimeConfig": rc}, container_id=f"par{i}")

    with ThreadPoolExecutor(max_workers=50) as pool:
        runs = list(pool.map(add, range(50)))
    assert all(r.returncode == 0 for r in runs), [r.stdout for r in runs if r.returncode]
    text = rules_text(lab, backend)
    assert all(str(20000 + i) in text for i in range(50))

    def delete(i: int) -> Any:
        return _run(lab, "DEL", base, container_id=f"par{i}")

    with ThreadPoolExecutor(max_workers=50) as pool:
        runs = list(pool.map(delete, range(50)))
    assert all(r.returncode == 0 for r in runs), [r.stdout for r in runs if r.returncode]
    text = rules_text(lab, backend)
    assert not any(str(20000 + i) in text for i in range(50))


def test_sigkill_at_every_step_of_add_then_retry_and_clean_del(lab: Lab, backend: str) -> None:
    """A plugin killed at any step of ADD (right before and right after each kernel change,
    tool run and state write: the crash points) leaves nothing half-done: a retry succeeds
    and DEL removes everything. The crash points land mid-way by themselves: the range
    need not make ADD slow (as killing after a delay needed)."""
    rc = {"portMappings": [{"hostPort": 30000, "containerPort": 30000, "protocol": "udp",
                            "range": 30}]}  # fmt: skip
    conf = _direct_conf(lab, backend, runtimeConfig=rc)
    add = invocation(PORTMAP, "ADD", conf, host=lab.host, container_id="killed",
                     netns=lab.ctr.path, env={**lab.env, "CNI_PATH": "/usr/lib/cni"})  # fmt: skip
    points = crash_points(add, "portmap", lab.workdir / "crashpoint-count.json")
    _run(lab, "DEL", conf, container_id="killed").ok()  # counting made a clean ADD
    kernel_steps = [p for p in points if p.startswith(("common.libnftables", "portmap.kernel"))]
    assert kernel_steps, points  # the steps between kernel changes are among them
    for spec in points:
        killed = at_crash_point(add, "portmap", spec)
        assert killed.returncode == -signal.SIGKILL, f"not killed at {spec}: {killed.stdout}"
        _run(lab, "ADD", conf, container_id="killed").ok()
        _run(lab, "CHECK", conf, container_id="killed").ok()
        _run(lab, "DEL", conf, container_id="killed").ok()
        assert "30000" not in rules_text(lab, backend), spec
        if backend == "nftables":
            assert not [c for c in comments(lab.host) if "killed" in c], spec
    assert not list((lab.state_root / "portmap").glob("*.json"))


# ---------------------------------------------------------------------------- iptables variant


def _nat(lab: Lab, variant: str) -> str:
    return lab.host.run(f"iptables-{variant}-save", "-t", "nat", check=False)


@pytest.mark.parametrize("populated", ["nft", "legacy", "neither"])
def test_iptables_goes_to_the_variant_that_already_has_rules(lab: Lab, populated: str) -> None:
    """Like kube-proxy's iptables-wrapper: the variant whose nat table has more rules, else
    the host's own `iptables`; DEL finds the rules where ADD put them."""
    if populated != "neither":  # what kube-proxy (or the Go portmap) left in that variant
        lab.host.run(f"iptables-{populated}", "-t", "nat", "-N", "KUBE-SERVICES")
        lab.host.run(f"iptables-{populated}", "-t", "nat", "-A", "PREROUTING", "-j",
                     "KUBE-SERVICES")  # fmt: skip
        expected = populated
    else:
        expected = "nft" if "nf_tables" in lab.host.run("iptables", "-V") else "legacy"
    other = "legacy" if expected == "nft" else "nft"
    w = make_world(lab, backend="iptables")
    w.attach(lab.ctr, "8080:80/tcp")
    assert "CNI-HOSTPORT-DNAT" in _nat(lab, expected)
    with echo_server(lab.ctr, 80, "tcp", "ctr"):
        assert reaches(w.ext, HOST4, 8080, "tcp") == b"ctr:ping"
    if other == "nft" or "nat" in lab.host.run("cat", "/proc/net/ip_tables_names"):
        assert "CNI-HOSTPORT-DNAT" not in _nat(lab, other)  # (legacy-save would make a table)
    w.detach(lab.ctr)
    assert "CNI-DN-" not in _nat(lab, expected)
    assert "KUBE-SERVICES" in _nat(lab, expected) or populated == "neither"


def test_external_set_mark_chain_without_backend_means_iptables_and_uses_the_chain(
    lab: Lab,
) -> None:
    """A config written for Go with kube-proxy's mark chain: no backend key, so iptables
    (as Go), on the host's `iptables`, marking through KUBE-MARK-MASQ, whose masquerade
    is kube-proxy's (our CNI-HOSTPORT-SETMARK/MASQ are not made)."""
    ipt = ("iptables", "-t", "nat")
    lab.host.run(*ipt, "-N", "KUBE-MARK-MASQ")
    lab.host.run(*ipt, "-A", "KUBE-MARK-MASQ", "-j", "MARK", "--or-mark", "0x4000")
    lab.host.run(*ipt, "-N", "KUBE-POSTROUTING")
    lab.host.run(*ipt, "-A", "KUBE-POSTROUTING", "-m", "mark", "--mark", "0x4000/0x4000",
                 "-j", "MASQUERADE")  # fmt: skip
    lab.host.run(*ipt, "-A", "POSTROUTING", "-j", "KUBE-POSTROUTING")
    w = make_world(lab, externalSetMarkChain="KUBE-MARK-MASQ")
    ctr = lab.ctr
    w.attach(ctr, "8080:80/tcp")
    rules = lab.host.run("iptables-save", "-t", "nat")
    assert "-j KUBE-MARK-MASQ" in rules and "CNI-HOSTPORT-DNAT" in rules
    assert "CNI-HOSTPORT-SETMARK" not in rules and "CNI-HOSTPORT-MASQ" not in rules
    assert lab.host.run("nft", "list", "tables", check=False).count("cni_meta_portmap") == 0
    with echo_server(ctr, 80, "tcp", "ctr"):
        # localhost and hairpin only work when kube-proxy's chain marks them
        assert reaches(lab.host, "127.0.0.1", 8080, "tcp") == b"ctr:ping"
        assert reaches(ctr, HOST4, 8080, "tcp") == b"ctr:ping"
    counters = lab.host.run(*ipt, "-L", "KUBE-MARK-MASQ", "-n", "-v", "-x")
    assert int(counters.splitlines()[2].split()[0]) >= 2  # packets through the mark chain
    w.detach(ctr)
    assert "CNI-DN-" not in lab.host.run("iptables-save", "-t", "nat")


def test_nft_elements_name_their_owner(lab: Lab, backend: str) -> None:
    if backend != "nftables":
        pytest.skip("nft only")
    w = make_world(lab, backend=backend)
    w.attach(lab.ctr, "8080:80/tcp")
    sets = nft_elements(lab.host)
    assert len(sets["claims4"]) == 1 and len(sets["any4"]) == 1
    owner = comments(lab.host)[0]
    assert owner.split(" ")[1].startswith("cmp-portmap4/cnichain-") and owner.endswith("/eth0")


def test_stale_del_after_a_firewall_reload_leaves_the_new_owner_forwarding(lab: Lab) -> None:
    """ADD A on 8080; `nft flush ruleset` (a firewall reload); ADD B on 8080. A's state
    still names 8080, but it is B's now: DEL of A must leave B's forwarding in place."""
    w = make_world(lab, backend="nftables", snat=False)
    a, b = lab.ctr, lab.new_netns("b")
    w.attach(a, "8080:80/tcp")
    lab.host.run("nft", "flush", "ruleset")
    w.attach(b, "8080:80/tcp")
    w.detach(a)
    with echo_server(b, 80, "tcp", "b"):
        assert reaches(w.ext, HOST4, 8080) == b"b:ping"
    lab.chain.check(w.conflist, b, "8080:80/tcp")
    w.detach(b)
    assert TABLE not in lab.host.run("nft", "list", "tables")


def test_repeated_add_after_a_firewall_reload_is_a_conflict_with_the_new_owner(lab: Lab) -> None:
    """The same reload, then A's ADD again (its state still names 8080): B holds the port
    now, so A's ADD is error 101 naming B and changes nothing."""
    rc = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}
    conf_a = _direct_conf(lab, "nftables", snat=False, runtimeConfig=rc)
    conf_b = json.loads(json.dumps(conf_a))
    conf_b["prevResult"]["ips"][0]["address"] = "10.66.0.3/24"
    _run(lab, "ADD", conf_a, container_id="a").ok()
    lab.host.run("nft", "flush", "ruleset")
    _run(lab, "ADD", conf_b, container_id="b").ok()
    before = rules_text(lab, "nftables")
    again = _run(lab, "ADD", conf_a, container_id="a")
    assert again.returncode != 0 and again.json["code"] == 101, again.stdout
    assert "8080/tcp is already mapped by attachment direct/b/eth0" in again.json["msg"]
    assert rules_text(lab, "nftables") == before
    _run(lab, "CHECK", conf_b, container_id="b").ok()
    _run(lab, "DEL", conf_a, container_id="a").ok()
    _run(lab, "CHECK", conf_b, container_id="b").ok()
    assert "10.66.0.3 . 80" in rules_text(lab, "nftables")
    _run(lab, "DEL", conf_b, container_id="b").ok()
    assert TABLE not in lab.host.run("nft", "list", "tables")

"""flatnet's config: the Go bridge's option names and defaults, and every refusal (error 7
naming what to fix) before anything is touched. Pure: no root, no kernel."""

from __future__ import annotations

from typing import Any

import pytest

from common.config import parse_netconf
from common.env import Invocation
from common.errors import CniError
from common.result import IPConfig, Result, Route
from flatnet import config, masq, plan


def parse(cni_args: dict[str, str] | None = None, **keys: Any) -> config.Config:
    raw = {"cniVersion": "1.0.0", "name": "flatnet", "type": "flatnet", **keys}
    env = Invocation("ADD", "c1", "/run/netns/x", "eth0", (), cni_args or {})
    return config.parse(parse_netconf(raw), env)


def refused(**keys: Any) -> CniError:
    with pytest.raises(CniError) as info:
        parse(**keys)
    assert info.value.code == 7
    return info.value


def test_go_defaults() -> None:
    cfg = parse()
    assert cfg == config.Config()  # nothing configured: everything at its default
    assert (cfg.bridge, cfg.is_gateway, cfg.ip_masq, cfg.hairpin, cfg.mtu) == (
        "cni0", False, False, False, None)  # fmt: skip
    assert cfg.masq_backend == "nftables"


def test_seed_config_as_written() -> None:
    ipam = {"type": "flatnet-ipam", "subnet": "10.42.0.0/16", "gateway": "10.42.0.1"}
    cfg = parse(bridge="flatnet0", mtu=1500, ipam=ipam)
    assert (cfg.bridge, cfg.mtu, cfg.ipam_type, cfg.ipam_in_process) == (
        "flatnet0", 1500, "flatnet-ipam", True)  # fmt: skip


def test_is_default_gateway_implies_is_gateway() -> None:
    assert parse(isDefaultGateway=True).is_gateway


def test_keys_are_read_ignoring_case_as_go_does() -> None:
    assert parse(IsGateway=True, IPMASQ=True).ip_masq


@pytest.mark.parametrize(
    ("keys", "names"),
    [
        ({"mtu": 67}, "mtu 67"),
        ({"mtu": 65536}, "mtu 65536"),
        ({"mtu": "1500"}, "mtu"),
        ({"vlan": 4095}, "VLAN ID 4095"),
        ({"vlan": -1}, "VLAN ID -1"),
        ({"bridge": "a-name-longer-than-15"}, "bridge"),
        ({"bridge": "br/0"}, "bridge"),
        ({"ipMasqBackend": "ebtables"}, "ipMasqBackend"),
        ({"hairpinMode": True, "promiscMode": True}, "hairpin mode and promiscuous mode"),
        ({"vlan": 10, "isGateway": True}, "vlan with isGateway"),
        ({"vlanTrunk": [{"id": 5}]}, "vlanTrunk"),
        ({"macspoofchk": True}, "macspoofchk"),
        ({"preserveDefaultVlan": True}, "preserveDefaultVlan"),
        ({"disableContainerInterface": True}, "disableContainerInterface"),
        ({"ipam": {"type": "../host-local"}}, "ipam.type"),
        ({"isGateway": "yes"}, "isGateway"),
        ({"runtimeConfig": {"mac": "zz:00:00:00:00:01"}}, "runtimeConfig.mac"),
        ({"runtimeConfig": {"mac": "01:00:5e:00:00:01"}}, "multicast"),
        ({"args": {"cni": {"mac": "00:00:00:00:00:00"}}}, "all-zero"),
    ],
)
def test_refusals_name_the_option(keys: dict[str, Any], names: str) -> None:
    assert names in str(refused(**keys))


def test_unimplemented_go_options_that_ask_nothing_are_accepted() -> None:
    parse(vlanTrunk=[], macspoofchk=False, preserveDefaultVlan=False)


def test_mac_precedence_runtime_config_then_args_then_cni_args() -> None:
    env = {"MAC": "02:00:00:00:00:03"}
    assert parse(env).mac == "02:00:00:00:00:03"
    args = {"cni": {"mac": "02-00-00-00-00-02"}}
    assert parse(env, args=args).mac == "02:00:00:00:00:02"
    rc = {"mac": "0200.0000.0001"}
    assert parse(env, args=args, runtimeConfig=rc).mac == "02:00:00:00:00:01"


def test_plan_fills_gateways_and_the_default_route_as_go_does() -> None:
    cfg = parse(isDefaultGateway=True)
    ipam = Result(ips=[IPConfig("10.42.3.7/16"), IPConfig("fd42::5/64", gateway="fd42::1")])
    p = plan.make_plan(cfg, ipam)
    assert [(ip.address, ip.gateway, ip.interface) for ip in p.ips] == [
        ("10.42.3.7/16", "10.42.0.1", 2), ("fd42::5/64", "fd42::1", 2)]  # fmt: skip
    assert p.routes == [Route("0.0.0.0/0", "10.42.0.1"), Route("::/0", "fd42::1")]
    assert p.bridge_addresses == ["10.42.0.1/16", "fd42::1/64"]


def test_plan_keeps_a_default_route_ipam_gave() -> None:
    ipam = Result(ips=[IPConfig("10.1.0.5/24")], routes=[Route("0.0.0.0/0", "10.1.0.254")])
    p = plan.make_plan(parse(isDefaultGateway=True), ipam)
    assert p.routes == [Route("0.0.0.0/0", "10.1.0.254")]


def test_without_is_gateway_nothing_goes_on_the_bridge() -> None:
    p = plan.make_plan(parse(), Result(ips=[IPConfig("10.1.0.5/24")]))
    assert p.bridge_addresses == [] and p.ips[0].gateway == ""


def test_address_arithmetic() -> None:
    assert plan.network_of("10.42.3.7/16") == "10.42.0.0/16"
    assert plan.network_of("fd42::5/64") == "fd42::/64"
    assert plan.first_host("10.42.3.7/16") == "10.42.0.1"
    assert plan.broadcast_of("10.42.3.7/16") == "10.42.255.255"
    assert plan.canonical("FD42:0:0::1/64") == "fd42::1/64"


def test_nft_names_carry_the_whole_network_name() -> None:
    assert masq.chain_name("flatnet") == "n_flatnet"
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    # a name too long for nftables: its start, '/' (no network name has one) and a full
    # sha256, never a short tag that two names could share
    assert masq.chain_name(long_a) != masq.chain_name(long_b)
    assert "/" in masq.chain_name(long_a) and len(masq.chain_name(long_a)) < 250


def test_nft_add_is_per_network() -> None:
    script = masq.nft_add_script("net1", ["10.42.0.0/16"])
    assert "add element inet cni_flatnet n_net1_4 { 10.42.0.0/16 }" in script
    assert "c1" not in script  # nothing of the container in the rules


def test_go_iptables_names() -> None:
    # Go: "CNI-" + sha512(network + containerID) hex, cut at 28 characters
    assert masq.go_chain("mynet", "ctr") == "CNI-0f531d4f992fa45ddca676c5"
    assert masq.go_comment("mynet", "ctr") == 'name: "mynet" id: "ctr"'


def test_del_and_gc_read_what_add_refused() -> None:
    """A DEL of a config ADD refused must not fail on the same refusal (runtimes retry a
    failing DEL): only the IPAM type and the masquerade are read, leniently."""
    raw = {"cniVersion": "1.0.0", "name": "n", "type": "flatnet", "macspoofchk": True,
           "mtu": 10, "ipMasq": True, "ipMasqBackend": "iptables",
           "ipam": {"type": "host-local"}}  # fmt: skip
    cfg = config.parse_teardown(parse_netconf(raw))
    assert (cfg.ipam_type, cfg.ip_masq, cfg.masq_backend) == ("host-local", True, "iptables")
    odd = {**raw, "ipMasq": "yes", "ipMasqBackend": 5, "ipam": {"type": "../x"}}
    cfg = config.parse_teardown(parse_netconf(odd))
    assert (cfg.ipam_type, cfg.ip_masq, cfg.masq_backend) == ("", False, "nftables")

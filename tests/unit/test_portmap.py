"""portmap's parse and plan as pure data (no root, no kernel)."""

from __future__ import annotations

from typing import Any

import pytest

from common.config import parse_netconf
from common.errors import CniError
from common.identity import Attachment, network_tag
from portmap import config as cfg
from portmap import nft
from portmap.plan import MASQ_ALL, MASQ_NONE, MASQ_SUBNET, Forward, make_plan

PREV: dict[str, Any] = {
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
        {"name": "vethX", "mac": "aa:bb:cc:00:00:02"},
        {"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/run/netns/x"},
    ],
    "ips": [
        {"address": "10.88.0.1/16", "interface": 0},  # host side: ignored
        {"address": "10.88.0.5/16", "interface": 2},
        {"address": "10.88.0.6/16", "interface": 2},  # second v4: Go takes the first
        {"address": "fd00:88::5/64", "interface": 2},
    ],
}
ATT = Attachment("net1", "ctr1", "eth0")


def conf(mappings: list[dict[str, Any]] | None = None, **keys: Any) -> Any:
    raw: dict[str, Any] = {"cniVersion": "1.0.0", "name": "net1", "type": "portmap", **keys}
    if mappings is not None:
        raw["runtimeConfig"] = {"portMappings": mappings}
    raw.setdefault("prevResult", PREV)
    return parse_netconf(raw)


def parsed(mappings: list[dict[str, Any]] | None = None, **keys: Any) -> cfg.PortmapConfig:
    return cfg.parse(conf(mappings, **keys))


def error_of(mappings: list[dict[str, Any]] | None = None, **keys: Any) -> CniError:
    with pytest.raises(CniError) as e:
        parsed(mappings, **keys)
    return e.value


# ---------------------------------------------------------------------------- parse


def test_keys_are_read_case_insensitively_and_protocol_in_any_case() -> None:
    m = parsed([{"HostPort": 8080, "ContainerPort": 80, "Protocol": "UDP", "HostIP": ""}])
    assert m.mappings == (cfg.PortMapping(8080, 80, "udp", "", 1, 0),)


def test_missing_protocol_means_tcp_and_hostip_is_normalised() -> None:
    m = parsed([{"hostPort": 1, "containerPort": 2, "hostIP": "[2001:DB8:0::1]"}]).mappings[0]
    assert (m.protocol, m.host_ip, m.host_family) == ("tcp", "2001:db8::1", 6)
    mapped = parsed([{"hostPort": 1, "containerPort": 2, "hostIP": "::ffff:10.1.2.3"}])
    assert mapped.mappings[0].host_ip == "10.1.2.3"


@pytest.mark.parametrize(
    ("mapping", "words"),
    [
        ({"hostPort": 0, "containerPort": 80}, "portMappings[0].hostPort is 0"),
        ({"hostPort": 65536, "containerPort": 80}, "between 1 and 65535"),
        ({"hostPort": 80, "containerPort": -1}, "portMappings[0].containerPort"),
        ({"containerPort": 80}, "has no hostPort"),
        ({"hostPort": "80", "containerPort": 80}, "must be an integer"),
        ({"hostPort": 80, "containerPort": 80, "protocol": "icmp"}, "tcp, udp or sctp"),
        ({"hostPort": 80, "containerPort": 80, "hostIP": "10.0.0.300"}, "not an IP address"),
        ({"hostPort": 65000, "containerPort": 80, "range": 600}, "beyond 65535"),
        ({"hostPort": 80, "containerPort": 65500, "range": 100}, "containerPort 65500"),
        ({"hostPort": 80, "containerPort": 80, "range": 0}, "at least 1 port"),
    ],
)
def test_a_bad_mapping_is_error_7_naming_it(mapping: dict[str, Any], words: str) -> None:
    err = error_of([{"hostPort": 1, "containerPort": 1}, {**mapping}][1:])
    assert err.code == 7
    assert words in str(err)


def test_duplicate_host_port_in_one_config_is_refused() -> None:
    err = error_of(
        [
            {"hostPort": 9000, "containerPort": 80, "range": 5},
            {"hostPort": 9003, "containerPort": 90, "hostIP": "0.0.0.0"},
        ]
    )
    assert err.code == 7 and "9003/tcp" in err.msg and "portMappings[0]" in err.msg


def test_specific_and_wildcard_on_one_port_are_allowed() -> None:
    both = [{"hostPort": 80, "containerPort": 80, "hostIP": h} for h in ("", "10.0.0.1")]
    assert len(parsed(both).mappings) == 2


def test_options_defaults_and_validation() -> None:
    o = parsed([]).options
    assert (o.snat, o.masq_all, o.mark_masq_bit, o.backend) == (True, False, 13, "")
    assert error_of([], markMasqBit=32).code == 7
    assert "both externalSetMarkChain and markMasqBit" in str(
        error_of([], markMasqBit=1, externalSetMarkChain="KUBE-MARK-MASQ")
    )
    assert "unknown" in str(error_of([], backend="ebpf"))
    assert parsed([], backend="IPTables").options.backend == "iptables"


@pytest.mark.parametrize(
    "condition",
    ["ip saddr 1.2.3.4; flush ruleset", "ip saddr 1.2.3.4\nflush ruleset", "accept", "jump x"],
)
def test_conditions_cannot_escape_or_replace_the_match(condition: str) -> None:
    assert error_of([], conditionsV4=[condition]).code == 7


def test_iptables_conditions_translate_to_nft() -> None:
    tokens = ["!", "-s", "10.0.0.0/8,192.168.0.0/16", "-i", "eth+"]
    assert nft.render_conditions(parsed([], conditionsV4=tokens).options.conditions_v4) == (
        "ip saddr != { 10.0.0.0/8, 192.168.0.0/16 }",
        'iifname "eth*"',
    )
    untranslatable = ["-s", "10.0.0.0/8", "-m", "addrtype", "--src-type", "LOCAL"]
    # refused where every refusal is, at parse (nothing of the kernel is asked first)
    e = error_of([], conditionsV4=untranslatable, backend="nftables")
    assert e.code == 7 and "nft syntax" in e.details
    assert e.msg == (
        "conditionsV4: cannot translate iptables condition '-m addrtype --src-type LOCAL' "
        "to nftables"
    )
    # without a backend they choose iptables, which applies them as written
    assert parsed([], conditionsV4=untranslatable).options.needs == "iptables"


def test_only_a_trailing_plus_of_an_iptables_interface_is_a_wildcard() -> None:
    # iptables reads '+' as "any suffix" at the end only; inside a name it is a character
    tokens = ["-i", "e+th+"]
    assert nft.render_conditions(parsed([], conditionsV4=tokens).options.conditions_v4) == (
        'iifname "e+th*"',
    )


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        (["tcp dport 70000"], "'70000' after 'tcp dport' is not a port 0-65535"),
        (["ip saddr fd00::1"], "'fd00::1' after 'ip saddr' is not an IPv4 address"),
        (["-s", "10.0.0.1-10.0.0.9"], "'10.0.0.1-10.0.0.9' after -s is not an IPv4 address"),
        (["-o", "eth0*"], "'eth0*' after -o is not an interface name ('+' at the end"),
    ],
)
def test_a_refused_condition_value_says_what_it_should_be(
    condition: list[str], message: str
) -> None:
    assert message in error_of([], conditionsV4=condition).msg


def test_attachment_tag_is_stable_and_names_the_network() -> None:
    a = Attachment("testNetName", "ctr", "eth0")
    assert a.tag == Attachment("testNetName", "ctr", "eth0").tag
    assert a.tag != Attachment("testNetName", "ctr", "eth1").tag
    assert a.tag.startswith(network_tag("testNetName") + "-") and len(a.tag) == 25
    assert cfg.owner_comment(a).startswith(a.tag + " testNetName/ctr/eth0")


# ---------------------------------------------------------------------------- plan


def test_plan_takes_the_first_sandbox_address_of_each_family() -> None:
    plan = make_plan(parsed([{"hostPort": 8080, "containerPort": 80}]), ATT, conf().prev_result)
    v4, v6 = plan.families
    assert (v4.container_ip, v4.subnet, v4.prefix_len) == ("10.88.0.5", "10.88.0.0", 16)
    assert (v6.container_ip, v6.subnet, v6.prefix_len) == ("fd00:88::5", "fd00:88::", 64)
    assert v4.forwards == (Forward(None, "tcp", 8080, 80, 1, 0),)
    assert v4.masquerade == MASQ_SUBNET and v4.localhost and not v6.localhost


def test_plan_skips_a_host_ip_of_the_other_family() -> None:
    c = parsed([{"hostPort": 1, "containerPort": 1, "hostIP": "::"}])
    plan = make_plan(c, ATT, conf().prev_result)
    assert [len(f.forwards) for f in plan.families] == [0, 1]
    only4 = {**PREV, "ips": PREV["ips"][:2]}
    plan = make_plan(c, ATT, conf(prevResult=only4).prev_result)
    assert plan.empty and "no IPv6 address" in plan.skipped[0]


def test_plan_masquerade_modes() -> None:
    prev = conf().prev_result
    one = [{"hostPort": 1, "containerPort": 1}]
    assert make_plan(parsed(one, snat=False), ATT, prev).families[0].masquerade == MASQ_NONE
    assert make_plan(parsed(one, masqAll=True), ATT, prev).families[0].masquerade == MASQ_ALL


def test_plan_lists_udp_ports_to_flush() -> None:
    c = parsed([{"hostPort": 53, "containerPort": 53, "protocol": "udp", "hostIP": "10.1.1.1"}])
    assert make_plan(c, ATT, conf().prev_result).udp_ports() == [(4, "10.1.1.1", 53)]


# ---------------------------------------------------------------------------- nft rendering


def test_nft_elements_of_a_plan() -> None:
    c = parsed(
        [
            {"hostPort": 8080, "containerPort": 80, "hostIP": "10.0.0.1"},
            {"hostPort": 9000, "containerPort": 7000, "protocol": "udp", "range": 2},
        ]
    )
    v4 = make_plan(c, ATT, conf().prev_result).families[0]
    got = [(e.set, e.key, e.data) for e in nft.family_elements(v4)]
    assert got == [
        ("claims4", "10.0.0.1 . tcp . 8080", ""),
        ("hostip4", "10.0.0.1 . tcp . 8080", "10.88.0.5 . 80"),
        ("claims4", "0.0.0.0 . udp . 9000", ""),
        ("any4", "udp . 9000", "10.88.0.5 . 7000"),
        ("claims4", "0.0.0.0 . udp . 9001", ""),
        ("any4", "udp . 9001", "10.88.0.5 . 7001"),
        ("masq4", "10.88.0.5", "goto masq4-p16"),
        ("hairpin4", "10.88.0.0 . 10.88.0.5", ""),
    ]
    text = nft.add_text(nft.family_elements(v4), "tag x")
    assert text[0].startswith("create element inet cni_meta_portmap claims4 { 10.0.0.1 . tcp")
    assert all(line.startswith("add element") for line in text[1:])


def test_nft_listed_rules_read_nft_list_chain_output() -> None:
    listing = (
        "table inet cni_meta_portmap {\n\tchain masq4-p24 {\n"
        "\t\tip saddr 127.0.0.0/8 masquerade\n"
        "\t\tip saddr & 255.255.255.0 . ip daddr @hairpin4 masquerade\n\t}\n}\n"
    )
    text = nft.masq_chain_text(4, 24)
    assert nft.listed_rules("masq4-p24", listing) == nft.chain_rules("masq4-p24", text)
    assert (
        nft.listed_rules("masq4-p24", "table inet cni_meta_portmap {\n\tchain masq4-p24 {\n\t}\n}")
        == []
    )
    assert nft.listed_rules("masq4-p16", listing) == []


def test_nft_masq_chain_and_lanes() -> None:
    assert nft.masq_chain_text(4, 16)[2:] == [
        "add rule inet cni_meta_portmap masq4-p16 ip saddr 127.0.0.0/8 masquerade",
        "add rule inet cni_meta_portmap masq4-p16 ip saddr & 255.255.0.0 . ip daddr "
        "@hairpin4 masquerade",
    ]
    assert nft.prefix_mask(6, 64) == "ffff:ffff:ffff:ffff::"
    # a mask of all ones is left out, as nft prints the rule back
    assert nft.masq_chain_text(6, 128)[2:] == [
        "add rule inet cni_meta_portmap masq6-p128 ip6 saddr . ip6 daddr @hairpin6 masquerade"
    ]
    lane = nft.Lane(4, ("ip saddr 10.0.0.0/8",))
    assert lane.any_map == f"any4_{lane.id:08x}" and nft.Lane(4, ()).any_map == "any4"
    assert lane.any_rule() == (
        f"ip saddr 10.0.0.0/8 meta nfproto ipv4 dnat ip to meta l4proto . th dport map "
        f"@any4_{lane.id:08x}"
    )


def test_nft_get_output_and_listing_are_parsed() -> None:
    out = (
        "table inet cni_meta_portmap {\n\tmap any4 {\n\t\ttype inet_proto . inet_service : "
        'ipv4_addr . inet_service\n\t\telements = { 6 . 8080 comment "t1 n/c/eth0" : '
        '10.88.0.5 . 80,\n\t\t\t     udp . 53 comment "t2 x" : 10.88.0.6 . 53 }\n\t}\n}\n'
    )
    assert [(e.set, e.key, e.data, c) for e, c in nft.parse_elements(out)] == [
        ("any4", "tcp . 8080", "10.88.0.5 . 80", "t1 n/c/eth0"),
        ("any4", "udp . 53", "10.88.0.6 . 53", "t2 x"),
    ]
    listing = (
        'table inet cni_meta_portmap {\n\tcomment "CNI portmap; managed"\n\tset lanes {\n'
        "\t\ttype mark\n\t\telements = { 0x4b227777, 0xe7f6c011 }\n\t}\n\n\tset claims6 {\n"
        "\t\ttype ipv6_addr . inet_proto . inet_service\n\t}\n\n\tmap hostip4 {\n\t\ttype "
        "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service\n\t\telements = { "
        '10.0.0.1 . tcp . 80 comment "t1 a" : 10.1.1.1 . 8080 }\n\t}\n\n\tmap masq4 {\n\t\t'
        'type ipv4_addr : verdict\n\t\telements = { 10.1.1.1 comment "t1 a" : goto masq-all }'
        "\n\t}\n\n\tchain hostports {\n\t\tip saddr { 10.0.0.0/8, 10.1.0.0/16 } dnat ip to "
        "ip daddr . meta l4proto . th dport map @hostip4\n\t}\n}\n"
    )
    assert [(e.set, e.key, e.data, c) for e, c in nft.parse_elements(listing)] == [
        ("lanes", "0x4b227777", "", ""),
        ("lanes", "0xe7f6c011", "", ""),
        ("hostip4", "10.0.0.1 . tcp . 80", "10.1.1.1 . 8080", "t1 a"),
        ("masq4", "10.1.1.1", "goto masq-all", "t1 a"),
    ]


def test_udp_targets_come_from_claims() -> None:
    elements = [
        nft.Element("claims4", "0.0.0.0 . udp . 53"),
        nft.Element("claims6", "fd00::1 . udp . 54"),
        nft.Element("claims4", "0.0.0.0 . tcp . 55"),
        nft.Element("any4", "udp . 53", "10.0.0.1 . 53"),
    ]
    assert nft.udp_targets(elements) == [(4, None, 53), (6, "fd00::1", 54)]


# ---------------------------------------------------------------------------- backend choice


def test_iptables_only_keys_choose_iptables_when_no_backend_is_given() -> None:
    from common.log import Log
    from portmap import state
    from portmap.verbs import choose
    from tests.harness.fake_portmap import FakeNetfilter

    def backend(**keys: Any) -> str:
        return choose(parsed([], **keys).options, state.store(), Log(""), FakeNetfilter()).name

    assert backend(externalSetMarkChain="KUBE-MARK-MASQ") == "iptables"
    assert backend(conditionsV4=["-m", "addrtype", "--src-type", "LOCAL"]) == "iptables"
    assert backend(conditionsV6=["!", "-s", "fd00::/8"]) == "iptables"
    assert backend(backend="nftables", conditionsV4=["-s", "10.0.0.0/8"]) == (
        "nftables"  # asked for: translated (-s/-d/-i), or error 7 naming the condition
    )


def test_nft_conditions_choose_nftables_even_where_libnftables_does_not_load() -> None:
    """Only nftables can apply them: the choice is the config's, made at parse, not an
    iptables backend that refuses them once the kernel was asked."""
    from common.log import Log
    from portmap import state
    from portmap.verbs import choose
    from tests.harness.fake_portmap import FakeNetfilter

    kernel = FakeNetfilter()
    kernel.nft.usable = lambda: False  # type: ignore[method-assign]
    options = parsed([], conditionsV6=["ip6 saddr fd00::/8"]).options
    assert options.needs == "nftables"
    assert choose(options, state.store(), Log(""), kernel).name == "nftables"
    assert choose(parsed([]).options, state.store(), Log(""), kernel).name == "iptables"


def test_external_set_mark_chain_with_nftables_is_error_7_saying_what_to_change() -> None:
    e = error_of([], backend="nftables", externalSetMarkChain="KUBE-MARK-MASQ")
    assert e.code == 7 and "externalSetMarkChain" in e.msg and 'remove "backend"' in e.details


# ---------------------------------------------------------------------------- iptables-restore


def test_saved_rules_split_into_words_like_iptables_restore_reads_them() -> None:
    from portmap import xtables

    line = '-A X -p tcp -m comment --comment "portmap t1 a/b" -j CNI-DN-1'
    assert xtables.split_words(line)[6:9] == ["--comment", "portmap t1 a/b", "-j"]
    go = r'-A X -m comment --comment "dnat name: \"net\" id: \"c1\"" -j Y'
    assert xtables.split_words(go)[5] == 'dnat name: "net" id: "c1"'
    jump = xtables.Jump('-A CNI-HOSTPORT-DNAT -d 192.0.2.1/32 -p udp -m udp --dport 53:55 '
                        '-m comment --comment "portmap t1-x n/c/eth0" -j CNI-DN-1')  # fmt: skip
    assert (jump.host_ip, jump.protocol, jump.dports, jump.target) == (
        "192.0.2.1", "udp", (53, 55), "CNI-DN-1")  # fmt: skip
    assert xtables.parse_go_comment(xtables.split_words(go)[5]) == ("net", "c1")
    assert xtables.parse_go_comment("portmap t1-x n/c/eth0") is None
    assert jump.delete().startswith("-D CNI-HOSTPORT-DNAT -d 192.0.2.1/32")
    assert xtables.quote('a "b" \\') == '"a \\"b\\" \\\\"'


@pytest.mark.parametrize(
    "condition",
    [
        ["-j", "ACCEPT"],
        ["-m", "tcp", "--jump", "ACCEPT"],
        ["-m", "tcp", "--ju", "ACCEPT"],
        ["-s", "-jACCEPT"],
        ["-m", "tcp", "--syn"],
        ["--table", "filter"],
        ["-g", "X"],
        ["-m", "x y", "--a", "b"],
        ["-m", "mark", "--mark", "-jACCEPT"],  # a value iptables would read as an option
        ["ip saddr 10.0.0.0/8"],  # nft syntax: the iptables backend cannot express it
    ],
)
def test_iptables_conditions_can_only_narrow_the_jump(condition: list[str]) -> None:
    with pytest.raises(CniError) as e:
        parsed([{"hostPort": 8080, "containerPort": 80}], conditionsV4=condition,
               backend="iptables")  # fmt: skip
    assert e.value.code == 7


def test_iptables_restore_lines_of_an_add() -> None:
    from portmap import xtables

    config = parsed([{"hostPort": 8080, "containerPort": 80, "hostIP": "192.0.2.1"}],
                    conditionsV4=["!", "-s", "10.1.0.0/16"], backend="iptables")  # fmt: skip
    plan = make_plan(config, ATT, config_prev())
    fp = plan.families[0]
    name = xtables.chain_name(ATT)
    lines = xtables.installation(xtables.NatTable(""), fp, plan, name)
    assert lines[:3] == [
        "-N CNI-HOSTPORT-SETMARK",
        '-A CNI-HOSTPORT-SETMARK -m comment --comment "CNI portfwd masquerade mark" '
        "-j MARK --set-xmark 0x2000/0x2000",
        "-N CNI-HOSTPORT-MASQ",
    ]
    assert f"-A {name} -s 10.88.0.0/16 -d 192.0.2.1/32 -p tcp -m tcp --dport 8080 " \
        "-j CNI-HOSTPORT-SETMARK" in lines  # fmt: skip
    assert f"-A {name} -d 192.0.2.1/32 -p tcp -m tcp --dport 8080 -j DNAT " \
        "--to-destination 10.88.0.5:80" in lines  # fmt: skip
    comment = f'"dnat name: \\"{ATT.network}\\" id: \\"{ATT.container_id}\\""'
    # appended, as Go: nothing in the table to order it against (see placement)
    assert lines[-1] == (f"-A CNI-HOSTPORT-DNAT -m comment --comment {comment} -m multiport "
                         f"-p tcp --dports 8080 ! -s 10.1.0.0/16 -j {name}")  # fmt: skip


def config_prev() -> Any:
    return conf([]).prev_result


def go_jump(proto: str, network: str, container_id: str, port: int, chain: str) -> str:
    """A jump of the Go portmap as iptables-save prints it."""
    comment = f'"dnat name: \\"{network}\\" id: \\"{container_id}\\""'
    return f"-A CNI-HOSTPORT-DNAT -p {proto} -m comment --comment {comment} -m multiport " + (
        f"--dports {port} -j {chain}"
    )


def test_gc_picks_only_the_go_jumps_of_its_network_whose_container_is_gone(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Go's comment (ours too) names network and container; a jump to the chain of a
    valid attachment stays whatever its comment says. Other networks, other comment
    formats and valid containers stay, and a chain that another rule still jumps to is
    kept."""
    from common.log import Log
    from portmap import state, xtables
    from portmap.kernel import NftKernel, XtablesKernel

    gone, kept = cfg.go_chain_name("n", "gone"), cfg.go_chain_name("n", "kept")
    shared = cfg.go_chain_name("n", "shared")
    doomed = [go_jump("tcp", "n", "gone", 80, gone), go_jump("udp", "n", "gone", 53, gone)]
    shared_jump = go_jump("tcp", "n", "shared", 84, shared)
    top = [
        *doomed,
        go_jump("tcp", "n", "kept", 81, kept),  # valid (listed with another ifname)
        go_jump("tcp", "m", "gone", 82, cfg.go_chain_name("m", "gone")),  # network m
        go_jump("tcp", "n", "forged", 83, kept),  # Go's format, not Go's chain for it
        shared_jump,
        f"-A CNI-HOSTPORT-DNAT -p tcp --dport 85 -j {shared}",  # not Go's comment
    ]
    dnat = "-j DNAT --to-destination 10.0.0.2"
    chains = {
        gone: f"-N {gone}\n-A {gone} -p udp -m udp --dport 53 {dnat}:53",
        shared: f"-N {shared}\n-A {shared} -p tcp -m tcp --dport 84 {dnat}:84",
    }

    committed: list[list[str]] = []

    class Port(XtablesKernel):
        """Only the nft variant's IPv4 nat table exists, holding `top` and `chains`."""

        def tool(self, variant: str, family: int, kind: str) -> str:
            return f"/x/iptables-{variant}-{kind}"

        def may_have(self, variant: str, family: int, chain: str) -> bool:
            return (variant, family, chain) == ("nft", 4, xtables.TOP)

        def run(self, argv: list[str], data: bytes = b"") -> tuple[int, str]:
            if argv[0].endswith("-restore"):
                committed.append(data.decode().splitlines()[1:-1])
                return 0, ""
            chain = argv[-1]
            if chain == xtables.TOP:
                return 0, "\n".join(["-N CNI-HOSTPORT-DNAT", *top])
            return (0, chains[chain]) if chain in chains else (1, "No chain")

    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path))
    sd = state.store()

    backend = xtables.XtablesBackend(sd, Log(""), Port(NftKernel()))
    udp = backend.gc("n", {Attachment("n", "kept", "net1")}, sd.stamps())

    assert udp == [(4, None, 53)]
    deletions = ["-D" + rule[2:] for rule in doomed] + [f"-F {gone}", f"-X {gone}"]
    assert committed == [[*deletions, "-D" + shared_jump[2:]]]


def _go_match(protocol: str, field: str, right: object) -> dict[str, Any]:
    payload = {"payload": {"protocol": protocol, "field": field}}
    return {"match": {"op": "==", "left": payload, "right": right}}


def test_a_go_nft_rule_names_its_container_address_and_udp_target() -> None:
    """Go's nftables rules as `nft -j` lists them: a DNAT names the container address it
    forwards to (and, for UDP, the host address and port whose flows are flushed); a
    masquerade names the destination it masquerades."""
    from portmap.go_takeover import _read_go_rule

    dnat = {"dnat": {"addr": "10.0.0.2", "port": 80}}
    udp = [_go_match("ip", "daddr", "192.0.2.1"), _go_match("udp", "dport", 8080), dnat]
    assert _read_go_rule(4, {"expr": udp}) == ("10.0.0.2", [(4, "192.0.2.1", 8080)])
    assert _read_go_rule(4, {"expr": [_go_match("tcp", "dport", 8080), dnat]}) == (
        "10.0.0.2",
        [],
    )
    masq = [_go_match("ip6", "daddr", "fd00:0::2"), {"masquerade": None}]
    assert _read_go_rule(6, {"expr": masq}) == ("fd00::2", [])
    assert _read_go_rule(4, {"expr": [{"jump": {"target": "x"}}]}) == ("", [])

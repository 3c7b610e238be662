"""Hostile input that must not reach nft text or the log as anything but data (no root).

* a hostIP with an IPv6 zone id, and every other string that can reach portmap's nft
  text (protocol, network name, container id, ifname, conditionsV4/V6), either refused
  with error 7 or rendered as one token nft reads as data;
* conditionsV4/V6: an allowlist of plain match expressions; statements that change sets
  or act (add/update/delete @set, vmap, tproxy, synproxy, flow add, meter...) refused;
* the log: a newline or an escape sequence in CNI_NETNS, CNI_IFNAME, CNI_CONTAINERID or
  the network name, or in any message, cannot forge a log line (nor reach stderr or the
  error JSON raw);
* PATH: the iptables backend never runs a tool found through it (a relative entry).

The kernel side of the same (root, real namespaces) is in tests/kernel/test_security.py;
hostile state dirs (root: chown) in tests/kernel/test_state_dir_security.py.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from common import skel
from common.config import parse_netconf
from common.errors import CniError
from common.identity import Attachment
from common.result import Result
from portmap import config as cfg
from portmap import nft, xtables
from portmap.plan import make_plan

PREV: dict[str, Any] = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/run/netns/x"}],
    "ips": [
        {"address": "10.88.0.5/16", "interface": 0},
        {"address": "fd00:88::5/64", "interface": 0},
    ],
}
HOSTILE = ('x"', "x}", "x\n", "x;", "x#", 'a" } ; flush ruleset #', "a\nflush ruleset")


def portmap_conf(mappings: list[dict[str, Any]], **keys: Any) -> cfg.PortmapConfig:
    raw = {"cniVersion": "1.0.0", "name": "net1", "type": "portmap", **keys}
    raw["runtimeConfig"] = {"portMappings": mappings}
    return cfg.parse(parse_netconf(raw))


def refusal(mappings: list[dict[str, Any]], **keys: Any) -> CniError:
    with pytest.raises(CniError) as e:
        portmap_conf(mappings, **keys)
    assert e.value.code == 7, e.value
    return e.value


def nft_text(config: cfg.PortmapConfig, att: Attachment, prev: dict[str, Any]) -> str:
    """Every line of nft text an ADD and a DEL of this attachment would send."""
    plan = make_plan(config, att, Result.from_json(prev, "1.0.0"))
    elements = nft.plan_elements(plan)
    assert all(nft.is_plain(e) for e in elements)
    lines = [*nft.skeleton_text()]
    for lane in nft.plan_lanes(plan):
        lines += lane.create_text()
    for fp in nft.plan_masq_chains(plan):
        lines += nft.masq_chain_text(*fp)
    lines += nft.add_text(elements, cfg.owner_comment(att))
    lines += nft.delete_text(elements)
    return "\n".join(lines)


def assert_inert(text: str) -> None:
    """Each line is one command; every quoted string is a plain word nft reads as data."""
    for line in text.split("\n"):
        assert line.count('"') % 2 == 0, line
        quoted = line.split('"')[1::2]
        for q in quoted:
            assert all(c.isalnum() or c in " _.:/@+=-()*,;" for c in q), (q, line)
        bare = "".join(line.split('"')[0::2])
        assert "#" not in bare and "flush ruleset" not in bare, line
        assert bare.count("{") == bare.count("}"), line


# ---------------------------------------------------------------------------- hostIP


@pytest.mark.parametrize(
    "host_ip",
    ["fe80::1%eth0", "fe80::1%25eth0", 'fe80::1%a"}\nflush ruleset', "[fe80::1%eth0]", "::1%0"],
)
def test_a_host_ip_with_a_zone_id_is_refused_with_what_to_fix(host_ip: str) -> None:
    err = refusal([{"hostPort": 8080, "containerPort": 80, "hostIP": host_ip}])
    assert "zone" in err.msg and "portMappings[0].hostIP" in err.msg
    assert "without" in err.details  # says what to do instead
    assert "\n" not in err.msg


def test_a_prev_result_address_with_a_zone_id_is_refused() -> None:
    prev = json.loads(json.dumps(PREV))
    prev["ips"][1]["address"] = 'fd00:88::5%x"}/64'
    config = portmap_conf([{"hostPort": 8080, "containerPort": 80}])
    with pytest.raises(CniError) as e:
        make_plan(config, Attachment("n", "c", "eth0"), Result.from_json(prev, "1.0.0"))
    assert e.value.code == 7 and "prevResult.ips[1].address" in e.value.msg


@pytest.mark.parametrize("payload", HOSTILE)
def test_hostile_host_ip_and_protocol_are_refused(payload: str) -> None:
    refusal([{"hostPort": 8080, "containerPort": 80, "hostIP": "10.0.0.1" + payload}])
    refusal([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp" + payload}])


@pytest.mark.parametrize("payload", HOSTILE)
def test_hostile_names_in_comments_stay_one_quoted_word(payload: str) -> None:
    """The network name, container id and ifname are validated before a plugin runs, but
    the comment does not rely on that: it is rendered safe on its own."""
    config = portmap_conf(
        [
            {"hostPort": 8080, "containerPort": 80, "hostIP": "10.0.0.1"},
            {"hostPort": 8081, "containerPort": 81, "protocol": "udp"},
        ]
    )
    for att in (
        Attachment("net" + payload, "ctr", "eth0"),
        Attachment("net", "ctr" + payload, "eth0"),
        Attachment("net", "ctr", "eth0" + payload),
    ):
        text = nft_text(config, att, PREV)
        assert_inert(text)
        assert 'comment "' in text


def test_the_rendering_check_catches_an_injection() -> None:
    """assert_inert is not vacuous: it flags text with a forged command."""
    with pytest.raises(AssertionError):
        assert_inert('add element inet t s { 1 comment "a" } \nflush ruleset')
    with pytest.raises(AssertionError):
        assert_inert('add element inet t s { 1 comment "a"}"; }')


def test_element_keys_read_back_from_a_state_file_must_be_plain() -> None:
    """DEL and ADD put the keys of the state file into `get`/`delete element` text."""
    objects = [
        ["claims4", "10.0.0.1 . tcp . 8080"],
        ["hostip6_0a1b2c3d", "fd00::1 . udp . 53"],
        ["hairpin4", "10.88.0.0 . 10.88.0.5"],
        ["claims4", '10.0.0.1 . tcp . 1 } ; flush ruleset ; delete element x y { "'],
        ["claims4", "10.0.0.1 . tcp . 1\nflush ruleset"],
        ["claims4 } ", "1"],
    ]
    from portmap.state import Recorded

    kept = nft.recorded_elements(Recorded.from_json({"backend": "nftables", "objects": objects}))
    assert kept is not None
    assert [[e.set, e.key] for e in kept] == objects[:3]


# ---------------------------------------------------------------------------- conditions

ALLOWED_V4 = [
    ["ip saddr 10.0.0.0/8"],
    ["ip saddr != { 10.0.0.0/8, 192.168.0.0/16 }"],
    ["ip", "saddr", "10.0.0.0/8"],
    ["ip daddr 192.168.1.1-192.168.1.9"],
    ["ip saddr == 10.1.2.3", "iifname eth0"],
    ['iifname "eth*"'],
    ['oifname != { "eth0", "br-1" }'],
    ["meta l4proto tcp"],
    ["meta l4proto { tcp, udp }"],
    ["tcp sport 1024-65535"],
    ["udp sport != 53"],
    ["th sport { 1000, 2000-2100 }"],
    ["tcp sport < 1024"],
    ["meta mark 0x10"],
    ["meta iifname eth0"],
]


@pytest.mark.parametrize("conditions", ALLOWED_V4, ids=lambda c: " ".join(c))
def test_plain_match_expressions_are_allowed(conditions: list[str]) -> None:
    options = portmap_conf([], conditionsV4=conditions).options
    assert options.conditions_v4.matches
    config = portmap_conf([{"hostPort": 8080, "containerPort": 80}], conditionsV4=conditions)
    text = nft_text(config, Attachment("n", "c", "eth0"), PREV)
    assert_inert(text)
    assert " ".join(nft.render_conditions(options.conditions_v4)) + " dnat ip to" in text


def test_allowed_conditions_keep_their_text_when_already_canonical() -> None:
    """The lane of an attachment is named by a hash of its conditions: a condition
    written the usual way must keep its text, or existing lanes would be orphaned."""
    written = ["ip saddr 10.0.0.0/8", 'iifname "eth0"', "ip saddr != { 10.0.0.0/8, 1.2.3.4 }"]
    options = portmap_conf([], conditionsV4=written).options
    assert nft.render_conditions(options.conditions_v4) == tuple(written)
    v6 = ["ip6 saddr fd00::/8"]
    assert nft.render_conditions(portmap_conf([], conditionsV6=v6).options.conditions_v6) == (
        tuple(v6)
    )


@pytest.mark.parametrize(
    ("condition", "token"),
    [
        ("ip saddr 1.2.3.4; flush ruleset", ";"),
        ("ip saddr 1.2.3.4\nflush ruleset", "\\n"),
        ("ip saddr 1.2.3.4 # x", "#"),
        ("accept", "accept"),
        ("jump x", "jump"),
        ("ip saddr 1.2.3.4 counter", "counter"),
        # the statements of the finding: set changes and side effects
        ("add @claims4 { ip saddr . meta l4proto . th dport }", "add"),
        ("update @lanes { meta mark }", "update"),
        ("delete @claims4 { ip saddr . meta l4proto . th dport }", "delete"),
        ("ip saddr vmap { 1.2.3.4 : accept }", "vmap"),
        ("tcp dport 80 tproxy to :8080", "tproxy"),
        ("tcp dport 80 synproxy mss 1460", "synproxy"),
        ("flow add @ft", "flow"),
        ("meter m { ip saddr limit rate 10/second }", "meter"),
        ("ip saddr @claims4", "@claims4"),
        ("ip saddr 10.0.0.0/33", "10.0.0.0/33"),
        ("ip saddr example.com", "example.com"),  # no DNS lookup at rule load
        ("ip6 saddr fd00::/8", "ip6"),  # an IPv6 match in conditionsV4
        ("ip saddr fd00::1", "fd00::1"),
        ("ip saddr fe80::1%eth0", "%"),
        ('iifname "eth0" "x"', '"x"'),
        ('iifname "a"b"', '"a"b"'),
        ("iifname averyveryverylongname", "averyveryverylongname"),
        ("tcp dport 70000", "70000"),
        ("tcp dport http", "http"),
        ("ip saddr", "ip saddr"),
        ("ip saddr { 1.2.3.4", "{"),
        ("ip saddr 1.2.3.4 }", "}"),
        ("meta nftrace set 1", "nftrace"),
        ("ct mark set 1", "ct"),
        ("ip saddr != != 1.2.3.4", "!="),
        ("ip saddr < 1.2.3.4", "<"),
    ],
)
def test_anything_but_a_plain_match_is_error_7_naming_the_token(condition: str, token: str) -> None:
    err = refusal([], conditionsV4=[condition])
    assert "conditionsV4" in err.msg and token in err.msg, err.msg
    assert err.details  # what is allowed
    assert "\n" not in err.msg + err.details


def test_iptables_conditions_are_an_allowlist_too() -> None:
    ok = ["!", "-s", "10.0.0.0/8", "-i", "eth+", "-m", "addrtype", "--dst-type", "LOCAL"]
    options = portmap_conf([], conditionsV4=ok, backend="iptables").options
    assert xtables.condition_words(options.conditions_v4) == ok
    for bad, token in [
        (["-m", "recent", "--set"], "recent"),  # records every source: a side effect
        (["-m", "quota", "--quota", "1"], "quota"),
        (["-m", "addrtype", "--foo", "x"], "--foo"),
        (["-s", "example.com"], "example.com"),  # resolved by DNS: refused
        (["-s", "10.0.0.1\n"], "10.0.0.1"),
        (["-x", "y"], "-x"),
        (["-s"], "-s"),
        (["-i", 'eth0"'], "eth0"),
        (["-j", "ACCEPT"], "-j"),
    ]:
        err = refusal([], conditionsV4=bad)
        assert token in err.msg, (bad, err.msg)


def test_translated_iptables_conditions_render_from_addresses() -> None:
    tokens = ["!", "-s", "10.0.0.0/8,192.168.0.0/16", "-i", "eth+"]
    conditions = portmap_conf([], conditionsV4=tokens).options.conditions_v4
    assert nft.render_conditions(conditions) == (
        "ip saddr != { 10.0.0.0/8, 192.168.0.0/16 }",
        'iifname "eth*"',
    )
    refusal([], conditionsV4=["-s", "10.0.0.0/8}"])


@pytest.mark.parametrize("payload", HOSTILE)
@pytest.mark.parametrize("key", ["conditionsV4", "conditionsV6"])
def test_hostile_conditions_never_reach_nft_text(key: str, payload: str) -> None:
    base = "ip saddr 10.0.0.0/8" if key == "conditionsV4" else "ip6 saddr fd00::/8"
    for conditions in ([base + payload], [base, payload], [f'iifname "eth0{payload}"']):
        refusal([], **{key: conditions})


# ---------------------------------------------------------------------------- the log


def test_a_newline_in_cni_ifname_cannot_forge_a_log_line(tmp_path: Path) -> None:
    log = tmp_path / "plugins.log"
    forged = "2030-01-01T00:00:00 1 INFO portmap ADD net/ctr/eth0 forged"
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "ctr\rX",
        "CNI_NETNS": "/run/netns/none",
        "CNI_IFNAME": "eth0\n" + forged,
        "CNI_PATH": "/opt/cni/bin",
        "CNI_META_LOG_FILE": str(log),
    }
    conf = {"cniVersion": "1.0.0", "name": "net1", "type": "tuning"}
    out = io.BytesIO()
    rc = skel.run(
        skel.Plugin("tuning"),
        environ=env,
        stdin=io.BytesIO(json.dumps(conf).encode()),
        stdout=out,
        stderr=io.StringIO(),
    )
    assert rc == 1 and json.loads(out.getvalue())["code"] == 4  # refused before decoding
    lines = log.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 2, lines  # one line, ended by its newline
    assert b"\r" not in lines[0]
    assert b" -/ctr\\rX/eth0\\n2030-01-01T00:00:00\\x20" in lines[0], lines[0]


FORGED = "2030-01-01T00:00:00 1 ERROR tuning ADD net1/ctr/eth0 forged"


def no_control_characters(text: str) -> bool:
    return text.isprintable()


@pytest.mark.parametrize("lead", ["\n", "\r", "\x1b[2K\r", "\u2028", "\x85", "\x7f"])
@pytest.mark.parametrize("where", ["CNI_NETNS", "CNI_IFNAME", "CNI_CONTAINERID", "name"])
def test_one_failed_call_is_one_log_line_whatever_its_values_hold(
    tmp_path: Path, where: str, lead: str
) -> None:
    """Every value a message quotes is escaped: CNI_NETNS went into "network namespace
    ... does not exist" verbatim, and its newline started a forged record."""
    log = tmp_path / "plugins.log"
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "ctr",
        "CNI_NETNS": "/run/netns/none",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_META_LOG_FILE": str(log),
    }
    conf = {"cniVersion": "1.0.0", "name": "net1", "type": "tuning", "logLevel": "debug"}
    if where == "name":  # (a DEL: ADD refuses the missing netns before it reads stdin)
        env["CNI_COMMAND"] = "DEL"
        conf["name"] += lead + FORGED
    else:
        env[where] += lead + FORGED
    out, err = io.BytesIO(), io.StringIO()
    rc = skel.run(
        skel.Plugin("tuning"),
        environ=env,
        stdin=io.BytesIO(json.dumps(conf).encode()),
        stdout=out,
        stderr=err,
    )
    error = json.loads(out.getvalue())
    assert rc == 1 and error["code"] in (4, 7, 8), error
    lines = log.read_text().split("\n")
    assert len(lines) == 2 and lines[1] == "", lines  # one record, ended by its newline
    assert no_control_characters(lines[0]) and "2030-01-01T00:00:00" in lines[0], lines[0]
    assert err.getvalue().count("\n") == 1 and no_control_characters(err.getvalue()[:-1])
    assert all(no_control_characters(error[k]) for k in ("msg", "details") if k in error)


def test_every_log_record_is_one_line_whatever_the_message_holds(tmp_path: Path) -> None:
    from common.log import Log

    path = tmp_path / "plugins.log"
    log = Log(str(path), "tuning ADD net1/ctr/eth0", "debug")
    log.info(f"restored originals of eth0 from /x\n{FORGED}")
    log.error("unexpected exception:\nTraceback (most recent call last):\n  ...\x1b[31m")
    lines = path.read_text().split("\n")
    assert len(lines) == 3 and lines[2] == "", lines
    assert all(no_control_characters(line) for line in lines)
    assert lines[0].endswith("from /x\\n" + FORGED) and "\\x1b[31m" in lines[1]


# ---------------------------------------------------------------------------- PATH


@pytest.mark.parametrize("entry", ["relbin", ""])  # "" (as in "::") is the working dir
def test_iptables_is_never_run_from_a_relative_path_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    """STATUS and the variant tie-break ask the host's `iptables -V`: it was looked up
    through PATH too, so a cwd-relative entry made root run a planted `iptables`."""
    from portmap import xtables

    ran = tmp_path / "ran"
    planted = tmp_path / entry / "iptables"
    planted.parent.mkdir(exist_ok=True)
    planted.write_text(f"#!/bin/sh\necho planted > {ran}\necho 'iptables v1.8.9 (legacy)'\n")
    planted.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", f"{entry}:/usr/sbin:/usr/bin:/sbin:/bin")
    from portmap import kernel

    assert kernel.Kernel().xtables.host_variant() in xtables.VARIANTS
    assert not ran.exists()
    for d in kernel.TOOL_DIRS:
        assert os.path.isabs(d)

"""Hostile input that must not reach nft text or the log as anything but data (no root).

* a hostIP with an IPv6 zone id, and every other string that can reach portmap's nft
  text (protocol, network name, container id, ifname, conditionsV4/V6), either refused
  with error 7 or rendered as one token nft reads as data;
* conditionsV4/V6: an allowlist of plain match expressions; statements that change sets
  or act (add/update/delete @set, vmap, tproxy, synproxy, flow add, meter...) refused;
* the log prefix: a newline in CNI_IFNAME cannot forge a log line.

The kernel side of the same (root, real namespaces) is in test_security.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from common import skel
from common.config import parse_netconf
from common.errors import CniError
from common.result import Result
from portmap import config as cfg
from portmap import nft
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


def nft_text(config: cfg.PortmapConfig, att: cfg.Attachment, prev: dict[str, Any]) -> str:
    """Every line of nft text an ADD and a DEL of this attachment would send."""
    plan = make_plan(config, att, Result.from_json(prev, "1.0.0"), "nftables")
    elements = nft.plan_elements(plan)
    lines = [*nft.skeleton_text()]
    for lane in nft.plan_lanes(plan):
        lines += lane.create_text()
    for fp in nft.plan_masq_chains(plan):
        lines += nft.masq_chain_text(*fp)
    lines += nft.add_text(elements, att.comment)
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
        make_plan(config, cfg.Attachment("n", "c", "eth0"), Result.from_json(prev, "1.0.0"))
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
        cfg.Attachment("net" + payload, "ctr", "eth0"),
        cfg.Attachment("net", "ctr" + payload, "eth0"),
        cfg.Attachment("net", "ctr", "eth0" + payload),
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
    from tuning.__main__ import plugin

    out = io.BytesIO()
    rc = skel.run(
        plugin(),
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

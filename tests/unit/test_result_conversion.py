"""Result conversion across all seven spec versions (the matrix of spec-upgrades.md).

The explicit vectors below are written by hand from the spec texts; the property tests
check the round trips the matrix calls lossless.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import CniError
from common.result import Result
from common.versions import SUPPORTED_VERSIONS

MODERN = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LEGACY = ("0.1.0", "0.2.0")

RESULT_100 = {
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "cni0", "mac": "aa:bb:cc:00:00:01"},
        {"name": "veth1", "mac": "aa:bb:cc:00:00:02"},
        {"name": "eth0", "mac": "aa:bb:cc:00:00:03", "sandbox": "/run/netns/c1"},
    ],
    "ips": [
        {"interface": 2, "address": "10.88.0.5/16", "gateway": "10.88.0.1"},
        {"interface": 2, "address": "fd00::5/64", "gateway": "fd00::1"},
        {"interface": 2, "address": "10.99.0.5/24"},
    ],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.88.0.1"}, {"dst": "::/0"}],
    "dns": {"nameservers": ["10.88.0.1"], "search": ["example.org"]},
}


def test_1_0_0_to_0_4_0_adds_ip_versions() -> None:
    out = Result.from_json(RESULT_100, "1.0.0").to_json("0.4.0")
    assert out == {
        "cniVersion": "0.4.0",
        "interfaces": RESULT_100["interfaces"],
        "ips": [
            {"version": "4", "interface": 2, "address": "10.88.0.5/16", "gateway": "10.88.0.1"},
            {"version": "6", "interface": 2, "address": "fd00::5/64", "gateway": "fd00::1"},
            {"version": "4", "interface": 2, "address": "10.99.0.5/24"},
        ],
        "routes": RESULT_100["routes"],
        "dns": RESULT_100["dns"],
    }


def test_1_0_0_to_0_2_0_keeps_first_address_per_family_and_splits_routes() -> None:
    out = Result.from_json(RESULT_100, "1.0.0").to_json("0.2.0")
    assert out == {
        "cniVersion": "0.2.0",
        "ip4": {
            "ip": "10.88.0.5/16",
            "gateway": "10.88.0.1",
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.88.0.1"}],
        },
        "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1", "routes": [{"dst": "::/0"}]},
        "dns": {"nameservers": ["10.88.0.1"], "search": ["example.org"]},
    }


def test_0_2_0_to_1_0_0_has_no_interfaces() -> None:
    legacy = {
        "cniVersion": "0.2.0",
        "ip4": {"ip": "10.1.0.2/24", "gateway": "10.1.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
        "dns": {},
    }
    assert Result.from_json(legacy, "0.2.0").to_json("1.0.0") == {
        "cniVersion": "1.0.0",
        "ips": [{"address": "10.1.0.2/24", "gateway": "10.1.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    }


def test_1_1_0_fields_survive_1_1_0_and_drop_below() -> None:
    rich = {
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "eth0", "mtu": 1400, "sandbox": "/x", "socketPath": "/s", "pciID": "p"}
        ],
        "routes": [
            {
                "dst": "10.0.0.0/8",
                "mtu": 1300,
                "advmss": 1200,
                "priority": 5,
                "table": 100,
                "scope": 0,
            }
        ],
        "dns": {},
    }
    r = Result.from_json(rich, "1.1.0")
    assert r.to_json("1.1.0") == rich
    assert r.to_json("1.0.0") == {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/x"}],
        "routes": [{"dst": "10.0.0.0/8"}],
        "dns": {},
    }


def test_route_scope_zero_is_kept_in_1_1_0() -> None:
    rich = {
        "cniVersion": "1.1.0",
        "routes": [{"dst": "10.0.0.0/8", "scope": 0, "table": 0}],
        "dns": {},
    }
    assert Result.from_json(rich, "1.1.0").to_json("1.1.0")["routes"] == [
        {"dst": "10.0.0.0/8", "scope": 0, "table": 0}
    ]


def test_unknown_fields_survive_pass_through() -> None:
    raw = {
        "cniVersion": "1.0.0",
        "x-vendor": {"a": [1, 2]},
        "interfaces": [{"name": "eth0", "sandbox": "/x", "x-if": True}],
        "ips": [{"address": "10.0.0.2/24", "x-ip": 1}],
        "routes": [{"dst": "0.0.0.0/0", "x-route": "r"}],
        "dns": {"x-dns": 3},
    }
    assert Result.from_json(raw, "1.0.0").to_json("1.0.0") == raw


def test_prev_result_read_in_its_own_version() -> None:
    # A 0.4.0 prevResult under a 1.0.0 config: the ips[].version key is not "unknown".
    prev = {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.0.0.2/24"}], "dns": {}}
    assert Result.from_json(prev, "1.0.0").to_json("1.0.0")["ips"] == [{"address": "10.0.0.2/24"}]


def test_ip_version_key_is_never_carried_as_unknown() -> None:
    """A prevResult that does not say its version but has 0.4.0's ips[].version (found by
    fuzzing): a 1.0.0 result must not contain it, a 0.4.0 one has it from the address."""
    prev = {"ips": [{"version": "6", "address": "10.0.0.2/24"}], "dns": {}}
    assert Result.from_json(prev, "1.0.0").to_json("1.0.0")["ips"] == [{"address": "10.0.0.2/24"}]
    assert Result.from_json(prev, "1.0.0").to_json("0.4.0")["ips"] == [
        {"version": "4", "address": "10.0.0.2/24"}
    ]


def test_legacy_shape_is_recognised_whatever_version_it_claims() -> None:
    prev = {"cniVersion": "1.0.0", "ip4": {"ip": "10.0.0.2/24"}}
    assert Result.from_json(prev, "1.0.0").ips[0].address == "10.0.0.2/24"


def test_container_ips_selects_sandboxed_interface() -> None:
    r = Result.from_json(RESULT_100, "1.0.0")
    assert [ip.address for ip in r.container_ips("eth0")] == [
        "10.88.0.5/16",
        "fd00::5/64",
        "10.99.0.5/24",
    ]
    assert r.container_ips("veth1") == []


@pytest.mark.parametrize("index", [-2, 10**30, 1, 2**63])
def test_an_interface_index_that_points_at_no_interface_is_error_7(index: int) -> None:
    """The schema: an index into `interfaces`, minimum 0; -2 and 10**30 used to pass."""
    prev: dict[str, Any] = {"interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
                            "ips": [{"address": "10.0.0.2/24", "interface": 0},
                                    {"address": "10.0.0.3/24", "interface": index}]}  # fmt: skip
    with pytest.raises(CniError) as e:
        Result.from_json(json.loads(json.dumps(prev)), "1.0.0")
    assert e.value.code == 7, e.value
    assert e.value.msg.startswith("prevResult.ips[1].interface is ")
    assert "not an index into interfaces (0 to 0)" in e.value.msg and len(e.value.msg) < 120
    del prev["interfaces"]
    prev["ips"] = prev["ips"][:1]
    with pytest.raises(CniError) as e:
        Result.from_json(prev, "1.0.0")
    assert "(the result has none)" in e.value.msg


@pytest.mark.parametrize(
    ("key", "value"),
    [("address", "10.0.0.2\u0000/24"), ("address", "\udc80/24"), ("gateway", "10.0.0.1\u0000")],
)
def test_an_address_with_a_nul_or_a_lone_surrogate_is_error_7(key: str, value: str) -> None:
    """JSON can carry both; the address parser raised ValueError on them (error 999)."""
    ip = {"address": "10.0.0.2/24", key: value}
    with pytest.raises(CniError) as e:
        Result.from_json({"cniVersion": "1.0.0", "ips": [ip]}, "1.0.0")
    assert e.value.code == 7, e.value
    assert e.value.msg.startswith(f"prevResult.ips[0].{key} ")


def test_an_interface_index_of_minus_one_reads_as_none() -> None:
    """Some 0.3.0-era plugins wrote -1 for "no interface"; the spec's upgrade notes ask
    consumers to handle it gracefully: such an address is tied to no interface."""
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}],
            "ips": [{"address": "10.0.0.2/24", "interface": 0},
                    {"address": "10.0.0.3/24", "interface": -1}], "dns": {}}  # fmt: skip
    r = Result.from_json(json.loads(json.dumps(prev)), "1.0.0")
    assert [ip.address for ip in r.container_ips("eth0")] == ["10.0.0.2/24", "10.0.0.3/24"]
    assert r.to_json("1.0.0")["ips"][1] == {"address": "10.0.0.3/24"}


def test_an_interface_index_in_range_or_absent_passes_through() -> None:
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/x"}],
            "ips": [{"address": "10.0.0.2/24", "interface": 0}, {"address": "10.0.0.3/24"}],
            "dns": {}}  # fmt: skip
    assert Result.from_json(prev, "1.0.0").to_json("1.0.0") == prev


# ---------------------------------------------------------------------------- properties

octet = st.integers(0, 255)
ipv4 = st.builds(lambda a, b, c, d: f"{a}.{b}.{c}.{d}", octet, octet, octet, octet)
ipv6 = st.builds(lambda a, b: f"fd{a:02x}::{b:x}", octet, st.integers(1, 0xFFFF))
cidr4 = st.builds(lambda ip, p: f"{ip}/{p}", ipv4, st.integers(0, 32))
cidr6 = st.builds(lambda ip, p: f"{ip}/{p}", ipv6, st.integers(0, 128))
names = st.text("abcdefghij0123456789", min_size=1, max_size=15)
extra_key = st.text("xyz-", min_size=3, max_size=6).map(lambda s: "x-" + s)
extras = st.dictionaries(extra_key, st.integers() | st.text(max_size=5), max_size=2)
mac = st.lists(octet, min_size=6, max_size=6).map(lambda b: ":".join(f"{x:02x}" for x in b))


def interface(v11: bool) -> st.SearchStrategy[dict[str, Any]]:
    base: dict[str, st.SearchStrategy[Any]] = {
        "name": names,
        "mac": st.none() | mac,
        "sandbox": st.none() | st.just("/run/netns/x"),
    }
    if v11:
        base["mtu"] = st.none() | st.integers(68, 9000)
    return st.fixed_dictionaries(base).map(lambda d: {k: v for k, v in d.items() if v is not None})


@st.composite
def modern_result(draw: st.DrawFn, v11: bool = False) -> dict[str, Any]:
    ifaces = draw(st.lists(interface(v11), max_size=3))
    ips = []
    for _ in range(draw(st.integers(0, 3))):
        ip: dict[str, Any] = {"address": draw(cidr4 | cidr6)}
        if len(ifaces) > 0 and draw(st.booleans()):  # (`ifaces and`: mypy types draw by it)
            ip["interface"] = draw(st.integers(0, len(ifaces) - 1))
        if draw(st.booleans()):
            ip["gateway"] = draw(ipv4 if ":" not in ip["address"] else ipv6)
        ips.append({**draw(extras), **ip})
    routes = []
    for _ in range(draw(st.integers(0, 3))):
        route: dict[str, Any] = {"dst": draw(cidr4 | cidr6)}
        if draw(st.booleans()):
            route["gw"] = draw(ipv4)
        if v11 and draw(st.booleans()):
            route["table"] = draw(st.integers(0, 255))
        routes.append(route)
    out: dict[str, Any] = {**draw(extras)}
    if ifaces:
        out["interfaces"] = ifaces
    if ips:
        out["ips"] = ips
    if routes:
        out["routes"] = routes
    out["dns"] = draw(
        st.fixed_dictionaries(
            {}, optional={"nameservers": st.lists(ipv4, min_size=1, max_size=2), "domain": names}
        )
    )
    return out


@settings(max_examples=150)
@given(modern_result(), st.sampled_from(MODERN), st.sampled_from(MODERN))
def test_modern_round_trip_is_lossless(body: dict[str, Any], a: str, b: str) -> None:
    first = Result.from_json({**body, "cniVersion": a}, a).to_json(a)
    via_b = Result.from_json(Result.from_json(first, a).to_json(b), b).to_json(a)
    assert via_b == first


@settings(max_examples=100)
@given(modern_result(v11=True))
def test_1_1_0_round_trip_is_identity(body: dict[str, Any]) -> None:
    raw = {"cniVersion": "1.1.0", **body}
    assert Result.from_json(json.loads(json.dumps(raw)), "1.1.0").to_json("1.1.0") == raw


@st.composite
def legacy_result(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, addr, dst in (("ip4", cidr4, cidr4), ("ip6", cidr6, cidr6)):
        if draw(st.booleans()):
            block: dict[str, Any] = {"ip": draw(addr)}
            routes = draw(st.lists(st.fixed_dictionaries({"dst": dst}), max_size=2))
            if routes:
                block["routes"] = routes
            out[key] = block
    out["dns"] = {}
    return out


@settings(max_examples=100)
@given(legacy_result(), st.sampled_from(LEGACY), st.sampled_from(SUPPORTED_VERSIONS))
def test_legacy_round_trip_through_any_version_is_lossless(
    body: dict[str, Any], a: str, b: str
) -> None:
    first = {"cniVersion": a, **body}
    back = Result.from_json(Result.from_json(first, a).to_json(b), b).to_json(a)
    assert back == first


@settings(max_examples=100)
@given(modern_result(), st.sampled_from(SUPPORTED_VERSIONS))
def test_every_version_output_declares_itself(body: dict[str, Any], v: str) -> None:
    out = Result.from_json({**body, "cniVersion": "1.0.0"}, "1.0.0").to_json(v)
    assert out["cniVersion"] == v
    if v in LEGACY:
        assert "interfaces" not in out and "ips" not in out
    else:
        assert "ip4" not in out and all(
            ("version" in ip) == (v < "1.0.0") for ip in out.get("ips", [])
        )


@pytest.mark.parametrize("v", SUPPORTED_VERSIONS)
def test_empty_result_in_every_version(v: str) -> None:
    assert Result().to_json(v) == {"cniVersion": v, "dns": {}}

"""flatnet-ipam's config: every form host-local accepts, and every refusal (error 7 naming
the field), read as the plugin reads it; the address spelling of lease file names; the
order in which addresses are handed out (host-local's iterator)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from common.config import parse_netconf
from common.errors import CniError
from common.skel import Plugin, run
from flatnet_ipam import lib
from flatnet_ipam.addr import format_ip, parse_ip
from flatnet_ipam.config import IpamConfig
from flatnet_ipam.store import candidates


def conf(ipam: dict[str, Any], version: str = "1.1.0", **top: Any) -> dict[str, Any]:
    return {"cniVersion": version, "name": "net1", "type": "flatnet-ipam", "ipam": ipam, **top}


def parse(ipam: dict[str, Any], cni_args: dict[str, str] | None = None, **top: Any) -> IpamConfig:
    return lib.parse_config(parse_netconf(conf(ipam, **top)), cni_args)


def ip(text: str) -> int:
    parsed = parse_ip(text)
    assert parsed is not None
    return parsed[1]


def bounds(config: IpamConfig) -> list[list[tuple[str, str, str, int]]]:
    """Each set's ranges as (first, last, gateway, prefix length) in Go's spelling."""
    return [
        [
            (format_ip(r.family, r.start), format_ip(r.family, r.end),
             format_ip(r.family, r.gateway), r.prefix)
            for r in s.ranges
        ]
        for s in config.range_sets
    ]  # fmt: skip


# ---------------------------------------------------------------------------- forms


def test_the_seeds_example_subnet_and_gateway_in_the_ipam_object() -> None:
    config = parse({"type": "flatnet-ipam", "subnet": "10.42.0.0/16", "gateway": "10.42.0.1"})
    assert bounds(config) == [[("10.42.0.1", "10.42.255.254", "10.42.0.1", 16)]]
    assert config.data_dir == "/var/lib/cni/networks"
    assert config.lease_dir == "/var/lib/cni/networks/net1"
    assert config.release_on_reboot is True
    assert config.routes == () and config.requested == ()


def test_defaults_gateway_is_subnet_plus_one_and_the_broadcast_is_excluded() -> None:
    config = parse({"subnet": "192.168.7.0/24"})
    assert bounds(config) == [[("192.168.7.1", "192.168.7.254", "192.168.7.1", 24)]]


def test_ipv6_range_ends_at_the_last_address() -> None:
    config = parse({"subnet": "fd00:10::/120"})
    assert bounds(config) == [[("fd00:10::1", "fd00:10::ff", "fd00:10::1", 120)]]


def test_range_start_end_and_gateway_as_written() -> None:
    config = parse({"subnet": "10.1.0.0/24", "rangeStart": "10.1.0.100",
                    "rangeEnd": "10.1.0.199", "gateway": "10.1.0.254"})  # fmt: skip
    assert bounds(config) == [[("10.1.0.100", "10.1.0.199", "10.1.0.254", 24)]]


def test_empty_strings_read_as_absent_as_go_reads_an_empty_ip() -> None:
    config = parse({"subnet": "10.1.0.0/24", "gateway": "", "rangeStart": ""})
    assert bounds(config) == [[("10.1.0.1", "10.1.0.254", "10.1.0.1", 24)]]


def test_ranges_dual_stack_and_a_set_of_two_ranges() -> None:
    config = parse({"ranges": [
        [{"subnet": "10.1.0.0/24"}, {"subnet": "10.2.0.0/24", "gateway": "10.2.0.254"}],
        [{"subnet": "fd00::/64", "rangeStart": "fd00::10", "rangeEnd": "fd00::20"}],
    ]})  # fmt: skip
    assert bounds(config) == [
        [("10.1.0.1", "10.1.0.254", "10.1.0.1", 24), ("10.2.0.1", "10.2.0.254", "10.2.0.254", 24)],
        [("fd00::10", "fd00::20", "fd00::1", 64)],
    ]


def test_the_single_range_goes_before_ranges_and_runtime_ip_ranges_before_both() -> None:
    config = parse(
        {"subnet": "10.1.0.0/24", "ranges": [[{"subnet": "10.2.0.0/24"}]]},
        runtimeConfig={"ipRanges": [[{"subnet": "10.3.0.0/24"}]]},
    )
    assert [b[0][0] for b in bounds(config)] == ["10.3.0.1", "10.1.0.1", "10.2.0.1"]


def test_requested_addresses_from_cni_args_args_and_runtime_config() -> None:
    config = parse(
        {"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00::/64"}]]},
        {"IP": "10.1.0.9, fd00::9", "IgnoreUnknown": "1"},
        args={"cni": {"ips": ["10.1.0.9/24"]}},
        runtimeConfig={"ips": ["fd00::0:10"]},
    )
    # CNI_ARGS first, then args, then runtimeConfig; each address once.
    assert config.requested == ((4, ip("10.1.0.9")), (6, ip("fd00::9")), (6, ip("fd00::10")))


def test_routes_keep_what_is_written_and_leave_gw_for_the_allocation() -> None:
    config = parse({"subnet": "10.1.0.0/24", "routes": [
        {"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.1.0.254", "mtu": 1400},
    ]})  # fmt: skip
    assert [(r.dst, r.gw, r.mtu) for r in config.routes] == [
        ("0.0.0.0/0", "", None),
        ("192.168.0.0/16", "10.1.0.254", 1400),
    ]


def test_data_dir_resolv_conf_and_release_on_reboot() -> None:
    config = parse({"subnet": "10.1.0.0/24", "dataDir": "/tmp/x", "resolvConf": "/etc/r",
                    "releaseOnReboot": False})  # fmt: skip
    assert (config.data_dir, config.resolv_conf, config.release_on_reboot) == (
        "/tmp/x", "/etc/r", False,
    )  # fmt: skip
    assert config.lease_dir == "/tmp/x/net1"


def test_keys_are_read_case_insensitively_as_go_does() -> None:
    config = parse({"Subnet": "10.1.0.0/24", "RANGESTART": "10.1.0.5"})
    assert bounds(config) == [[("10.1.0.5", "10.1.0.254", "10.1.0.1", 24)]]


# ---------------------------------------------------------------------------- refusals

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "no ranges": ({"type": "flatnet-ipam"}, "no IP ranges"),
    "/31": ({"subnet": "10.0.0.0/31"}, "ipam.subnet"),
    "/32": ({"subnet": "10.0.0.1/32"}, "ipam.subnet"),
    "/127": ({"subnet": "fd00::/127"}, "ipam.subnet"),
    "/128": ({"subnet": "fd00::1/128"}, "ipam.subnet"),
    "host bits": ({"subnet": "10.0.0.1/24"}, "host bits"),
    "not a subnet": ({"subnet": "10.0.0.0"}, "ipam.subnet"),
    "subnet not text": ({"subnet": 10}, "ipam.subnet"),
    "start outside": ({"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"}, "ipam.rangeStart"),
    "end outside": ({"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.1"}, "ipam.rangeEnd"),
    "end is broadcast": ({"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.255"}, "ipam.rangeEnd"),
    "start after end": (
        {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.5"},
        "ipam.rangeStart",
    ),
    "bad gateway": ({"subnet": "10.0.0.0/24", "gateway": "10.0.0.x"}, "ipam.gateway"),
    "gateway of the other family": (
        {"subnet": "10.0.0.0/24", "gateway": "fd00::1"},
        "ipam.gateway",
    ),
    "range bound without subnet": ({"rangeStart": "10.0.0.9"}, "ipam.rangeStart"),
    "mixed families in a set": (
        {"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]},
        "ipam.ranges[0] mixes",
    ),
    "overlap in a set": (
        {"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]},
        "overlap",
    ),
    "overlapping sets": (
        {"ranges": [[{"subnet": "10.0.0.0/16"}], [{"subnet": "10.0.3.0/24"}]]},
        "overlaps",
    ),
    "empty set": ({"ranges": [[]]}, "ipam.ranges[0]"),
    "set not a list": ({"ranges": [{"subnet": "10.0.0.0/24"}]}, "ipam.ranges[0]"),
    "range not an object": ({"ranges": [["10.0.0.0/24"]]}, "ipam.ranges[0][0]"),
    "ranges not a list": ({"ranges": "10.0.0.0/24"}, "ipam.ranges"),
    "relative dataDir": ({"subnet": "10.0.0.0/24", "dataDir": "leases"}, "ipam.dataDir"),
    "route without dst": ({"subnet": "10.0.0.0/24", "routes": [{"gw": "10.0.0.1"}]}, "dst"),
    "route dst not a cidr": ({"subnet": "10.0.0.0/24", "routes": [{"dst": "default"}]}, "dst"),
    "route gw of another family": (
        {"subnet": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]},
        "ipam.routes[0].gw",
    ),
    "route mtu not a number": (
        {"subnet": "10.0.0.0/24", "routes": [{"dst": "0.0.0.0/0", "mtu": "big"}]},
        "ipam.routes[0].mtu",
    ),
    "releaseOnReboot not a boolean": (
        {"subnet": "10.0.0.0/24", "releaseOnReboot": "no"},
        "ipam.releaseOnReboot",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_refused_with_error_7_naming_the_field(case: str) -> None:
    ipam, named = REFUSED[case]
    with pytest.raises(CniError) as caught:
        parse(ipam)
    assert caught.value.code == 7
    assert named in str(caught.value), str(caught.value)


def test_no_ipam_object_is_refused() -> None:
    with pytest.raises(CniError) as caught:
        lib.parse_config(parse_netconf({"cniVersion": "1.0.0", "name": "n", "type": "x"}))
    assert caught.value.code == 7 and "ipam" in caught.value.msg


@pytest.mark.parametrize(
    ("top", "cni_args", "named"),
    [
        ({"runtimeConfig": {"ips": ["10.0.0.x"]}}, None, "runtimeConfig.ips[0]"),
        ({"runtimeConfig": {"ips": [5]}}, None, "runtimeConfig.ips[0]"),
        ({"args": {"cni": {"ips": ["10.0.0.1/99"]}}}, None, "args.cni.ips[0]"),
        ({}, {"IP": "10.0.0.1,nope"}, "CNI_ARGS IP"),
        ({"runtimeConfig": {"ipRanges": [[{"subnet": "10.9.0.0/31"}]]}}, None, "ipRanges[0]"),
    ],
)
def test_bad_requests_are_refused_naming_where(
    top: dict[str, Any], cni_args: dict[str, str] | None, named: str
) -> None:
    with pytest.raises(CniError) as caught:
        parse({"subnet": "10.0.0.0/24"}, cni_args, **top)
    assert caught.value.code == 7 and named in str(caught.value), str(caught.value)


def test_a_legacy_version_refuses_two_addresses_of_one_family() -> None:
    ipam = {"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "10.2.0.0/24"}]]}
    with pytest.raises(CniError) as caught:
        lib.parse_config(parse_netconf(conf(ipam, "0.2.0")))
    assert caught.value.code == 7 and "0.2.0" in caught.value.msg
    assert len(lib.parse_config(parse_netconf(conf(ipam, "0.3.1"))).range_sets) == 2


def test_the_executable_answers_a_refusal_with_error_json_and_no_traceback() -> None:
    out, err = io.BytesIO(), io.StringIO()
    stdin = json.dumps(conf({"subnet": "10.0.0.0/31"})).encode()
    status = run(
        Plugin("flatnet-ipam"),
        environ={
            "CNI_COMMAND": "DEL",
            "CNI_CONTAINERID": "c1",
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/nonexistent",
        },
        stdin=io.BytesIO(stdin),
        stdout=out,
        stderr=err,
    )
    answer = json.loads(out.getvalue())
    assert status == 1 and answer["code"] == 7 and "ipam.subnet" in answer["msg"]
    assert answer["cniVersion"] == "1.1.0" and "Traceback" not in err.getvalue()


# ---------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("text", "go"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("::ffff:10.0.0.1", "10.0.0.1"),  # Go's To4
        ("FD00:0:0:0:0:0:0:1", "fd00::1"),
        ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),  # the first of equal runs
        ("2001:db8:0:1:0:0:0:1", "2001:db8:0:1::1"),  # the longest run
        ("2001:db8:1:1:1:1:0:1", "2001:db8:1:1:1:1:0:1"),  # one zero group stays
        ("::1.2.3.4", "::102:304"),  # not glibc's ::1.2.3.4
        ("::", "::"),
    ],
)
def test_addresses_are_written_as_go_writes_them(text: str, go: str) -> None:
    parsed = parse_ip(text)
    assert parsed is not None and format_ip(*parsed) == go


@pytest.mark.parametrize("text", ["", "10.0.0", "10.0.0.256", "010.0.0.1", "fe80::1%eth0", "x"])
def test_what_is_not_an_address(text: str) -> None:
    assert parse_ip(text) is None


# ---------------------------------------------------------------------------- hand-out order


def order(config: IpamConfig, last: str | None, n: int = 100) -> list[str]:
    s = config.range_sets[0]
    start = None if last is None else parse_ip(last)
    return [
        format_ip(r.family, v) for (r, v), _ in zip(candidates(s, start), range(n), strict=False)
    ]


def test_first_address_after_the_gateway_when_there_is_no_cursor() -> None:
    config = parse({"subnet": "10.0.0.0/29"})
    assert order(config, None) == [f"10.0.0.{i}" for i in range(2, 7)]


def test_after_the_cursor_wrapping_to_the_start_once() -> None:
    config = parse({"subnet": "10.0.0.0/29"})
    assert order(config, "10.0.0.4") == ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"]


def test_a_cursor_outside_the_set_starts_at_its_first_range() -> None:
    config = parse({"subnet": "10.0.0.0/29"})
    assert order(config, "192.168.0.1") == order(config, None)


def test_through_every_range_of_a_set_with_its_own_gateways_skipped() -> None:
    config = parse({"ranges": [[
        {"subnet": "10.0.0.0/30"},
        {"subnet": "10.0.1.0/29", "rangeStart": "10.0.1.3", "rangeEnd": "10.0.1.5",
         "gateway": "10.0.1.4"},
    ]]})  # fmt: skip
    assert order(config, None) == ["10.0.0.2", "10.0.1.3", "10.0.1.5"]
    assert order(config, "10.0.1.3") == ["10.0.1.5", "10.0.0.2", "10.0.1.3"]

"""What an operator reads in the plugins' log: RFC 3339 time with microseconds and the UTC
offset, and at info level a line saying what the verb did (no internal repr) and one
saying that the call succeeded. tuning's ADD against the fake kernel, without root."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.log import timestamp
from tests.harness.fake_kernel import FakeKernel

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}[+-]\d\d:\d\d"


@pytest.fixture
def zone() -> Iterator[None]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = "IST-5:30"  # POSIX spelling of UTC+05:30, no zoneinfo needed
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.mark.usefixtures("zone")
def test_timestamp_has_microseconds_and_the_utc_offset() -> None:
    assert timestamp(86400.25) == "1970-01-02T05:30:00.250000+05:30"
    assert timestamp(0.000001) == "1970-01-01T05:30:00.000001+05:30"


def test_tuning_add_logs_what_it_set_and_that_it_succeeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = FakeKernel.for_test(tmp_path, monkeypatch)
    netns = kernel.add_netns("ctr")
    kernel.add_link(kernel.ns(netns), "eth0", "veth")
    kernel.ns(netns).sysctls["net/ipv4/conf/eth0/accept_redirects"] = "1"
    prev = {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": netns}]}
    conf = {
        "cniVersion": "1.1.0", "name": "tunenet", "type": "tuning", "prevResult": prev,
        "mtu": 1400, "mac": "02:42:0a:59:00:07",
        "sysctl": {"net.ipv4.conf.IFNAME.accept_redirects": "0"},
    }  # fmt: skip
    code, result = kernel.run("tuning", "ADD", conf, netns=netns)
    assert code == 0, result

    lines = (tmp_path / "plugins.log").read_text().splitlines()
    assert all(re.match(STAMP + r" \d+ ", line) for line in lines), lines
    info = [line.split(" ", 3)[3] for line in lines if line.split(" ")[2] == "INFO"]
    assert info == [
        "tuning ADD tunenet/ctr1/eth0 set on eth0: mac 02:42:0a:59:00:07, mtu 1400, "
        "sysctl net/ipv4/conf/eth0/accept_redirects=0; originals kept in "
        + str(tmp_path / "state" / "tuning" / "ctr1_eth0.json"),
        "tuning ADD tunenet/ctr1/eth0 succeeded",
    ]


def test_portmap_add_logs_its_forwards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.harness.fake_portmap import FakeNetfilter

    kernel = FakeKernel.for_test(tmp_path, monkeypatch)
    netns = kernel.add_netns("ctr")
    conf = {
        "cniVersion": "1.1.0", "name": "pmnet", "type": "portmap", "backend": "nftables",
        "runtimeConfig": {"portMappings": [
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": 5353, "containerPort": 53, "protocol": "udp", "hostIP": "::1"},
        ]},
        "prevResult": {
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "sandbox": netns}],
            "ips": [{"address": "10.88.0.5/16", "interface": 0},
                    {"address": "fd00::5/64", "interface": 0}],
        },
    }  # fmt: skip
    code, result = kernel.run("portmap", "ADD", conf, netns=netns, kernel=FakeNetfilter())
    assert code == 0, result
    lines = (tmp_path / "plugins.log").read_text().splitlines()
    info = [line.split(" ", 3)[3] for line in lines if line.split(" ")[2] == "INFO"]
    assert info == [
        "portmap ADD pmnet/ctr1/eth0 forwarding 0.0.0.0:8080/tcp -> 10.88.0.5:80, "
        "[::1]:5353/udp -> [fd00::5]:53, [::]:8080/tcp -> [fd00::5]:80",
        "portmap ADD pmnet/ctr1/eth0 succeeded",
    ]

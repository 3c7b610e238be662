"""Which interface may get route_localnet (portmap.localnet.choose), pure."""

from __future__ import annotations

import pytest

from portmap.kernel import Route
from portmap.localnet import choose

UNICAST, LOCAL = 1, 2


@pytest.mark.parametrize(
    ("route", "host_side", "expected"),
    [
        (Route(UNICAST, "cni0", "", "bridge"), set(), ("cni0", "")),
        (Route(UNICAST, "cali1", "", "veth"), set(), ("cali1", "")),  # Calico: no host side
        (Route(UNICAST, "cni0"), {"cni0", "veth1"}, ("cni0", "")),
        (Route(UNICAST, "veth1"), {"cni0", "veth1"}, ("veth1", "")),  # ptp: the host veth
        (None, set(), (None, "the host has no route to it")),
        (Route(LOCAL, "lo"), set(),
         (None, "the host routes it to itself (a local address), not to a container")),
        (Route(UNICAST, "lo"), set(),
         (None, "the host routes it to itself (a local address), not to a container")),
        (Route(UNICAST, "eth0", "192.168.1.1"), set(),
         (None, "the host routes it through the gateway 192.168.1.1 on eth0")),
        (Route(UNICAST, "eth0"), {"cni0", "veth1"},
         (None, "the host routes it via eth0, none of the chain's (cni0, veth1)")),
        # macvlan: the container is on the uplink's own link
        (Route(UNICAST, "eth0"), set(),
         (None, "the host routes it via eth0, a plain device, not a bridge or veth")),
        (Route(UNICAST, "bond0", "", "bond"), set(),
         (None, "the host routes it via bond0, a bond device, not a bridge or veth")),
    ],
)  # fmt: skip
def test_only_an_on_link_interface_of_the_chain_gets_it(
    route: Route | None, host_side: set[str], expected: tuple[str | None, str]
) -> None:
    assert choose(route, host_side) == expected

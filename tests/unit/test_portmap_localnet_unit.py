"""Which interface may get route_localnet (portmap.localnet.choose), and the localhost
guard's text (portmap.kernel), pure."""

from __future__ import annotations

import pytest

from portmap.kernel import Route, guard_iptables_lines, guard_nft_text
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


def test_the_nft_guard_is_one_table_made_anew_with_the_interfaces_in_a_set() -> None:
    t = "ip cni_meta_localnet"
    assert guard_nft_text(["br77", "cni0"]).splitlines() == [
        f"add table {t}",
        f"delete table {t}",
        f'add table {t} {{ comment "cni-meta-plugins portmap: containers do not reach the node '
        'localhost; managed, do not edit"; }',
        f'add set {t} interfaces {{ type ifname; elements = {{ "br77", "cni0" }}; }}',
        f"add chain {t} input {{ type filter hook input priority filter; policy accept; }}",
        f"add chain {t} guard",
        f"add rule {t} input ip daddr 127.0.0.0/8 iifname @interfaces jump guard",
        f"add rule {t} guard ct state established,related return",
        f"add rule {t} guard ct status dnat return",
        f"add rule {t} guard drop",
    ]
    # none: the table goes, whether it was there or not
    assert guard_nft_text([]) == f"add table {t}\ndelete table {t}\n"
    # a table that is not there is only made: nothing deleted
    assert guard_nft_text(["cni0"], replace=False).splitlines()[0] == (
        f'add table {t} {{ comment "cni-meta-plugins portmap: containers do not reach the node '
        'localhost; managed, do not edit"; }'
    )
    assert "delete" not in guard_nft_text(["cni0"], replace=False)


JUMP = ('-d 127.0.0.0/8 -m comment --comment "cni-meta-plugins portmap: containers do not '
        'reach the node localhost" -j CNI-META-LOCALNET')  # fmt: skip
DROP = "-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"


@pytest.mark.parametrize(
    ("interfaces", "jump", "chain", "expected"),
    [
        (["br77", "cni0"], False, False,
         [":CNI-META-LOCALNET - [0:0]", f"-A CNI-META-LOCALNET -i br77 {DROP}",
          f"-A CNI-META-LOCALNET -i cni0 {DROP}", f"-I INPUT 1 {JUMP}"]),
        # the chain declared again is flushed: its rules written whole, the jump kept
        (["cni0"], True, True,
         [":CNI-META-LOCALNET - [0:0]", f"-A CNI-META-LOCALNET -i cni0 {DROP}"]),
        ([], True, True, [f"-D INPUT {JUMP}", "-F CNI-META-LOCALNET", "-X CNI-META-LOCALNET"]),
        ([], False, True, ["-F CNI-META-LOCALNET", "-X CNI-META-LOCALNET"]),
        ([], False, False, []),
    ],
)  # fmt: skip
def test_the_iptables_guard_is_a_chain_of_ours_jumped_to_first_from_input(
    interfaces: list[str], jump: bool, chain: bool, expected: list[str]
) -> None:
    assert guard_iptables_lines(interfaces, jump, chain) == expected


def test_the_guard_forces_the_iptables_variant_by_the_backends_variable() -> None:
    from portmap import kernel, xtables

    assert kernel.IPTABLES_VARIANT_ENV == xtables.VARIANT_ENV

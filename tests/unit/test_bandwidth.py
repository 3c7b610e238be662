"""bandwidth without root: config parsing, tbf arithmetic, placement and the reconcile plan.

Expected numbers are worked out by hand in the comments (tick = 64 ns, i.e. 15.625 ticks
per microsecond, as /proc/net/psched says on every current kernel), not produced by the
code under test.
"""

from __future__ import annotations

from typing import Any

import pytest

from bandwidth import config, plan, tc
from bandwidth.model import (
    CLSACT_INGRESS,
    CONTAINER,
    HOST,
    INGRESS_HANDLE,
    TBF_HANDLE,
    TC_H_INGRESS,
    TC_H_ROOT,
    DeviceState,
    Filter,
    IfbState,
    Link,
    Observed,
    Qdisc,
    TbfParams,
)
from bandwidth.plan import (
    AddIngressQdisc,
    AddRedirect,
    CreateIfb,
    DeleteFilters,
    DeleteIfb,
    DeleteIngressQdisc,
    DeleteRootQdisc,
    Ownership,
    Placement,
    Plan,
    SetTbf,
    UpdateIfb,
)
from bandwidth.record import Record
from bandwidth.tbf import Psched, make_tbf
from common.config import parse_netconf
from common.errors import CONFLICT, INVALID_CONFIG, UNSUPPORTED_FIELD, CniError
from common.result import Interface, Result

PSCHED = Psched(15.625)
NET, CID, IFNAME = "bwnet", "ctr1", "eth0"
IFB = plan.ifb_name(NET, CID)
ALIAS = plan.ifb_alias(NET, CID, IFNAME)


def conf(**body: Any) -> Any:
    return parse_netconf({"cniVersion": "1.0.0", "name": NET, "type": "bandwidth", **body})


def parse(**body: Any) -> config.BandwidthConfig:
    return config.parse(conf(**body))


def error(fn: Any, *args: Any, **kw: Any) -> CniError:
    with pytest.raises(CniError) as e:
        fn(*args, **kw)
    return e.value


# ---------------------------------------------------------------------------- config


def test_runtime_config_bandwidth_is_read() -> None:
    cfg = parse(runtimeConfig={"bandwidth": {"ingressRate": 8000, "ingressBurst": 16000}})
    assert cfg.ingress is not None and (cfg.ingress.rate, cfg.ingress.burst) == (8000, 16000)
    assert cfg.egress is None


def test_top_level_keys_win_over_runtime_config() -> None:
    cfg = parse(
        egressRate=1000000,
        egressBurst=100000,
        runtimeConfig={"bandwidth": {"ingressRate": 8000, "ingressBurst": 16000}},
    )
    assert cfg.ingress is None  # runtimeConfig is ignored entirely, as upstream
    assert cfg.egress is not None and cfg.egress.rate == 1000000


def test_keys_are_case_insensitive() -> None:
    cfg = parse(runtimeConfig={"Bandwidth": {"IngressRate": 8000, "INGRESSBURST": 16000}})
    assert cfg.ingress is not None and cfg.ingress.burst == 16000


def test_zero_everywhere_shapes_nothing() -> None:
    assert not parse(ingressRate=0, ingressBurst=0).shapes_anything
    assert not parse().shapes_anything


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"ingressRate": 1000000}, ("ingressRate", "ingressBurst")),
        ({"egressBurst": 1000000}, ("egressBurst", "egressRate")),
        (
            {"runtimeConfig": {"bandwidth": {"egressRate": 5}}},
            ("runtimeConfig.bandwidth.egressRate", "egressBurst"),
        ),
    ],
)
def test_rate_without_burst_and_burst_without_rate_say_which(
    body: dict[str, Any], names: tuple[str, str]
) -> None:
    e = error(parse, **body)
    assert e.code == INVALID_CONFIG
    assert all(n in str(e) for n in names)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"ingressRate": -1, "ingressBurst": 100}, "at least 0"),
        ({"ingressRate": "10mbit", "ingressBurst": 100}, "must be an integer"),
        ({"ingressRate": 1.5, "ingressBurst": 100}, "must be an integer"),
        ({"ingressRate": True, "ingressBurst": 100}, "boolean"),
        ({"ingressRate": 7, "ingressBurst": 100000}, "too small"),
        ({"ingressRate": 2**60, "ingressBurst": 100000}, "more than tbf"),
        ({"runtimeConfig": {"bandwidth": []}}, "JSON object"),
    ],
)
def test_bad_values_are_error_7_naming_the_key(body: dict[str, Any], fragment: str) -> None:
    e = error(parse, **body)
    assert e.code == INVALID_CONFIG and fragment in str(e)


def test_subnet_selection_is_refused_rather_than_ignored() -> None:
    e = error(parse, ingressRate=8000, ingressBurst=16000, shapedSubnets=["10.0.0.0/8"])
    assert e.code == UNSUPPORTED_FIELD and "shapedSubnets" in str(e)


def test_rates_above_32_bit_bytes_per_second_are_accepted() -> None:
    # 40 Gbit/s = 5e9 B/s, beyond tc_ratespec's 32-bit rate: Go sends it as RATE64
    cfg = parse(ingressRate=40_000_000_000, ingressBurst=800_000_000)
    assert cfg.ingress is not None and cfg.ingress.rate == 40_000_000_000


def test_huge_burst_is_accepted_by_the_parser() -> None:
    cfg = parse(runtimeConfig={"bandwidth": {"ingressRate": 10**6, "ingressBurst": 2**40}})
    assert cfg.ingress is not None and cfg.ingress.burst == 2**40


# ---------------------------------------------------------------------------- tbf


def limit(rate: int, burst: int) -> config.Limit:
    return config.Limit(rate, burst, "ingressRate", "ingressBurst")


def test_psched_is_read_like_tc() -> None:
    assert Psched.parse("000003e8 00000040 000f4240 3b9aca00\n").tick_in_usec == 15.625


def test_tbf_numbers_match_upstream_formula() -> None:
    # 10 Mbit/s = 1,250,000 B/s; 40,000 B take 32 ms = 32,000 us = 500,000 ticks;
    # limit = 1,250,000 B/s x 25 ms + 40,000 B = 71,250 B.
    tbf, note = make_tbf(limit(10_000_000, 320_000), 1500, "veth0", PSCHED)
    assert (tbf.rate, tbf.burst, tbf.buffer, tbf.limit) == (1_250_000, 40_000, 500_000, 71_250)
    assert note == ""


def test_kubelet_burst_is_clamped_to_the_32_bit_buffer() -> None:
    # 1 Mbit/s = 125,000 B/s = 0.125 B/us. The buffer holds at most 2^32-1 ticks
    # = 274,877,906.9 us, i.e. 34,359,738.4 bytes at this rate.
    tbf, note = make_tbf(limit(1_000_000, 4_294_967_295), 1500, "veth0", PSCHED)
    assert tbf.burst == 34_359_738
    assert tbf.buffer <= 2**32 - 1
    assert "clamped" in note and "4294967295" in note


def test_kubelet_burst_fits_at_high_rates_and_is_kept() -> None:
    # 100 Mbit/s: 536,870,911 B take 42.9 s = 6.7e8 ticks: fits, nothing to clamp.
    tbf, note = make_tbf(limit(100_000_000, 4_294_967_295), 1500, "veth0", PSCHED)
    assert tbf.burst == 536_870_911 and note == ""


def test_rate_too_small_for_tbf_is_a_clear_error() -> None:
    # 16 bit/s = 2 B/s: the longest buffer the kernel honours (2^32 ns) holds 8 bytes.
    e = error(make_tbf, limit(16, 100_000), 1500, "host veth veth0", PSCHED)
    assert e.code == INVALID_CONFIG and "too small" in e.msg and "at least" in e.details


def test_burst_below_one_frame_is_raised_to_one_frame_and_logged() -> None:
    # The CNI docs' 1600 bits (200 B) at 10 Mbit/s = 1.25 B/us: a 1514-byte frame takes
    # 1211.2 us, i.e. 1212 whole us = 1515 B; buffer 1212 us x 15.625 = 18,937 ticks;
    # limit 1,250,000 x 25 ms + 1515 = 32,765 B.
    tbf, note = make_tbf(limit(10_000_000, 1600), 1500, "host veth veth0", PSCHED)
    assert (tbf.rate, tbf.burst, tbf.buffer, tbf.limit) == (1_250_000, 1515, 18_937, 32_765)
    assert "1600 bits" in note and "raised to 12120 bits" in note and "veth0" in note


def test_cni_docs_example_rate_123_is_refused_naming_the_least_rate() -> None:
    # 123 bit/s = 15 B/s. The kernel caps the buffer's transmit time at 2^32-1 ns when
    # it computes tbf's largest frame: 15 B/s x 4.295 s = 64 B, so no burst lets a
    # 1514-byte frame through (Go installs it and drops everything above 57 B). The
    # least rate: 1514 B / 4.295 s = 352.5 -> 353 B/s = 2824 bit/s.
    e = error(make_tbf, limit(123, 456), 1500, "host veth veth0", PSCHED)
    assert e.code == INVALID_CONFIG and "123 bit/s is too small" in e.msg
    assert "at least 2824 bit/s" in e.details
    tbf, note = make_tbf(limit(2824, 456), 1500, "host veth veth0", PSCHED)
    assert tbf.rate == 353 and "raised" in note


def test_a_burst_of_exactly_one_frame_is_kept() -> None:
    tbf, note = make_tbf(limit(10_000_000, 1515 * 8), 1500, "veth0", PSCHED)
    assert tbf.burst == 1515 and note == ""


def test_40_gbit_keeps_its_real_rate_in_the_arithmetic() -> None:
    # 5e9 B/s; 1e8 B take 20 ms = 20,000 us = 312,500 ticks; limit 5e9 x 25 ms + 1e8.
    tbf, note = make_tbf(limit(40_000_000_000, 800_000_000), 1500, "veth0", PSCHED)
    assert (tbf.rate, tbf.burst, tbf.buffer, tbf.limit) == (5 * 10**9, 10**8, 312_500, 225 * 10**6)
    assert note == ""


def test_40_gbit_small_burst_is_one_whole_microsecond() -> None:
    # At 5,000 B/us a frame needs 1 us of buffer, which holds 5,000 B (15.625 -> 15 ticks)
    tbf, note = make_tbf(limit(40_000_000_000, 1600), 1500, "veth0", PSCHED)
    assert (tbf.burst, tbf.buffer) == (5000, 15) and "raised" in note


def test_small_burst_accounts_for_whole_ticks_at_high_rates() -> None:
    # 12.4 Gbit/s = 1,550 B/us: 1 us of buffer is 15 ticks = 960 ns = 1,488 B, less than
    # a 1514-byte frame (the kernel dropped it when tried); 2 us = 31 ticks = 3,075 B.
    tbf, note = make_tbf(limit(12_400_000_000, 1550 * 8), 1500, "veth0", PSCHED)
    assert (tbf.burst, tbf.buffer) == (3100, 31) and "raised" in note


def test_queue_limit_above_32_bits_is_clamped_not_wrapped() -> None:
    # 2 Tbit/s = 2.5e11 B/s: 25 ms of it is 6.25e9 B > 2^32-1. Go's uint32 conversion
    # wraps it (to 1,955,032,704 + burst); we send 2^32-1 and say so.
    tbf, note = make_tbf(limit(2 * 10**12, 4_294_967_295), 1500, "veth0", PSCHED)
    assert tbf.limit == 2**32 - 1 and tbf.burst == 536_870_911
    assert "queue limit" in note and "clamped" in note


def test_tbf_options_carry_rate64_only_above_32_bits() -> None:
    small = tc.tbf_options(1_250_000, 500_000, 71_250)
    assert [name for name, _ in small["attrs"]] == ["TCA_TBF_PARMS", "TCA_TBF_RTAB"]
    assert small["attrs"][0][1]["rate"] == 1_250_000
    big = tc.tbf_options(5 * 10**9, 312_500, 225 * 10**6)
    assert big["attrs"][0][1]["rate"] == 2**32 - 1  # what tc sends in tc_ratespec
    assert big["attrs"][2] == ["TCA_TBF_RATE64", 5 * 10**9]


def test_tbf_rate64_survives_encoding_and_is_read_back() -> None:
    """Our tcmsg encodes RATE64 and decodes it from the same bytes (a dump looks alike)."""
    m = tc.tc_modules()
    msg = m.tcmsg()
    msg["index"], msg["handle"], msg["parent"] = 3, TBF_HANDLE, TC_H_ROOT
    options = tc.tbf_options(5 * 10**9, 312_500, 225 * 10**6)
    msg["attrs"] = [["TCA_KIND", "tbf"], ["TCA_OPTIONS", options]]
    msg.encode()
    back = m.tcmsg(msg.data)
    back.decode()
    qdisc = tc._qdisc(back)
    assert qdisc.tbf == TbfParams(5 * 10**9, 312_500, 225 * 10**6)
    # pyroute2's own tbf options are left as they were: they know no RATE64
    from pyroute2.netlink.rtnl.tcmsg import sched_tbf

    ours = back.get_attr("TCA_OPTIONS")
    plain = sched_tbf.options(ours.data, offset=ours.offset)
    plain.decode()
    assert plain.get_attr("TCA_TBF_PARMS")["buffer"] == 312_500
    assert plain.get_attr("TCA_TBF_RATE64") is None


# ---------------------------------------------------------------------------- names


def test_ifb_name_is_upstreams() -> None:
    # the value upstream's own tests expect for this network and container id
    assert plan.ifb_name("cni-plugin-bandwidth-test", "dummy") == "bwpa8eda89404b7"


def test_alias_names_the_owner_and_gc_reads_it_back() -> None:
    assert ALIAS == "cni-meta-bandwidth bwnet/ctr1/eth0"
    assert plan.alias_owner(ALIAS, NET) == (CID, IFNAME)
    assert plan.alias_owner(ALIAS, "othernet") is None
    assert plan.alias_owner("something else", NET) is None


def test_record_survives_a_round_trip() -> None:
    rec = Record(NET, CID, IFNAME, mode=HOST, device="veth1", device_index=7,
                 netns="/run/netns/x", ifb=IFB, ownership=Ownership(True, False))  # fmt: skip
    assert Record.from_json(rec.to_json()) == rec
    assert Record.from_json([NET]) is None
    with pytest.raises(ValueError, match="containerID is missing"):
        Record.from_json({"network": NET})
    with pytest.raises(ValueError, match="containerID is not a non-empty string"):
        Record.from_json({**rec.to_json(), "containerID": ""})


# ---------------------------------------------------------------------------- placement


CTR_VETH = Link(2, "eth0", "veth", 1500, peer_index=9)
HOST_VETH = Link(9, "veth1234", "veth", 1500, peer_index=2)


def prev(*names: str) -> Result:
    ifaces = [Interface(n) for n in names] + [Interface("eth0", sandbox="/run/netns/c")]
    return Result(interfaces=ifaces)


def test_veth_is_shaped_on_its_host_peer() -> None:
    where = plan.locate(CTR_VETH, HOST_VETH, prev("cni0", "veth1234"), "eth0")
    assert where == Placement(HOST, HOST_VETH)


def test_host_veth_must_be_listed_in_prev_result() -> None:
    e = error(plan.locate, CTR_VETH, HOST_VETH, prev("cni0"), "eth0")
    assert e.code == INVALID_CONFIG and "veth1234" in str(e)


def test_legacy_prev_result_without_interfaces_relies_on_the_ifindex() -> None:
    assert plan.locate(CTR_VETH, HOST_VETH, Result(), "eth0").mode == HOST


def test_a_peer_that_does_not_point_back_is_refused() -> None:
    stranger = Link(9, "veth1234", "veth", 1500, peer_index=5)
    assert error(plan.locate, CTR_VETH, stranger, prev("veth1234"), "eth0").code == 7
    assert error(plan.locate, CTR_VETH, None, prev("veth1234"), "eth0").code == 7


def test_macvlan_is_shaped_inside_the_container() -> None:
    macvlan = Link(3, "eth0", "macvlan", 1500, peer_index=4)
    assert plan.locate(macvlan, None, prev(), "eth0") == Placement(CONTAINER, macvlan)


# ---------------------------------------------------------------------------- plan + reconcile

BOTH = config.BandwidthConfig(
    ingress=config.Limit(10_000_000, 320_000, "ingressRate", "ingressBurst"),
    egress=config.Limit(20_000_000, 400_000, "egressRate", "egressBurst"),
)


def build(cfg: config.BandwidthConfig = BOTH, where: Placement | None = None) -> Plan:
    return plan.build(cfg, where or Placement(HOST, HOST_VETH), IFB, ALIAS, PSCHED)


IFB_LINK = Link(20, IFB, "ifb", 1500, alias=ALIAS)


def converged(p: Plan) -> Observed:
    """What the kernel holds after a successful ADD of plan p (hand-built)."""
    assert p.device_tbf is not None and p.ifb is not None
    device = DeviceState(
        HOST_VETH,
        qdiscs=(
            Qdisc("tbf", TBF_HANDLE, TC_H_ROOT, p.device_tbf.params),
            Qdisc("ingress", INGRESS_HANDLE, TC_H_INGRESS),
        ),
        filters=redirect_filters(20),
    )
    ifb = IfbState(IFB_LINK, Qdisc("tbf", TBF_HANDLE, TC_H_ROOT, p.ifb.tbf.params))
    return Observed(device, ifb, frozenset({20}))


def redirect_filters(
    target: int, prio: int = 1, parent: int = INGRESS_HANDLE
) -> tuple[Filter, ...]:
    # a u32 dump: head, hash table, then the node with the match and the action
    return (
        Filter(parent, prio, "u32"),
        Filter(parent, prio, "u32", handle=0x80000000),
        Filter(parent, prio, "u32", handle=0x80000800, is_rule=True, match_all=True,
               redirect_to=target),
    )  # fmt: skip


FRESH = Observed(DeviceState(HOST_VETH, (Qdisc("noqueue", 0, TC_H_ROOT),)), None)


def kinds(actions: tuple[Any, ...]) -> list[type]:
    return [type(a) for a in actions]


def test_plan_maps_directions_to_devices_like_upstream() -> None:
    p = build()
    assert p.device_tbf is not None and p.device_tbf.rate == 1_250_000  # ingress on the veth
    assert p.ifb is not None and p.ifb.tbf.rate == 2_500_000  # egress on the ifb
    assert (p.ifb.name, p.ifb.mtu, p.ifb.alias) == (IFB, 1500, ALIAS)


def test_in_container_mode_egress_is_on_the_interface_and_ingress_on_the_ifb() -> None:
    macvlan = Link(3, "eth0", "macvlan", 9000)
    p = build(where=Placement(CONTAINER, macvlan))
    assert p.device_tbf is not None and p.device_tbf.rate == 2_500_000
    assert p.ifb is not None and p.ifb.tbf.rate == 1_250_000 and p.ifb.mtu == 9000


def test_first_add_creates_everything_in_a_safe_order() -> None:
    r = plan.reconcile(build(), FRESH, Ownership(), ifb=IFB, alias=ALIAS)
    assert kinds(r.actions) == [CreateIfb, SetTbf, AddIngressQdisc, SetTbf, AddRedirect]
    assert r.actions[1] == SetTbf(IFB, build().ifb.tbf)  # type: ignore[union-attr]
    assert r.ownership == Ownership(device_tbf=True, ingress_qdisc=True)


def test_second_add_on_converged_state_does_nothing() -> None:
    p = build()
    r = plan.reconcile(p, converged(p), Ownership(True, True), ifb=IFB, alias=ALIAS)
    assert r.actions == () and r.ownership == Ownership(True, True)


def test_second_add_with_new_rates_only_replaces_the_tbfs() -> None:
    old = converged(build())
    faster = config.BandwidthConfig(
        ingress=config.Limit(50_000_000, 800_000, "a", "b"),
        egress=config.Limit(60_000_000, 800_000, "c", "d"),
    )
    r = plan.reconcile(build(faster), old, Ownership(True, True), ifb=IFB, alias=ALIAS)
    assert kinds(r.actions) == [SetTbf, SetTbf]


def test_a_redirect_to_a_vanished_device_is_replaced() -> None:
    p = build()
    obs = converged(p)
    stale = Observed(
        DeviceState(obs.device.link, obs.device.qdiscs, redirect_filters(99)),  # type: ignore[union-attr]
        obs.ifb,
        frozenset(),  # ifindex 99 no longer exists
    )
    r = plan.reconcile(p, stale, Ownership(True, True), ifb=IFB, alias=ALIAS)
    assert kinds(r.actions) == [DeleteFilters, AddRedirect]


def test_foreign_ingress_filters_are_a_conflict_not_overwritten() -> None:
    police = Filter(INGRESS_HANDLE, 5, "u32", is_rule=True, match_all=True, other_actions=True)
    to_other = redirect_filters(30, prio=2)  # redirects to a live device that is not ours
    for filters in ((police,), to_other):
        obs = Observed(
            DeviceState(HOST_VETH, (Qdisc("ingress", INGRESS_HANDLE, TC_H_INGRESS),), filters),
            None,
            frozenset({30}),
        )
        e = error(plan.reconcile, build(), obs, Ownership(), ifb=IFB, alias=ALIAS)
        assert e.code == CONFLICT and "prio" in e.details


def test_foreign_filters_do_not_matter_when_only_ingress_is_shaped() -> None:
    police = Filter(INGRESS_HANDLE, 5, "u32", is_rule=True, other_actions=True)
    obs = Observed(
        DeviceState(HOST_VETH, (Qdisc("ingress", INGRESS_HANDLE, TC_H_INGRESS),), (police,)),
        None,
    )
    only_ingress = config.BandwidthConfig(ingress=BOTH.ingress)
    r = plan.reconcile(build(only_ingress), obs, Ownership(), ifb=IFB, alias=ALIAS)
    assert kinds(r.actions) == [SetTbf]


def test_foreign_root_qdisc_is_a_conflict() -> None:
    obs = Observed(DeviceState(HOST_VETH, (Qdisc("htb", 0x20000, TC_H_ROOT),)), None)
    e = error(plan.reconcile, build(), obs, Ownership(), ifb=IFB, alias=ALIAS)
    assert e.code == CONFLICT and "htb 2:" in e.details


def test_existing_ingress_qdisc_is_used_and_kept_on_del() -> None:
    theirs = Observed(
        DeviceState(HOST_VETH, (Qdisc("ingress", INGRESS_HANDLE, TC_H_INGRESS),)), None
    )
    r = plan.reconcile(build(), theirs, Ownership(), ifb=IFB, alias=ALIAS)
    assert AddIngressQdisc not in kinds(r.actions)
    assert r.ownership.ingress_qdisc is False
    p = build()
    after = converged(p)
    d = plan.reconcile(Plan(HOST, "veth1234"), after, r.ownership, ifb=IFB, alias=ALIAS)
    assert DeleteIngressQdisc not in kinds(d.actions)


def test_clsact_hook_gets_the_filter_on_its_ingress_parent() -> None:
    obs = Observed(DeviceState(HOST_VETH, (Qdisc("clsact", INGRESS_HANDLE, TC_H_INGRESS),)), None)
    r = plan.reconcile(build(), obs, Ownership(), ifb=IFB, alias=ALIAS)
    assert AddRedirect(CLSACT_INGRESS, IFB) in r.actions


def test_del_removes_exactly_what_the_attachment_owns() -> None:
    p = build()
    r = plan.reconcile(Plan(HOST, "veth1234"), converged(p), Ownership(True, True), ifb=IFB,
                       alias=ALIAS)  # fmt: skip
    # the filters go with the ingress qdisc
    assert kinds(r.actions) == [DeleteIngressQdisc, DeleteIfb, DeleteRootQdisc]
    assert r.ownership == Ownership()


def test_del_leaves_a_tbf_it_did_not_create() -> None:
    p = build()
    r = plan.reconcile(Plan(HOST, "veth1234"), converged(p), Ownership(), ifb=IFB, alias=ALIAS)
    assert DeleteRootQdisc not in kinds(r.actions) and DeleteIngressQdisc not in kinds(r.actions)


def test_del_keeps_the_ingress_qdisc_while_others_filter_on_it() -> None:
    p = build()
    obs = converged(p)
    extra = Filter(INGRESS_HANDLE, 7, "bpf", is_rule=True, other_actions=True)
    device = DeviceState(HOST_VETH, obs.device.qdiscs, (*obs.device.filters, extra))  # type: ignore[union-attr]
    obs = Observed(device, obs.ifb, obs.live_indexes)
    r = plan.reconcile(Plan(HOST, "veth1234"), obs, Ownership(True, True), ifb=IFB, alias=ALIAS)
    assert DeleteIngressQdisc not in kinds(r.actions) and r.kept


def test_an_ifb_of_another_attachment_is_neither_used_nor_deleted() -> None:
    other = IfbState(Link(20, IFB, "ifb", 1500, alias=plan.ifb_alias(NET, CID, "eth1")))
    obs = Observed(FRESH.device, other)
    assert error(plan.reconcile, build(), obs, Ownership(), ifb=IFB, alias=ALIAS).code == CONFLICT
    d = plan.reconcile(Plan(HOST, "veth1234"), obs, Ownership(), ifb=IFB, alias=ALIAS)
    assert DeleteIfb not in kinds(d.actions)


def test_a_changed_ifb_is_updated_in_place() -> None:
    p = build()
    obs = converged(p)
    down = IfbState(Link(20, IFB, "ifb", 1400, up=False, alias=ALIAS), obs.ifb.root)  # type: ignore[union-attr]
    r = plan.reconcile(p, Observed(obs.device, down, obs.live_indexes), Ownership(True, True),
                       ifb=IFB, alias=ALIAS)  # fmt: skip
    assert kinds(r.actions) == [UpdateIfb]


def test_dropping_egress_on_a_second_add_removes_the_ifb() -> None:
    p = build()
    only_ingress = build(config.BandwidthConfig(ingress=BOTH.ingress))
    r = plan.reconcile(only_ingress, converged(p), Ownership(True, True), ifb=IFB, alias=ALIAS)
    assert kinds(r.actions) == [DeleteIngressQdisc, DeleteIfb]


# ---------------------------------------------------------------------------- CHECK


def test_check_of_converged_state_finds_nothing() -> None:
    p = build()
    assert plan.differences(p, converged(p)) == []


def test_check_names_a_changed_rate_and_a_missing_redirect() -> None:
    p = build()
    obs = converged(p)
    assert obs.device is not None and p.device_tbf is not None
    slower = Qdisc("tbf", TBF_HANDLE, TC_H_ROOT, TbfParams(1, 2, 3))
    device = DeviceState(HOST_VETH, (slower, obs.device.qdiscs[1]), ())
    found = plan.differences(p, Observed(device, obs.ifb, obs.live_indexes))
    text = " ".join(found)
    assert "rate is 8 bit/s, want 10000000" in text
    assert "no ingress filter redirects" in text


def test_check_names_a_missing_ifb() -> None:
    p = build()
    obs = converged(p)
    assert any(
        "ifb" in d and "missing" in d for d in plan.differences(p, Observed(obs.device, None))
    )


def test_every_action_says_in_words_what_failed() -> None:
    """A failed kernel change is reported by what it was meant to do, naming the devices
    (the error a user reads), never by the planner's class name."""
    tbf = build().ifb.tbf  # type: ignore[union-attr]
    actions = [
        CreateIfb("ifb0", 1500, "alias"),
        UpdateIfb("ifb0", 1500, "alias"),
        DeleteIfb("ifb0", 7),
        SetTbf("ifb0", tbf),
        SetTbf("", tbf),
        DeleteRootQdisc(),
        AddIngressQdisc(),
        DeleteIngressQdisc(),
        DeleteFilters(TC_H_INGRESS, 1, 3, "u32"),
        AddRedirect(TC_H_INGRESS, "ifb0"),
    ]
    said = [a.describe("veth9") for a in actions]
    assert said == [
        "creating the ifb ifb0",
        "updating the ifb ifb0",
        "deleting the ifb ifb0",
        "setting the rate limit (tbf) on ifb0",
        "setting the rate limit (tbf) on veth9",
        "deleting the root qdisc of veth9",
        "adding an ingress qdisc to veth9",
        "deleting the ingress qdisc of veth9",
        "deleting stale ingress filters of veth9",
        "redirecting the ingress of veth9 to the ifb ifb0",
    ]
    assert all(type(a).__name__ not in s for a, s in zip(actions, said, strict=True))

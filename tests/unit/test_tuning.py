"""tuning without a kernel: parsing, precedence, validation, plans, CHECK comparison, backups."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from common.config import decode, parse_netconf
from common.env import Invocation
from common.errors import INVALID_CONFIG, CniError
from common.identity import Attachment
from common.result import Result
from tuning import config
from tuning.apply import check_link_fits, resolve_sysctl
from tuning.backup import Backup, BackupStore, originals
from tuning.config import LinkSettings, TuningConf, parse, parse_mac
from tuning.plan import (
    LinkState,
    link_differences,
    make_plan,
    report,
    same_sysctl_value,
    sysctl_differences,
)

MAC_CONF, MAC_ENV, MAC_RC, MAC_ARGS = (
    "02:00:00:00:00:01",
    "02:00:00:00:00:02",
    "02:00:00:00:00:03",
    "02:00:00:00:00:04",
)


def tuning_conf(
    raw: dict[str, Any] | None = None,
    *,
    cni_args: dict[str, str] | None = None,
    environ: dict[str, str] | None = None,
) -> TuningConf:
    body = {"cniVersion": "1.0.0", "name": "net1", "type": "tuning", **(raw or {})}
    invocation = Invocation("ADD", "ctr1", "/run/netns/x", "eth0", cni_args=cni_args or {})
    return parse(parse_netconf(body), invocation, environ or {})


def refused(raw: dict[str, Any], **kw: Any) -> CniError:
    with pytest.raises(CniError) as info:
        tuning_conf(raw, **kw)
    assert info.value.code == INVALID_CONFIG
    return info.value


# ---------------------------------------------------------------------------- sources


def test_every_option_from_the_config() -> None:
    conf = tuning_conf(
        {
            "mac": "02:AA:bb:cc:dd:ee",
            "mtu": 1400,
            "promisc": True,
            "allmulti": False,
            "txQLen": 50,
            "sysctl": {"net.core.somaxconn": "512"},
        }
    )
    assert conf.link.mac == "02:aa:bb:cc:dd:ee"
    assert (conf.link.mtu, conf.link.promisc, conf.link.allmulti, conf.link.tx_qlen) == (
        1400,
        True,
        False,
        50,
    )
    assert [(s.key, s.value) for s in conf.sysctls] == [("net.core.somaxconn", "512")]


def test_every_option_from_args_cni_overrides_the_config() -> None:
    conf = tuning_conf(
        {
            "mtu": 1400,
            "promisc": True,
            "allmulti": True,
            "txQLen": 50,
            "sysctl": {"net.core.somaxconn": "512", "net.ipv4.ip_unprivileged_port_start": "80"},
            "args": {
                "cni": {
                    "mac": MAC_ARGS,
                    "mtu": 1300,
                    "promisc": False,
                    "allmulti": False,
                    "txQLen": 0,
                    "sysctl": {"net/core/somaxconn": "1024"},
                }
            },
        }
    )
    assert conf.link.mac == MAC_ARGS
    assert (conf.link.mtu, conf.link.promisc, conf.link.allmulti, conf.link.tx_qlen) == (
        1300,
        False,
        False,
        0,
    )
    # the slash spelling names the same setting, so it replaces the config's value
    assert {s.components: s.value for s in conf.sysctls} == {
        ("net", "core", "somaxconn"): "1024",
        ("net", "ipv4", "ip_unprivileged_port_start"): "80",
    }


def test_keys_are_read_case_insensitively_like_go() -> None:
    conf = tuning_conf({"MTU": 1400, "Promisc": True, "TxQLen": 7, "SysCtl": {"net.a.b": "1"}})
    assert (conf.link.mtu, conf.link.promisc, conf.link.tx_qlen) == (1400, True, 7)
    assert len(conf.sysctls) == 1


@pytest.mark.parametrize(
    ("sources", "winner"),
    [
        ({"conf"}, MAC_CONF),
        ({"conf", "env"}, MAC_ENV),
        ({"conf", "env", "rc"}, MAC_RC),
        ({"conf", "env", "rc", "args"}, MAC_ARGS),
        ({"conf", "args"}, MAC_ARGS),
        ({"conf", "rc"}, MAC_RC),
        ({"env", "rc"}, MAC_RC),
        ({"env"}, MAC_ENV),
    ],
)
def test_mac_precedence_conf_then_cni_args_then_runtime_config_then_args_cni(
    sources: set[str], winner: str
) -> None:
    raw: dict[str, Any] = {}
    if "conf" in sources:
        raw["mac"] = MAC_CONF
    if "rc" in sources:
        raw["runtimeConfig"] = {"mac": MAC_RC}
    if "args" in sources:
        raw["args"] = {"cni": {"mac": MAC_ARGS}}
    cni_args = {"IgnoreUnknown": "1", "MAC": MAC_ENV} if "env" in sources else {}
    assert tuning_conf(raw, cni_args=cni_args).link.mac == winner


def test_empty_mac_in_a_higher_source_does_not_erase_a_lower_one() -> None:
    conf = tuning_conf({"mac": MAC_CONF, "runtimeConfig": {"mac": ""}}, cni_args={"MAC": ""})
    assert conf.link.mac == MAC_CONF


def test_nothing_configured_is_an_empty_plan() -> None:
    plan = make_plan(tuning_conf({"mtu": 0}), "eth0")
    assert plan.empty


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "mac",
    ["02:00:00:00:00", "02:00:00:00:00:0g", "hello", "02:00:00:00:00:00:00", "01:00:5e:00:00:01",
     "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00", "03-00-00-00-00-01"],
)  # fmt: skip
def test_bad_mac_is_error_7_naming_the_source(mac: str) -> None:
    for raw, cni_args, source in (
        ({"mac": mac}, {}, "mac"),
        ({"runtimeConfig": {"mac": mac}}, {}, "runtimeConfig.mac"),
        ({"args": {"cni": {"mac": mac}}}, {}, "args.cni.mac"),
        ({}, {"MAC": mac}, "CNI_ARGS MAC"),
    ):
        error = refused(raw, cni_args=cni_args)
        assert error.msg.startswith(source), error.msg


@pytest.mark.parametrize(
    ("text", "normal"),
    [("02:AB:cd:00:11:22", "02:ab:cd:00:11:22"), ("02-ab-cd-00-11-22", "02:ab:cd:00:11:22"),
     ("02ab.cd00.1122", "02:ab:cd:00:11:22")],
)  # fmt: skip
def test_mac_spellings_are_normalised(text: str, normal: str) -> None:
    assert parse_mac(text, "mac") == normal


@pytest.mark.parametrize("mtu", [67, 65536, -1, 100000])
def test_mtu_outside_68_to_65535_is_error_7(mtu: int) -> None:
    assert "between 68 and 65535" in refused({"mtu": mtu}).msg
    assert "between 68 and 65535" in refused({"args": {"cni": {"mtu": mtu}}}).msg


def test_negative_txqlen_is_error_7() -> None:
    assert "negative" in refused({"txQLen": -1}).msg


@pytest.mark.parametrize("value", ["1\n2", "1\n", "1\r"])
def test_sysctl_value_with_a_newline_is_error_7(value: str) -> None:
    assert "newline" in refused({"sysctl": {"net.core.somaxconn": value}}).msg


@pytest.mark.parametrize(
    ("raw", "words"),
    [({"mtu": "1400"}, "must be an integer"), ({"promisc": "yes"}, "must be a boolean"),
     ({"sysctl": {"net.core.somaxconn": True}}, "must be a string"),
     ({"sysctl": ["net.core.somaxconn"]}, "must be a JSON object")],
)  # fmt: skip
def test_wrong_types_are_error_7(raw: dict[str, Any], words: str) -> None:
    assert words in refused(raw).msg


def test_numeric_sysctl_value_is_accepted_as_its_text() -> None:
    assert tuning_conf({"sysctl": {"net.core.somaxconn": 512}}).sysctls[0].value == "512"


@pytest.mark.parametrize(
    "key",
    [
        "net/../kernel/hostname",
        "net.ipv4.conf.IFNAME/../../..",
        "net.ipv4.conf.IFNAME/../../../kernel/hostname",
        "net/ipv4/../../kernel/hostname",
        "/proc/sys/kernel/hostname",
        "/net/core/somaxconn",
        "kernel.hostname",
        "net..core.somaxconn",
        ".net.core.somaxconn",
        "net.core.somaxconn.",
        "net",
        "net/./core/somaxconn",
        "net.core.somaxconn rubbish",
        "net.core\x00.somaxconn",
        "",
    ],
)
def test_keys_that_could_leave_proc_sys_net_are_refused(key: str) -> None:
    refused({"sysctl": {key: "1"}})
    refused({"args": {"cni": {"sysctl": {key: "1"}}}})


def test_two_spellings_of_one_key_in_one_object_are_refused() -> None:
    assert (
        "same setting"
        in refused({"sysctl": {"net.core.somaxconn": "1", "net/core/somaxconn": "2"}}).msg
    )


def test_literally_duplicated_keys_are_refused() -> None:
    raw = decode(
        b'{"cniVersion": "1.0.0", "name": "n", "type": "tuning",'
        b' "sysctl": {"net.core.somaxconn": "1", "net.core.somaxconn": "2"},'
        b' "args": {"cni": {"sysctl": {"net.a.b": "1", "net.a.b": "1"}}}}'
    )
    assert refused(raw).msg == "sysctl key 'net.core.somaxconn' is given more than once"
    del raw["sysctl"]
    assert refused(raw).msg == "args.cni.sysctl key 'net.a.b' is given more than once"
    assert len(tuning_conf(decode(b'{"sysctl": {"net.a.b": "1", "net.a.c": "1"}}')).sysctls) == 2


def test_default_data_dir_follows_the_state_root_else_matches_go() -> None:
    assert tuning_conf().data_dir == "/run/cni/tuning"
    root = {"CNI_META_STATE_ROOT": "/tmp/x"}
    assert tuning_conf(environ=root).data_dir == "/tmp/x/tuning"
    assert tuning_conf({"dataDir": "/var/tun/"}, environ=root).data_dir == "/var/tun"
    assert "absolute" in refused({"dataDir": "relative/dir"}).msg


def test_allowlist_path_can_be_overridden_by_environment() -> None:
    assert tuning_conf().allowlist_path == "/etc/cni/tuning/allowlist.conf"
    env = {"CNI_TUNING_ALLOWLIST": "/tmp/allow.conf"}
    assert tuning_conf(environ=env).allowlist_path == "/tmp/allow.conf"


# ---------------------------------------------------------------------------- allowlist


def test_allowlist_patterns_match_the_whole_key() -> None:
    allow = config.parse_allowlist(
        "a", "# comment\n\n^net\\.core\\.somaxconn$\nnet.ipv4.conf.IFNAME.acc\n"
    )
    assert allow.permits("net.core.somaxconn")
    assert not allow.permits("net.core.somaxconn_x")
    # Go searches, so this pattern would allow the longer key there; here it does not
    assert not allow.permits("net.ipv4.conf.IFNAME.accept_redirects")
    assert allow.permits("net.ipv4.conf.IFNAME.acc")


def test_allowlist_prefix_patterns_written_for_go_allow_their_subtree() -> None:
    allow = config.parse_allowlist("a", "^net\\.ipv4\\.conf\\.\n^net\\.core\\.\n")
    assert allow.permits("net.ipv4.conf.eth0.rp_filter")
    assert allow.permits("net.ipv4.conf.IFNAME.accept_redirects")
    assert allow.permits("net.core.somaxconn")
    assert not allow.permits("net.ipv4.ip_forward")
    assert not allow.permits("net.ipv6.conf.eth0.accept_ra")
    assert not allow.permits("net.corex.somaxconn")


def test_allowlist_match_must_end_at_a_part_boundary() -> None:
    # Go's regexp.MatchString would allow the _evil key: the pattern occurs in it
    allow = config.parse_allowlist("a", "net\\.core\\.somaxconn\n^net\\.ipv4\\.conf\\.IFNAME\n")
    assert allow.permits("net.core.somaxconn")
    assert not allow.permits("net.core.somaxconn_evil")
    assert allow.permits("net.ipv4.conf.IFNAME.rp_filter")  # ends right before a "."
    assert not allow.permits("net.ipv4.conf.IFNAMEX.rp_filter")
    # an explicit $ still means the end of the key
    assert not config.parse_allowlist("a", "^net\\.core$").permits("net.core.somaxconn")


def test_allowlist_match_must_start_at_a_part_boundary() -> None:
    allow = config.parse_allowlist("a", "somaxconn\nipv4\\.conf\n")
    assert allow.permits("net.core.somaxconn")  # a whole part, as Go would too
    assert allow.permits("net.ipv4.conf.eth0.rp_filter")
    assert not allow.permits("net.core.xsomaxconn")
    assert not allow.permits("net.xipv4.conf.eth0.rp_filter")


def test_allowlist_keys_with_slashes_separate_only_at_slashes() -> None:
    # sysctl(8): in a key with "/", dots are literal (eth0.100 is one interface name)
    allow = config.parse_allowlist("a", "^net/ipv4/conf/eth0\n")
    assert allow.permits("net/ipv4/conf/eth0/rp_filter")
    assert not allow.permits("net/ipv4/conf/eth0.100/rp_filter")


# The cni-sysctl-allowlist that OpenShift's multus ships for tuning (unescaped dots)
GO_DEFAULT_ALLOWLIST = """\
^net.ipv4.conf.IFNAME.accept_redirects$
^net.ipv4.conf.IFNAME.accept_source_route$
^net.ipv4.conf.IFNAME.arp_accept$
^net.ipv4.conf.IFNAME.arp_notify$
^net.ipv4.conf.IFNAME.disable_policy$
^net.ipv4.conf.IFNAME.secure_redirects$
^net.ipv4.conf.IFNAME.send_redirects$
^net.ipv6.conf.IFNAME.accept_ra$
^net.ipv6.conf.IFNAME.accept_redirects$
^net.ipv6.conf.IFNAME.accept_source_route$
^net.ipv6.conf.IFNAME.arp_accept$
^net.ipv6.conf.IFNAME.arp_notify$
^net.ipv6.neigh.IFNAME.base_reachable_time_ms$
^net.ipv6.neigh.IFNAME.retrans_time_ms$
"""


def test_allowlist_of_go_deployments_means_the_same_here() -> None:
    allow = config.parse_allowlist("a", GO_DEFAULT_ALLOWLIST)
    for line in GO_DEFAULT_ALLOWLIST.split():
        assert allow.permits(line.strip("^$")), line
    assert not allow.permits("net.ipv4.conf.IFNAME.rp_filter")
    assert not allow.permits("net.ipv4.conf.IFNAME.accept_redirects_x")
    assert not allow.permits("net.ipv6.conf.all.accept_ra")
    assert not allow.permits("net.core.somaxconn")


def test_allowlist_leading_inline_flags_are_kept() -> None:
    allow = config.parse_allowlist("a", "(?i)^NET\\.CORE\\.SOMAXCONN$")
    assert allow.permits("net.core.somaxconn")
    assert not allow.permits("net.core.somaxconn_x")


def test_allowlist_refusal_names_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "allow.conf"
    path.write_text("net\\.core\\..*\n")
    allow = config.load_allowlist(str(path))
    config.refuse_unlisted(allow, ["net.core.somaxconn"])
    with pytest.raises(CniError) as info:
        config.refuse_unlisted(allow, ["net.core.somaxconn", "net.ipv4.ip_forward"])
    assert info.value.code == INVALID_CONFIG
    assert "net.ipv4.ip_forward" in info.value.msg and str(path) in info.value.msg
    assert "net\\.core\\..*" in info.value.details  # the line as written


def test_missing_allowlist_allows_everything_and_a_broken_one_is_an_error(tmp_path: Path) -> None:
    assert config.load_allowlist(str(tmp_path / "none.conf")) is None
    config.refuse_unlisted(None, ["net.anything"])
    bad = tmp_path / "bad.conf"
    bad.write_text("net\\.core\\.(\n")
    with pytest.raises(CniError) as info:
        config.load_allowlist(str(bad))
    assert "line 1" in info.value.msg


# ---------------------------------------------------------------------------- plan


def test_ifname_replaces_whole_components_only() -> None:
    conf = tuning_conf(
        {
            "sysctl": {
                "net.ipv4.conf.IFNAME.accept_redirects": "0",
                "net.ipv6.conf.IFNAMEx.disable_ipv6": "1",
                "net/ipv4/conf/eth0.100/rp_filter": "2",
            }
        }
    )
    paths = [w.path for w in make_plan(conf, "eth0.7").sysctls]
    assert paths == [
        "net/ipv4/conf/eth0.7/accept_redirects",
        "net/ipv6/conf/IFNAMEx/disable_ipv6",
        "net/ipv4/conf/eth0.100/rp_filter",
    ]


@pytest.mark.parametrize(
    ("wanted", "live", "same"),
    [("1024 65000", "1024\t65000", True), ("1024  65000", "1024\t65000", True),
     ("1024 65001", "1024\t65000", False), ("0500", "500", True), ("1", "1 2", False),
     ("cubic", "cubic", True), ("reno", "cubic", False)],
)  # fmt: skip
def test_sysctls_compare_as_the_kernel_prints_them(wanted: str, live: str, same: bool) -> None:
    assert same_sysctl_value(wanted, live) is same


LIVE = LinkState(index=2, mac="02:aa:bb:cc:dd:ee", mtu=1500, promisc=False, allmulti=True,
                 tx_qlen=1000, min_mtu=68, max_mtu=9000)  # fmt: skip


def test_check_compares_mac_case_insensitively_and_promisc_false() -> None:
    conf = tuning_conf({"mac": "02:AA:BB:CC:DD:EE", "promisc": False, "allmulti": True})
    assert link_differences("eth0", conf.link, LIVE) == []
    conf = tuning_conf({"promisc": True, "allmulti": False, "mtu": 1400, "txQLen": 5})
    problems = link_differences("eth0", conf.link, LIVE)
    assert len(problems) == 4
    assert "eth0 promiscuous mode is off, configured on" in problems


def test_check_reports_missing_and_different_sysctls() -> None:
    plan = make_plan(tuning_conf({"sysctl": {"net.a.b": "1", "net.c.d": "2"}}), "eth0")
    problems = sysctl_differences(plan, {"net/a/b": "3"})
    assert len(problems) == 2 and "does not exist" in problems[0] + problems[1]
    assert sysctl_differences(plan, {"net/a/b": "1", "net/c/d": "2\n"}) == []


def test_mtu_above_the_device_maximum_is_error_7() -> None:
    conf = tuning_conf({"mtu": 9001})
    with pytest.raises(CniError) as info:
        check_link_fits("eth0", conf.link, LIVE)
    assert info.value.code == INVALID_CONFIG and "9000" in info.value.msg
    check_link_fits("eth0", tuning_conf({"mtu": 9000}).link, LIVE)


def test_report_sets_the_new_mac_on_the_container_interface_only() -> None:
    prev = Result.from_json(
        {
            "interfaces": [
                {"name": "eth0", "mac": "aa:aa:aa:aa:aa:aa"},
                {"name": "eth0", "mac": "bb:bb:bb:bb:bb:bb", "sandbox": "/run/netns/c"},
            ]
        },
        "1.1.0",
    )
    plan = make_plan(tuning_conf({"mac": MAC_CONF, "mtu": 1400}), "eth0")
    out = report(prev, plan).to_json("1.1.0")
    assert out["interfaces"][0] == {"name": "eth0", "mac": "aa:aa:aa:aa:aa:aa"}
    assert out["interfaces"][1]["mac"] == MAC_CONF and out["interfaces"][1]["mtu"] == 1400


# ---------------------------------------------------------------------------- paths and backups


def test_a_symlink_out_of_net_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "net" / "core").mkdir(parents=True)
    (root / "kernel").mkdir()
    (root / "net" / "core" / "somaxconn").write_text("4096\n")
    (root / "kernel" / "hostname").write_text("box\n")
    os.symlink(root / "kernel", root / "net" / "evil")
    assert resolve_sysctl("net/core/somaxconn", str(root)).endswith("/net/core/somaxconn")
    for path in ("net/evil/hostname", "net/../kernel/hostname", "/net/core/somaxconn", "kernel"):
        with pytest.raises(CniError) as info:
            resolve_sysctl(path, str(root))
        assert info.value.code == INVALID_CONFIG


def test_second_add_keeps_the_first_originals() -> None:
    conf = tuning_conf({"mtu": 1400, "sysctl": {"net.a.b": "1"}})
    first = originals(make_plan(conf, "eth0"), LIVE, {"net/a/b": "0"})
    changed = LIVE.replace(mtu=1400)
    conf2 = tuning_conf({"mtu": 1300, "mac": MAC_CONF, "sysctl": {"net.a.b": "1", "net.c.d": "5"}})
    second = originals(make_plan(conf2, "eth0"), changed, {"net/a/b": "1", "net/c/d": "4"})
    merged = second.keeping_older(first)
    assert merged.link.mtu == 1500 and merged.link.mac == LIVE.mac
    assert merged.sysctls == (("net/a/b", "0"), ("net/c/d", "4"))


def test_backup_reads_go_files_and_round_trips() -> None:
    go = Backup.from_json({"mac": "de:f4:35:77:6e:93", "promisc": False, "mtu": 1500})
    assert go == Backup(link=LinkSettings(mac="de:f4:35:77:6e:93", promisc=False, mtu=1500))
    ours = Backup(
        "n", "", "eth0", link=LinkSettings(mtu=1500, tx_qlen=0), sysctls=(("net/a/b", "1"),)
    )
    assert Backup.from_json(json.loads(json.dumps(ours.to_json()))) == ours
    assert Backup.from_json({"mtu": "x", "sysctls": [1, {"path": 2}]}) == Backup()
    assert Backup.from_json({"sysctls": 5}) == Backup()  # not a list: dropped, DEL goes on


def test_backup_keeps_gos_keys_at_the_top() -> None:
    backup = Backup("n", "c", "eth0", True, LinkSettings(mac=MAC_CONF, tx_qlen=5),
                    (("net/a/b", "1"),))  # fmt: skip
    assert backup.to_json() == {
        "mac": MAC_CONF, "txQLen": 5, "sysctls": [{"path": "net/a/b", "value": "1"}],
        "network": "n", "containerID": "c", "ifname": "eth0", "committed": True,
    }  # fmt: skip


def test_gc_picks_only_this_networks_stale_files(tmp_path: Path) -> None:
    store = BackupStore(str(tmp_path))
    for cid, net in (("alive", "n1"), ("dead", "n1"), ("other", "n2")):
        backup = Backup(net, cid, "eth0", link=LinkSettings(mtu=1500))
        store.save(backup.attachment, backup)
    (tmp_path / "gofile_eth0.json").write_text('{"mtu": 1500}')
    before = store.stamps()
    stale, in_flight = store.sweep("n1", {Attachment("n1", "alive", "eth0")}, before)
    assert [store.file_of(b.attachment) for b in stale] == ["dead_eth0.json"] and in_flight == []
    assert oct((tmp_path / "dead_eth0.json").stat().st_mode & 0o777) == "0o600"

"""Unit tests of common/ that need no root: env, JSON reading, config, state, chain flags."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cnichain import api
from cnichain import runner as chain
from common import jsontext
from common.config import decode, parse_netconf
from common.env import parse_cni_args, read_invocation
from common.errors import CniError
from common.gc import valid_attachments
from common.identity import Attachment
from common.jsonobj import JsonObject, integer
from common.records import Key, Record
from common.statedir import StateDir
from common.store import AttachmentStore
from common.values import OrderedValue, Value, field


def code_of(fn, *args, **kw) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(CniError) as e:
        fn(*args, **kw)
    return e.value.code


def test_cni_args_parsing_keeps_values_with_equals() -> None:
    assert parse_cni_args("IgnoreUnknown=1;K8S_POD_NAME=web;X=a=b;") == {
        "IgnoreUnknown": "1",
        "K8S_POD_NAME": "web",
        "X": "a=b",
    }


def test_version_needs_only_the_command() -> None:
    assert read_invocation({"CNI_COMMAND": "VERSION"}).command == "VERSION"


def test_del_without_netns_is_fine() -> None:
    inv = read_invocation(
        {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c", "CNI_IFNAME": "eth0", "CNI_PATH": "/a:/b"}
    )
    assert inv.netns == "" and inv.path == ("/a", "/b")


def test_del_with_vanished_netns_is_fine() -> None:
    env = {
        "CNI_COMMAND": "DEL",
        "CNI_CONTAINERID": "c",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/x",
        "CNI_NETNS": "/run/netns/cmpt-gone-forever",
    }
    assert read_invocation(env).netns.endswith("gone-forever")


def test_json_keys_are_case_insensitive_and_last_duplicate_wins_like_go() -> None:
    obj = JsonObject({"HostPort": 1, "hostport": 2, "Protocol": "TCP"}, "m")
    assert obj.integer("hostPort") == 2
    assert JsonObject({"hostport": 2, "HostPort": 1}).integer("hostPort") == 1
    assert obj.string("protocol") == "TCP"


def test_json_types_are_strict_and_errors_name_the_path() -> None:
    obj = JsonObject({"port": True, "n": "80", "big": 70000}, "runtimeConfig.portMappings[3]")
    with pytest.raises(CniError) as e:
        obj.integer("port")
    assert e.value.code == 7 and "runtimeConfig.portMappings[3].port" in e.value.msg
    assert code_of(obj.integer, "n") == 7
    with pytest.raises(CniError) as e:
        obj.integer("big", maximum=65535)
    assert "at most 65535" in e.value.msg


def test_jsontext_decodes_as_json_does_and_names_a_repeated_key() -> None:
    import json

    text = b'{"a": [1, 2.5, "\\u00e9", null, true], "b": {"c": {}}, "d": -1e3, "e": NaN}'
    assert repr(jsontext.loads(text)) == repr(json.loads(text))
    obj = jsontext.loads('{"x": 1, "y": {"k": 1, "j": 2, "j": 3, "k": 4}, "x": 2}')
    assert obj == {"x": 2, "y": {"k": 4, "j": 3}} and list(obj["y"]) == ["k", "j"]
    assert (obj.repeated, obj["y"].repeated) == ("x", "j")
    assert type(jsontext.loads('{"x": {"y": 1}}')["x"]) is dict


def test_null_counts_as_absent() -> None:
    assert JsonObject({"x": None}).integer("x", 5) == 5


def test_missing_version_means_0_1_0() -> None:
    assert parse_netconf({"name": "n"}).cni_version == "0.1.0"


def test_decode_errors_are_code_6() -> None:
    assert code_of(decode, b"{") == 6
    assert code_of(decode, b"null") == 6


def test_netconf_exposes_runtime_config_and_args_cni() -> None:
    conf = parse_netconf(
        {
            "cniVersion": "1.0.0",
            "name": "n",
            "RuntimeConfig": {"portMappings": []},
            "args": {"cni": {"mac": "x"}},
        }
    )
    assert conf.runtime_config.array("portMappings") == []
    assert conf.cni_args_object.string("mac") == "x"


def test_valid_attachments_parse_and_legacy_key() -> None:
    body = JsonObject({"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}]})
    assert valid_attachments("n", body) == {Attachment("n", "a", "eth0")}
    legacy = JsonObject({"cni.dev/attachments": [{"containerID": "b", "ifname": "net1"}]})
    assert valid_attachments("n", legacy) == {Attachment("n", "b", "net1")}
    assert valid_attachments("n", JsonObject({})) == set()
    assert (
        code_of(
            valid_attachments,
            "n",
            JsonObject({"cni.dev/valid-attachments": [{"containerID": "a"}]}),
        )
        == 7
    )


def test_state_files_are_private_and_atomic(tmp_path: Path) -> None:
    sd = StateDir(str(tmp_path / "plugin"))
    sd.write_json("a.json", {"x": 1})
    assert sd.read_bytes("a.json") == b'{"x": 1}'
    assert stat.S_IMODE(os.stat(sd.directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(sd.path("a.json")).st_mode) == 0o600
    assert [n for n in os.listdir(sd.directory) if ".tmp." in n] == []
    sd.remove("a.json")
    sd.remove("a.json")  # removing twice is fine
    assert sd.read_bytes("a.json") is None


def test_holds_other_than_looks_for_another_record_only(tmp_path: Path) -> None:
    sd = StateDir(str(tmp_path / "plugin"))
    assert not sd.holds_other_than("a.json")  # no directory yet
    sd.write_json("a.json", {})
    with sd.lock():
        pass  # the lock file is no record
    assert not sd.holds_other_than("a.json")
    sd.write_json("b.json", {})
    assert sd.holds_other_than("a.json")
    assert sd.holds_other_than("c.json")


class Entry(Record):
    """A record type as small as one gets: the owner and one number."""

    n: int = 0
    KEYS = {"n": Key("n", integer(0, 99), required=True)}

    @staticmethod
    def file_name(attachment: Attachment) -> str:
        return f"{attachment.network}-{attachment.container_id}-{attachment.ifname}.json"


def test_attachment_store_round_trips_an_entry_under_its_codecs_name(tmp_path: Path) -> None:
    store = AttachmentStore(str(tmp_path / "p"), Entry)
    owner = Attachment("net", "c1", "eth0")
    assert store.load(owner) is None and not store.has(owner)
    store.save(owner, Entry("net", "c1", "eth0", n=7))
    assert os.listdir(store.directory) == ["net-c1-eth0.json"]
    assert store.has(owner) and store.load(owner) == Entry("net", "c1", "eth0", n=7)
    store.forget(owner)
    store.forget(owner)  # nothing left is fine
    assert store.load(owner) is None


def test_gc_sweep_splits_stale_from_in_flight_and_skips_the_rest(tmp_path: Path) -> None:
    store = AttachmentStore(str(tmp_path / "p"), Entry)
    for cid in ("valid", "stale", "rewritten"):
        store.save(Attachment("net", cid, "eth0"), Entry("net", cid, "eth0"))
    store.save(Attachment("other", "x", "eth0"), Entry("other", "x", "eth0"))  # another network
    store.write_json("misnamed.json", Entry("net", "m", "eth0").to_json())  # not its name
    store.write_json("foreign.json", {"what": "not an entry"})
    before = store.stamps()  # GC starts; then two ADDs finish before it takes the lock
    store.save(Attachment("net", "rewritten", "eth0"), Entry("net", "rewritten", "eth0", n=1))
    store.save(Attachment("net", "new", "eth0"), Entry("net", "new", "eth0"))
    stale, in_flight = store.sweep("net", {Attachment("net", "valid", "eth0")}, before)
    assert [e.container_id for e in stale] == ["stale"]
    assert sorted(e.container_id for e in in_flight) == ["new", "rewritten"]


def test_lock_that_stays_taken_is_error_11(tmp_path: Path) -> None:
    sd = StateDir(str(tmp_path / "plugin"))
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        # flock locks belong to the open file description: a second open in this process
        # conflicts just like another process would.
        with sd.lock():
            held.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    start = time.monotonic()
    with pytest.raises(CniError) as e, sd.lock(timeout=0.2):
        pass
    assert e.value.code == 11
    assert time.monotonic() - start < 3
    release.set()
    t.join()
    with sd.lock(timeout=1):
        pass


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("8080:80", {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}),
        ("8053:53/UDP", {"hostPort": 8053, "containerPort": 53, "protocol": "udp"}),
        (
            "127.0.0.1:8080:80/tcp",
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "127.0.0.1"},
        ),
        (
            "[::1]:8080:80",
            {"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "::1"},
        ),
        (
            "9000-9002:9000",
            {"hostPort": 9000, "containerPort": 9000, "protocol": "tcp", "range": 3},
        ),
    ],
)
def test_chain_port_flag(spec: str, want: dict[str, object]) -> None:
    assert chain.parse_port(spec) == want


@pytest.mark.parametrize(
    ("text", "bits"), [("1500000", 1_500_000), ("800k", 800_000), ("10mbit", 10**7), ("1g", 10**9)]
)
def test_chain_rate_units(text: str, bits: int) -> None:
    assert chain.parse_rate(text) == bits


def test_chain_bandwidth_flag_fills_bursts() -> None:
    bw = chain.parse_bandwidth("ingressRate=10mbit,egressRate=1mbit,egressBurst=100k")
    assert bw == {
        "ingressRate": 10**7,
        "ingressBurst": 262144,
        "egressRate": 10**6,
        "egressBurst": 100_000,
    }
    with pytest.raises(chain.ChainError):
        chain.parse_bandwidth("sideways=1")


def test_chain_injects_runtime_config_only_for_declared_capabilities() -> None:
    cl = chain.ConfList.from_json({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "a"}]})
    rt = chain.Runtime("c", "/n", capability_args={"portMappings": [1], "mac": "m"})
    conf = chain.plugin_config(
        cl, {"type": "p", "capabilities": {"portMappings": True, "mac": False}}, rt, {"x": 1}
    )
    assert conf["runtimeConfig"] == {"portMappings": [1]}
    assert conf["name"] == "n" and conf["cniVersion"] == "1.0.0" and conf["prevResult"] == {"x": 1}


def test_chain_refuses_lists_without_plugins() -> None:
    with pytest.raises(chain.ChainError):
        chain.ConfList.from_json({"name": "n", "plugins": []})


@pytest.mark.parametrize(
    ("valid", "says"),
    [
        ("abc", "expected CONTAINERID/IFNAME, e.g. abc/eth0"),
        ("abc/", "invalid interface name '': it is empty"),
        ("a b/eth0", "invalid container ID 'a b'"),
    ],
)
def test_chain_gc_says_what_is_wrong_with_a_valid_entry(
    tmp_path: Path, valid: str, says: str
) -> None:
    conflist = tmp_path / "n.conflist"
    conflist.write_text('{"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "none"}]}')
    run = subprocess.run(
        [Path(sys.executable).parent / "cni-chain", "gc", str(conflist), "--valid", valid,
         "--cni-path", str(tmp_path), "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.startswith(f"cni-chain: --valid {valid!r}: ") and says in run.stderr
    assert "Traceback" not in run.stderr


class Pair(OrderedValue):
    name: str
    rank: int = 0


class Tagged(Pair):
    tag: str = ""

    def _fields(self) -> tuple[object, ...]:
        return (self.name, self.rank)  # the tag is not part of the value


def test_value_classes_get_slots_init_equality_and_order_from_their_fields() -> None:
    assert vars(Pair)["__slots__"] == ("name", "rank") and vars(Tagged)["__slots__"] == ("tag",)
    assert Pair("a") == Pair("a", 0) == Pair(rank=0, name="a") and Pair("a") != Pair("a", 1)
    assert hash(Pair("a", 1)) == hash(Pair("a", 1))
    assert sorted([Pair("b"), Pair("a", 2), Pair("a", 1)]) == [
        Pair("a", 1),
        Pair("a", 2),
        Pair("b"),
    ]
    assert repr(Tagged("x", 1, "t")) == "Tagged(name='x', rank=1, tag='t')"
    assert Tagged("x", 1, "t") == Tagged("x", 1, "u")
    with pytest.raises(AttributeError):
        Pair("a").other = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="missing field 'name'"):
        Pair()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown fields"):
        Pair("a", colour="red")  # type: ignore[call-arg]


class Bag(Value):
    name: str
    items: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)


def test_a_field_default_factory_makes_a_fresh_default_per_instance() -> None:
    one, two = Bag("one"), Bag("two")
    one.items.append("x")
    one.index["x"] = 1
    assert two.items == [] and two.index == {}
    assert Bag("b") == Bag("b", [], {}) and repr(Bag("b")) == "Bag(name='b', items=[], index={})"
    given = ["y"]
    assert Bag("c", given).items is given


def test_replace_copies_a_value_with_some_fields_changed() -> None:
    bag = Bag("a", ["x"])
    changed = bag.replace(name="b")
    assert changed == Bag("b", ["x"]) and type(changed) is Bag and bag == Bag("a", ["x"])
    assert Tagged("x", 1, "t").replace(tag="u").tag == "u"
    with pytest.raises(TypeError, match="unknown fields"):
        bag.replace(colour="red")


def test_chain_cache_write_replaces_a_planted_tmp_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    (cache_dir / "net-c1-eth0.tmp").symlink_to(victim)
    conflist = api.ConfList("net", "1.0.0", [{"type": "noop"}])
    rt = api.Runtime("c1", "/run/netns/x", {}, cache_dir=str(cache_dir))
    answer = {"cniVersion": "1.0.0", "ips": []}
    monkeypatch.setattr(api, "exec_plugin", lambda *_: answer)
    result = api.add(conflist, rt)
    assert result is not None and result["cniVersion"] == "1.0.0"
    assert victim.read_text() == "keep me"
    assert sorted(os.listdir(cache_dir)) == ["net-c1-eth0"]
    assert jsontext.loads((cache_dir / "net-c1-eth0").read_bytes())["result"] == result


# A plugin process run the way deploy/install.sh's launcher runs it, with an exit handler
# that leaves a mark: the interpreter's teardown runs such handlers, posix._exit does not.
EXIT_PROBE = """\
import sys, atexit
sys.path[:0] = {paths!r}
atexit.register(lambda: open({mark!r}, "w").close())
from {plugin}.__main__ import main
main()
"""


@pytest.mark.parametrize(
    ("command", "config", "status"),
    [
        ("VERSION", b'{"cniVersion": "1.0.0"}', 0),
        ("ADD", b"{not json", 1),  # an error answer: also flushed, with its status
    ],
)
def test_a_plugin_exits_once_its_answer_is_flushed_without_teardown(
    tmp_path: Path, command: str, config: bytes, status: int
) -> None:
    import sysconfig

    mark = tmp_path / "teardown-ran"
    repo = str(Path(__file__).resolve().parents[2])
    paths = [repo, sysconfig.get_paths()["purelib"]]
    probe = EXIT_PROBE.format(paths=paths, mark=str(mark), plugin="tuning")
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0",
           "CNI_NETNS": "/proc/self/ns/net", "CNI_PATH": "/usr/lib/cni"}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-IS", "-c", probe], input=config, env=env, capture_output=True
    )
    assert proc.returncode == status, proc.stderr
    answer = jsontext.loads(proc.stdout)
    assert ("code" in answer) == bool(status), answer  # the whole answer arrived
    assert not mark.exists()  # no teardown: atexit handlers (and the rest of it) skipped

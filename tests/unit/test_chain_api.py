"""cnichain's Python API without a kernel: list loading, the call sequence and the errors,
driven with small recorder plugins (scripts) in a temporary plugin dir."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cnichain import (
    ChainError,
    ConfList,
    Network,
    PluginError,
    default_plugin_path,
    load_conflist,
    plugin_call,
)

# Records each call, answers ADD with a result naming itself, fails when the conf says so.
PLUGIN = """#!{python}
import json, os, sys
conf = json.load(sys.stdin)
cmd = os.environ["CNI_COMMAND"]
with open(os.environ["RECORD_FILE"], "a") as f:
    f.write(json.dumps({{"cmd": cmd, "type": conf["type"], "conf": conf}}) + "\\n")
fail = conf.get("failOn")
if fail == cmd:
    print(json.dumps({{"cniVersion": conf["cniVersion"], "code": 11, "msg": "told to fail",
                       "details": "failOn=" + cmd}}))
    sys.exit(1)
if fail == "garbage-" + cmd:
    sys.stderr.write("panic: something\\n")
    sys.exit(2)
if cmd == "ADD":
    prev = conf.get("prevResult") or {{"cniVersion": conf["cniVersion"], "interfaces": [],
        "ips": [{{"address": "10.1.0.2/24"}}, {{"address": "fd00::2/64"}}]}}
    prev["interfaces"] = prev.get("interfaces", []) + [{{"name": conf["type"]}}]
    print(json.dumps(prev))
"""


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("first", "second"):
        exe = d / name
        exe.write_text(PLUGIN.format(python=sys.executable))
        exe.chmod(0o755)
    monkeypatch.setenv("RECORD_FILE", str(tmp_path / "calls.jsonl"))
    return d


def calls(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def two(**second: Any) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "unit",
        "plugins": [
            {"type": "first", "capabilities": {"portMappings": True}},
            {"type": "second", **second},
        ],
    }


def net(bindir: Path, tmp_path: Path, raw: dict[str, Any]) -> Network:
    return Network(raw, [bindir], cache_dir=tmp_path / "cache")


def test_add_chains_results_and_del_runs_in_reverse_with_the_cache(
    bindir: Path, tmp_path: Path
) -> None:
    n = net(bindir, tmp_path, two())
    ports = [{"hostPort": 1, "containerPort": 2, "protocol": "tcp"}]
    result = n.add("c1", "/run/netns/x", capability_args={"portMappings": ports})
    assert [i["name"] for i in result["interfaces"]] == ["first", "second"]
    n.check("c1", "/run/netns/x")
    n.delete("c1", "/run/netns/x")
    seen = calls(tmp_path)
    assert [(c["cmd"], c["type"]) for c in seen] == [
        ("ADD", "first"), ("ADD", "second"), ("CHECK", "first"), ("CHECK", "second"),
        ("DEL", "second"), ("DEL", "first"),
    ]  # fmt: skip
    assert seen[0]["conf"]["runtimeConfig"] == {"portMappings": ports}
    assert "runtimeConfig" not in seen[1]["conf"]  # it declares no capability
    assert seen[1]["conf"]["prevResult"]["interfaces"] == [{"name": "first"}]
    # DEL: the cached result, and ADD's capability args though this call gave none
    assert seen[4]["conf"]["prevResult"] == result
    assert seen[5]["conf"]["runtimeConfig"] == {"portMappings": ports}
    assert os.listdir(tmp_path / "cache") == []


def test_plugin_error_carries_the_cni_error_and_the_plugin(bindir: Path, tmp_path: Path) -> None:
    n = net(bindir, tmp_path, two(failOn="ADD"))
    with pytest.raises(PluginError) as caught:
        n.add("c1", "/run/netns/x")
    e = caught.value
    assert (e.command, e.plugin, e.index) == ("ADD", "second", 1)
    assert (e.code, e.msg, e.details, e.exit_code) == (11, "told to fail", "failOn=ADD", 1)
    assert str(e) == "ADD failed at plugin #2 'second': [11] told to fail: failOn=ADD"
    assert isinstance(e, ChainError)


def test_a_plugin_without_cni_error_json_gives_its_stderr(bindir: Path, tmp_path: Path) -> None:
    n = net(bindir, tmp_path, two(failOn="garbage-ADD"))
    with pytest.raises(PluginError) as caught:
        n.add("c1", "/run/netns/x")
    assert caught.value.code is None
    assert caught.value.exit_code == 2
    assert caught.value.msg == "panic: something"


def test_attach_dels_when_the_body_raises(bindir: Path, tmp_path: Path) -> None:
    n = net(bindir, tmp_path, two())
    with pytest.raises(KeyError), n.attach("c1", "/run/netns/x") as att:
        assert att.addresses(4) == ["10.1.0.2"]
        assert att.addresses(6) == ["fd00::2"]
        raise KeyError("boom")
    assert [c["cmd"] for c in calls(tmp_path)] == ["ADD", "ADD", "DEL", "DEL"]


def test_attach_dels_when_add_fails_half_way(bindir: Path, tmp_path: Path) -> None:
    n = net(bindir, tmp_path, two(failOn="ADD"))
    with pytest.raises(PluginError), n.attach("c1", "/run/netns/x"):
        pytest.fail("the body must not run")
    assert [c["cmd"] for c in calls(tmp_path)] == ["ADD", "ADD", "DEL", "DEL"]


def test_a_failing_del_after_the_body_raised_is_a_note(bindir: Path, tmp_path: Path) -> None:
    n = net(bindir, tmp_path, two(failOn="DEL"))
    with pytest.raises(KeyError) as caught, n.attach("c1", "/run/netns/x"):
        raise KeyError("boom")
    assert any("DEL failed at plugin #2" in note for note in caught.value.__notes__)


def test_gc_and_status_need_1_1_0(bindir: Path, tmp_path: Path) -> None:
    with pytest.raises(ChainError, match=r"needs cniVersion 1\.1\.0"):
        net(bindir, tmp_path, two()).status()
    n = net(bindir, tmp_path, {**two(), "cniVersion": "1.1.0"})
    n.add("c1", "/run/netns/x")
    n.gc()
    n.gc([("c9", "eth1")])
    n.status()
    gcs = [c["conf"] for c in calls(tmp_path) if c["cmd"] == "GC"]
    assert [g["cni.dev/valid-attachments"] for g in gcs] == [
        [{"containerID": "c1", "ifname": "eth0"}],
        [{"containerID": "c1", "ifname": "eth0"}],
        [{"containerID": "c9", "ifname": "eth1"}],
        [{"containerID": "c9", "ifname": "eth1"}],
    ]


def test_missing_plugin_is_a_chain_error(tmp_path: Path) -> None:
    n = Network(two(), [tmp_path], cache_dir=tmp_path / "cache")
    with pytest.raises(ChainError, match="failed to find plugin 'first'"):
        n.add("c1", "/run/netns/x")


# Prints what it was given and exits with the status the environment asks for.
ECHO_PLUGIN = """#!{python}
import json, os, sys
data = sys.stdin.buffer.read()
keys = ("COMMAND", "CONTAINERID", "NETNS", "IFNAME", "ARGS", "PATH")
env = {{k: os.environ[k] for k in ["CNI_" + k for k in keys] + ["EXTRA"] if k in os.environ}}
print(json.dumps({{"env": env, "stdin": data.decode("latin-1")}}))
sys.stderr.write("said on stderr\\n")
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def test_plugin_call_is_one_call_as_the_chain_makes_it_run_raw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = tmp_path / "echo"
    exe.write_text(ECHO_PLUGIN.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("CNI_IFNAME", "from-the-caller")  # the arguments win over these
    call = plugin_call(
        "echo", "DEL", b"\xff not json", container_id="c1", netns="/run/netns/x",
        cni_args="A=1", cni_path=f"/nonexistent:{tmp_path}", env={"EXTRA": "yes", "EXIT": "3"},
    )  # fmt: skip
    assert call.argv == [str(exe)]  # no host: the caller's namespace
    proc = call.run()
    assert proc.returncode == 3  # a failing plugin raises nothing: its status, as it is
    assert proc.stderr == b"said on stderr\n"
    seen = json.loads(proc.stdout)
    assert seen["stdin"] == "\xff not json"  # bytes are sent as they are
    assert seen["env"] == {
        "CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x",
        "CNI_IFNAME": "eth0", "CNI_ARGS": "A=1", "CNI_PATH": f"/nonexistent:{tmp_path}",
        "EXTRA": "yes",
    }  # fmt: skip
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "echo"}
    hosted = plugin_call(exe, "ADD", conf, host="somehost")
    assert hosted.argv == ["ip", "netns", "exec", "somehost", str(exe)]
    assert json.loads(hosted.stdin) == conf
    with pytest.raises(ChainError, match="failed to find plugin 'echo'"):
        plugin_call("echo", "ADD", conf, cni_path="/nonexistent")


# ---------------------------------------------------------------------------- loading


def test_load_by_name_prefers_conflists_then_conf_and_json(tmp_path: Path) -> None:
    (tmp_path / "20-b.conflist").write_text(json.dumps(two()))
    (tmp_path / "10-a.conf").write_text(json.dumps({"name": "unit", "type": "x"}))
    assert [p["type"] for p in load_conflist("unit", str(tmp_path)).plugins] == [
        "first",
        "second",
    ]
    single = {"cniVersion": "0.4.0", "name": "solo", "type": "bridge", "bridge": "br0"}
    (tmp_path / "30-solo.json").write_text(json.dumps(single))
    solo = load_conflist("solo", str(tmp_path))
    assert (solo.name, solo.cni_version, solo.plugins) == ("solo", "0.4.0", [single])
    with pytest.raises(ChainError, match="no conflist named 'none'"):
        load_conflist("none", str(tmp_path))


def test_load_from_dict_and_path(tmp_path: Path) -> None:
    path = tmp_path / "x.conflist"
    path.write_text(json.dumps(two()))
    assert load_conflist(path) == load_conflist(two()) == ConfList.from_json(two())
    with pytest.raises(ChainError, match="has no 'plugins'"):
        load_conflist({"name": "x"})


def test_default_plugin_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CNI_PATH", "/a:/b")
    assert default_plugin_path() == ["/a", "/b"]
    monkeypatch.delenv("CNI_PATH")
    path = default_plugin_path()
    assert path[0] == os.path.dirname(sys.executable) or path[0].endswith("bin")
    assert path[-1] == "/usr/lib/cni"

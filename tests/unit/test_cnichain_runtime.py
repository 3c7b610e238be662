"""cnichain as a runtime: it imports no plugin and not `common`, refuses the names libcni
refuses before exec'ing anything or writing its cache, re-marshals results as libcni does,
its two faces (the API and `cni-chain`) default to the same plugin path and container ID,
and a ChainLab binds a list to its own namespaces, dirs and environment."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cnichain import ChainError, ChainLab, Network, default_plugin_path
from cnichain.api import derived_container_id, retyped
from cnichain.netns import Netns
from cnichain.runner import build_parser, runtime_from_args

# Touches MARKER when run: proves whether cnichain exec'd anything.
PLUGIN = """#!{python}
import json, os, sys
open(os.environ["MARKER"], "a").close()
conf = json.load(sys.stdin)
if os.environ["CNI_COMMAND"] == "ADD":
    print(json.dumps({{"cniVersion": conf["cniVersion"], "ips": [{{"address": "10.1.0.2/24"}}]}}))
"""


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "marker"
    exe.write_text(PLUGIN.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("MARKER", str(tmp_path / "ran"))
    return d


def conflist(name: str = "net") -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "marker"}]}


def files_below(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_importing_cnichain_loads_no_plugin_and_not_common() -> None:
    code = textwrap.dedent("""
        import sys
        import cnichain, cnichain.api, cnichain.lab, cnichain.netns, cnichain.runner
        import cnichain.pytest_plugin, cnichain.spec
        print(sorted({m.split(".")[0] for m in sys.modules}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout.replace("'", '"')))
    assert not loaded & {"common", "portmap", "bandwidth", "tuning"}


@pytest.mark.parametrize(
    ("name", "cid", "ifname", "says"),
    [
        ("../../escaped/PWNED", "c1", "eth0", "invalid network name"),
        ("net", "../../escaped/PWNED", "eth0", "invalid container ID"),
        ("net", "c1", "..", "invalid interface name"),
        ("net", "c1", "a/b", "invalid interface name"),
        ("net", "", "eth0", "missing container ID"),
    ],
)
def test_api_refuses_what_libcni_refuses_before_exec_or_write(
    bindir: Path, tmp_path: Path, name: str, cid: str, ifname: str, says: str
) -> None:
    # The cache dir two levels below tmp_path: "../../escaped" would land in tmp_path.
    cache = tmp_path / "cache" / "cni"
    (tmp_path / "escaped").mkdir()
    net = Network(conflist(name), [bindir], cache_dir=cache)
    for call in (
        lambda: net.add(cid, "/run/netns/nowhere", ifname),
        lambda: net.check(cid, "/run/netns/nowhere", ifname),
        lambda: net.delete(cid, "/run/netns/nowhere", ifname),
    ):
        with pytest.raises(ChainError, match=says):
            call()
    assert not (tmp_path / "ran").exists(), "a plugin ran"
    assert files_below(tmp_path) == ["bin/marker"]


def test_api_gc_refuses_a_bad_valid_attachment(bindir: Path, tmp_path: Path) -> None:
    raw = {**conflist(), "cniVersion": "1.1.0"}
    net = Network(raw, [bindir], cache_dir=tmp_path / "cache")
    with pytest.raises(ChainError, match="invalid interface name"):
        net.gc([("c1", "../x")])
    assert not (tmp_path / "ran").exists()


def test_a_valid_attachment_is_cached_inside_the_cache_dir(bindir: Path, tmp_path: Path) -> None:
    net = Network(conflist("my-net.1"), [bindir], cache_dir=tmp_path / "cache")
    net.add("ctr_1.a-b", "/run/netns/nowhere", "eth0")
    assert files_below(tmp_path / "cache") == ["my-net.1-ctr_1.a-b-eth0"]


def test_attach_adds_at_once_and_a_with_block_dels(bindir: Path, tmp_path: Path) -> None:
    net = Network(conflist(), [bindir], cache_dir=tmp_path / "cache")
    att = net.attach("c1", "/run/netns/nowhere")
    assert att.result["ips"] == [{"address": "10.1.0.2/24"}]
    assert files_below(tmp_path / "cache") == ["net-c1-eth0"]
    with att:
        pass
    assert files_below(tmp_path / "cache") == []
    with net.attach("c2", "/run/netns/nowhere") as att2:
        assert att2.container_id == "c2"
        assert files_below(tmp_path / "cache") == ["net-c2-eth0"]
    assert files_below(tmp_path / "cache") == []


def test_cni_chain_and_the_api_default_to_the_same_plugin_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CNI_PATH", raising=False)
    path = build_parser().parse_args(["add", "demo.conflist", "ctr1"]).cni_path
    assert path.split(os.pathsep) == default_plugin_path()
    # This package's plugins come first: the venv's own portmap, not Go's.
    first = path.split(os.pathsep)[0]
    assert os.path.samefile(first, Path(sys.executable).parent)
    assert (Path(first) / "portmap").exists()
    monkeypatch.setenv("CNI_PATH", "/a:/b")
    assert build_parser().parse_args(["add", "x"]).cni_path == "/a:/b"


def test_cni_chain_version_names_the_package() -> None:
    cni_chain = Path(sys.executable).parent / "cni-chain"
    run = subprocess.run([cni_chain, "--version"], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().startswith("cni-chain 0.")


@pytest.mark.parametrize(
    ("result", "version", "want"),
    [
        # Go's types drop keys they do not have, leave out empty ones and always write dns.
        (
            {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24", "foo": 1}], "bar": {}},
            "1.0.0",
            {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24"}], "dns": {}},
        ),
        # 0.3.x-0.4.0 carry each address's family.
        (
            {"cniVersion": "0.4.0", "ips": [{"address": "fd00::2/64", "gateway": "fd00::1"}]},
            "0.4.0",
            {
                "cniVersion": "0.4.0",
                "ips": [{"version": "6", "address": "fd00::2/64", "gateway": "fd00::1"}],
                "dns": {},
            },
        ),
        # A legacy-shaped result is read as one.
        (
            {"cniVersion": "1.0.0", "ip4": {"ip": "10.1.0.2/24", "routes": [{"dst": "0.0.0.0/0"}]}},
            "1.0.0",
            {
                "cniVersion": "1.0.0",
                "ips": [{"address": "10.1.0.2/24"}],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dns": {},
            },
        ),
        # mtu is 1.1.0's; 1.0.0 has no such key.
        (
            {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mtu": 1400}]},
            "1.0.0",
            {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}], "dns": {}},
        ),
    ],
)
def test_results_are_re_marshalled_as_libcni_does(
    result: dict[str, Any], version: str, want: dict[str, Any]
) -> None:
    assert retyped(result, version) == want


@pytest.mark.parametrize(
    "result",
    [
        {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2"}]},
        {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24", "gateway": "x"}]},
        {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.2/24", "interface": 3}]},
        {"cniVersion": "1.0.0", "routes": [{"gw": "10.0.0.1"}]},
        {"cniVersion": "1.0.0", "interfaces": [{"name": 5}]},
    ],
)
def test_a_result_go_cannot_decode_is_a_chain_error(result: dict[str, Any]) -> None:
    with pytest.raises(ChainError, match=r"not valid 1\.0\.0"):
        retyped(result, "1.0.0")


def test_fixtures_skip_with_a_reason_when_not_root(tmp_path: Path) -> None:
    # euid faked in the session's own conftest: the plugin asks os.geteuid() at set-up.
    (tmp_path / "conftest.py").write_text("import os\nos.geteuid = lambda: 1000\n")
    (tmp_path / "test_user.py").write_text(
        "def test_uses_chain(cni_chain):\n    raise AssertionError('ran')\n"
        "def test_uses_netns(cni_netns):\n    raise AssertionError('ran')\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    assert "2 skipped" in run.stdout
    assert "fixtures need root" in run.stdout


# Writes each call's stdin to RECORD/<command>: what the plugin was sent.
RECORDER = """#!{python}
import json, os, sys
conf = sys.stdin.read()
with open(os.path.join(os.environ["RECORD"], os.environ["CNI_COMMAND"]), "w") as f:
    f.write(conf)
if os.environ["CNI_COMMAND"] == "ADD":
    print(json.dumps({{"cniVersion": "1.0.0", "ips": [{{"address": "10.1.0.2/24"}}]}}))
"""


def recorder(tmp_path: Path) -> Path:
    d = tmp_path / "rbin"
    d.mkdir()
    exe = d / "rec"
    exe.write_text(RECORDER.format(python=sys.executable))
    exe.chmod(0o755)
    return d


def test_check_sends_the_capability_args_it_is_given_else_adds(tmp_path: Path) -> None:
    record = tmp_path / "record"
    record.mkdir()
    raw = {"cniVersion": "1.0.0", "name": "net",
           "plugins": [{"type": "rec", "capabilities": {"mac": True}}]}  # fmt: skip
    net = Network(raw, [recorder(tmp_path)], cache_dir=tmp_path / "cache",
                  env={"RECORD": str(record)})  # fmt: skip
    net.add("c1", "/run/netns/nowhere", capability_args={"mac": "02:00:00:00:00:01"})
    net.check("c1", "/run/netns/nowhere")
    sent = json.loads((record / "CHECK").read_text())
    assert sent["runtimeConfig"] == {"mac": "02:00:00:00:00:01"}
    net.check("c1", "/run/netns/nowhere", capability_args={"mac": "02:00:00:00:00:02"})
    sent = json.loads((record / "CHECK").read_text())
    assert sent["runtimeConfig"] == {"mac": "02:00:00:00:00:02"}


def test_the_container_id_cni_chain_derives_is_the_apis() -> None:
    netns = "/run/netns/ctr1"
    expected = "cnichain-" + hashlib.sha512(netns.encode()).hexdigest()[:20]
    assert derived_container_id(netns) == expected
    for given in ("ctr1", netns):  # a name is taken as /run/netns/NAME
        args = build_parser().parse_args(["add", "x.conflist", given])
        assert runtime_from_args(args).container_id == expected
    args = build_parser().parse_args(["add", "x.conflist", given, "--container-id", "mine"])
    assert runtime_from_args(args).container_id == "mine"


class FakeNetns(Netns):
    """A namespace that is only a name: ChainLab's set-up writes its sysctls nowhere."""

    def sysctl(self, key: str, value: str | None = None) -> str:
        return value or ""


def test_a_chain_lab_network_adds_its_env_to_the_labs(tmp_path: Path) -> None:
    lab = ChainLab(FakeNetns, tmp_path)
    ipam = {"type": "host-local"}
    raw = {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": "bridge", "ipam": ipam}]}
    net = lab.network(raw, ["/x"], env={"PATH": "/tools", "CNI_META_LOG_FILE": "/l"})
    assert net.env == {**lab.env, "PATH": "/tools", "CNI_META_LOG_FILE": "/l"}
    assert net.host == lab.host.name and net.plugin_path == ["/x"]
    assert net.conflist.plugins[0]["ipam"]["dataDir"] == str(tmp_path / "host-local")
    assert lab.network(raw).env == lab.env
    assert "PATH" not in lab.env and ipam == {"type": "host-local"}  # the caller's list stays

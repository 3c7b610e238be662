"""Bad input to a plugin: exactly one CNI error JSON on stdout, the honest code, no traceback.

Each row is run against the real installed executables (all three plugins), as a runtime
would exec them. Cases that need an existing, foreign network namespace create one.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import netns as nslib
from tests.harness.plugins import our

PLUGINS = ("portmap", "bandwidth", "tuning", "flatnet", "flatnet-ipam")
GOOD = {"cniVersion": "1.0.0", "name": "net1", "type": "x"}
NETNS = "@netns"  # replaced by a real foreign netns path


def conf(**over: Any) -> bytes:
    return json.dumps({**GOOD, **over}).encode()


ENV_ADD = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c1",
    "CNI_NETNS": NETNS,
    "CNI_IFNAME": "eth0",
    "CNI_PATH": "/usr/lib/cni",
}
ENV_DEL = {**ENV_ADD, "CNI_COMMAND": "DEL", "CNI_NETNS": ""}


def env(base: dict[str, str], **over: str | None) -> dict[str, str]:
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


_regular_file = tempfile.NamedTemporaryFile(prefix="not-a-netns-", delete=False)  # noqa: SIM115
_regular_file.close()

# (id, environment, stdin, expected code)
CASES: list[tuple[str, dict[str, str], bytes, int]] = [
    ("add-missing-containerid", env(ENV_ADD, CNI_CONTAINERID=None), conf(), 4),
    ("add-missing-netns", env(ENV_ADD, CNI_NETNS=None), conf(), 4),
    ("add-missing-ifname", env(ENV_ADD, CNI_IFNAME=None), conf(), 4),
    ("add-missing-path", env(ENV_ADD, CNI_PATH=None), conf(), 4),
    ("del-missing-containerid", env(ENV_DEL, CNI_CONTAINERID=None), conf(), 4),
    ("del-missing-ifname", env(ENV_DEL, CNI_IFNAME=None), conf(), 4),
    ("check-missing-netns", env(ENV_ADD, CNI_COMMAND="CHECK", CNI_NETNS=None), conf(), 4),
    ("gc-missing-path", {"CNI_COMMAND": "GC"}, conf(cniVersion="1.1.0"), 4),
    ("status-missing-path", {"CNI_COMMAND": "STATUS"}, conf(cniVersion="1.1.0"), 4),
    ("unknown-command", env(ENV_DEL, CNI_COMMAND="FROB"), conf(), 4),
    ("lowercase-command", env(ENV_DEL, CNI_COMMAND="add"), conf(), 4),
    ("containerid-space", env(ENV_DEL, CNI_CONTAINERID="bad id"), conf(), 4),
    ("containerid-leading-dash", env(ENV_DEL, CNI_CONTAINERID="-abc"), conf(), 4),
    ("containerid-traversal", env(ENV_DEL, CNI_CONTAINERID="../etc"), conf(), 4),
    ("containerid-shell", env(ENV_DEL, CNI_CONTAINERID="a;rm -rf /"), conf(), 4),
    ("containerid-overlong", env(ENV_DEL, CNI_CONTAINERID="a" * 2000), conf(), 4),
    ("ifname-too-long", env(ENV_DEL, CNI_IFNAME="eth0123456789012"), conf(), 4),
    ("ifname-dot", env(ENV_DEL, CNI_IFNAME="."), conf(), 4),
    ("ifname-dotdot", env(ENV_DEL, CNI_IFNAME=".."), conf(), 4),
    ("ifname-slash", env(ENV_DEL, CNI_IFNAME="a/b"), conf(), 4),
    ("ifname-colon", env(ENV_DEL, CNI_IFNAME="eth0:1"), conf(), 4),
    ("ifname-space", env(ENV_DEL, CNI_IFNAME="eth 0"), conf(), 4),
    ("cni-args-no-equals", env(ENV_DEL, CNI_ARGS="IgnoreUnknown"), conf(), 4),
    ("netns-does-not-exist", env(ENV_ADD, CNI_NETNS="/run/netns/cmpt-nope-x"), conf(), 8),
    ("netns-regular-file", env(ENV_ADD, CNI_NETNS=_regular_file.name), conf(), 8),
    ("netns-is-own", env(ENV_ADD, CNI_NETNS="/proc/self/ns/net"), conf(), 8),
    ("del-netns-is-own", env(ENV_DEL, CNI_NETNS="/proc/self/ns/net"), conf(), 8),
    ("broken-json", ENV_DEL, b'{"cniVersion": "1.0.0", ', 6),
    ("empty-stdin", ENV_DEL, b"", 6),
    ("json-array", ENV_DEL, b"[1, 2]", 6),
    ("json-string", ENV_DEL, b'"hello"', 6),
    ("invalid-utf8", ENV_DEL, b'{"name": "\xff\xfe"}', 6),
    ("deep-nesting", ENV_DEL, b"[" * 100000 + b"]" * 100000, 6),
    ("oversized-stdin", ENV_DEL, b'{"pad": "' + b"x" * (2 << 20) + b'"}', 6),
    ("unknown-version", ENV_DEL, conf(cniVersion="0.5.0"), 1),
    ("future-version", ENV_DEL, conf(cniVersion="2.0.0"), 1),
    ("garbage-version", ENV_DEL, conf(cniVersion="latest"), 1),
    ("check-on-0.3.1", env(ENV_ADD, CNI_COMMAND="CHECK"), conf(cniVersion="0.3.1"), 1),
    (
        "check-without-version",
        env(ENV_ADD, CNI_COMMAND="CHECK"),
        json.dumps({"name": "n"}).encode(),
        1,
    ),
    ("gc-on-1.0.0", {"CNI_COMMAND": "GC", "CNI_PATH": "/x"}, conf(), 1),
    ("status-on-0.4.0", {"CNI_COMMAND": "STATUS", "CNI_PATH": "/x"}, conf(cniVersion="0.4.0"), 1),
    ("version-is-number", ENV_DEL, conf(cniVersion=1), 7),
    ("name-missing", ENV_DEL, json.dumps({"cniVersion": "1.0.0"}).encode(), 7),
    ("name-invalid", ENV_DEL, conf(name="bad name"), 7),
    ("name-not-string", ENV_DEL, conf(name=42), 7),
    ("runtimeconfig-is-list", ENV_DEL, conf(runtimeConfig=[1]), 7),
    ("args-is-string", ENV_DEL, conf(args="x"), 7),
    ("prevresult-is-string", ENV_DEL, conf(prevResult="x"), 7),
    ("prevresult-ips-not-list", ENV_DEL, conf(prevResult={"cniVersion": "1.0.0", "ips": {}}), 7),
    (
        "prevresult-interface-name-number",
        ENV_DEL,
        conf(prevResult={"cniVersion": "1.0.0", "interfaces": [{"name": 5}]}),
        7,
    ),
    (
        "prevresult-ip-interface-string",
        ENV_DEL,
        conf(
            prevResult={
                "cniVersion": "1.0.0",
                "ips": [{"address": "10.0.0.1/24", "interface": "0"}],
            }
        ),
        7,
    ),
    (
        "prevresult-dns-nameservers-number",
        ENV_DEL,
        conf(prevResult={"dns": {"nameservers": [1]}}),
        7,
    ),
]


@pytest.fixture(scope="module")
def foreign_netns() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace")
    with nslib.namespaces("errs") as (ns,):
        yield ns.path


def run(plugin: str, environ: dict[str, str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    full.update(environ)
    return subprocess.run([our(plugin)], input=stdin, env=full, capture_output=True, check=False)


def test_table_has_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.root
@pytest.mark.parametrize("plugin", PLUGINS)
@pytest.mark.parametrize(("case", "environ", "stdin", "code"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_error_json(
    plugin: str, case: str, environ: dict[str, str], stdin: bytes, code: int, foreign_netns: str
) -> None:
    environ = {k: (foreign_netns if v == NETNS else v) for k, v in environ.items()}
    proc = run(plugin, environ, stdin)
    out = proc.stdout.decode()
    assert proc.returncode != 0, f"{case}: expected failure, got {out}"
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, f"{case}: expected exactly one JSON line on stdout: {out!r}"
    err = json.loads(lines[0])
    assert err["code"] == code, f"{case}: {err}"
    assert isinstance(err["msg"], str) and err["msg"]
    assert err["cniVersion"] in ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
    assert "Traceback" not in out and b"Traceback" not in proc.stderr
    assert proc.stderr.strip(), "a human line belongs on stderr"


def test_unknown_version_error_lists_supported_versions() -> None:
    proc = run("portmap", ENV_DEL, conf(cniVersion="9.9.9"))
    err = json.loads(proc.stdout)
    assert err["code"] == 1
    for v in ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"):
        assert v in err["details"]


def test_error_json_carries_the_config_version() -> None:
    proc = run("tuning", ENV_DEL, conf(cniVersion="0.4.0", runtimeConfig=[]))
    assert json.loads(proc.stdout)["cniVersion"] == "0.4.0"


@pytest.mark.parametrize("plugin", PLUGINS)
def test_version_answers_requested_version(plugin: str) -> None:
    proc = run(plugin, {"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"1.0.0"}')
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {
        "cniVersion": "1.0.0",
        "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
    }


@pytest.mark.parametrize("stdin", [b"", b"garbage", b'{"cniVersion": 7}', b"[]"])
def test_version_never_fails_whatever_stdin_holds(stdin: bytes) -> None:
    # podman calls VERSION with CNI_NETNS=dummy and other leftovers: they must not matter.
    environ = {"CNI_COMMAND": "VERSION", "CNI_NETNS": "dummy", "CNI_CONTAINERID": "bad id"}
    proc = run("bandwidth", environ, stdin)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["supportedVersions"][-1] == "1.1.0"


def test_banner_without_command_goes_to_stderr() -> None:
    proc = run("tuning", {}, b"")
    assert proc.returncode == 0
    assert proc.stdout == b""
    assert b"tuning" in proc.stderr and b"1.1.0" in proc.stderr

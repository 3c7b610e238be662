"""cni-chain sends every plugin what libcni sends it.

A recorder plugin writes down each invocation (verb, CNI_* variables, stdin). The same
conflist is driven through libcni's cnitool and through cni-chain with the same runtime
arguments, and the two recordings must be the same.
"""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

import pytest

from tests.harness import cnitool
from tests.harness.lab import Lab

pytestmark = pytest.mark.root

RECORDER = """#!{python}
import json, os, sys
data = sys.stdin.read()
keys = ("CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")
env = {{k: os.environ[k] for k in keys if k in os.environ}}
with open(os.environ["RECORD_FILE"], "a") as f:
    f.write(json.dumps({{"env": env, "conf": json.loads(data)}}) + "\\n")
conf = json.loads(data)
if env["CNI_COMMAND"] == "ADD":
    prev = conf.get("prevResult") or {{"cniVersion": conf["cniVersion"], "interfaces": [
        {{"name": "eth0", "sandbox": env["CNI_NETNS"]}}], "ips": [
        {{"interface": 0, "address": "10.9.0.2/24", "gateway": "10.9.0.1"}}], "dns": {{}}}}
    prev["cniVersion"] = conf["cniVersion"]
    if conf["cniVersion"] < "1.0.0":
        for ip in prev["ips"]:
            ip["version"] = "4"
    print(json.dumps(prev))
"""

CAP_ARGS = {
    "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}],
    "bandwidth": {"ingressRate": 1000000, "ingressBurst": 100000},
    "mac": "02:00:00:00:00:01",
}


def conflist(version: str) -> dict[str, Any]:
    return {
        "cniVersion": version,
        "name": "rec",
        "plugins": [
            {"type": "recorder", "capabilities": {"portMappings": True, "mac": True}, "x": 1},
            {"type": "recorder", "capabilities": {"bandwidth": True, "mac": False}},
        ],
    }


def normalise(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        rec = json.loads(line)
        rec["env"].pop("CNI_PATH", None)  # each client passes its own search path
        out.append(rec)
    return out


@pytest.mark.parametrize("version", ["0.4.0", "1.0.0"])
def test_cni_chain_invokes_plugins_exactly_like_libcni(lab: Lab, version: str) -> None:
    tool = cnitool.build()
    bindir = lab.workdir / "bin"
    bindir.mkdir()
    rec = bindir / "recorder"
    rec.write_text(RECORDER.format(python=sys.executable))
    rec.chmod(0o755)
    confdir = lab.workdir / "net.d"
    confdir.mkdir()
    (confdir / "rec.conflist").write_text(json.dumps(conflist(version)))
    common = {
        "CNI_PATH": str(bindir),
        "NETCONFPATH": str(confdir),
        "CNI_CONTAINERID": "ctr-rec-1",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAME=web",
    }
    q = shlex.quote
    libcni_log = lab.workdir / "libcni.jsonl"
    steps = "\n".join(
        f"RECORD_FILE={q(str(libcni_log))} CAP_ARGS={q(json.dumps(CAP_ARGS))} "
        f"ip netns exec {lab.host.name} {tool} {verb} rec {lab.ctr.path} >/dev/null"
        for verb in ("add", "check", "del")
    )
    proc = cnitool.run_in_private_varlib(steps, common)
    assert proc.returncode == 0, proc.stderr

    chain_log = lab.workdir / "chain.jsonl"
    for verb in ("add", "check", "del"):
        chain = lab.cli
        chain.env = {**lab.env, "RECORD_FILE": str(chain_log)}
        chain.cni_path = str(bindir)
        chain.run(
            verb, str(confdir / "rec.conflist"), lab.ctr.path,
            "--container-id", "ctr-rec-1", "--cni-args", common["CNI_ARGS"],
            "--runtime-config", json.dumps(CAP_ARGS),
        )  # fmt: skip

    ours = normalise(chain_log.read_text().splitlines())
    theirs = normalise(libcni_log.read_text().splitlines())
    assert [r["env"]["CNI_COMMAND"] for r in theirs] == ["ADD"] * 2 + ["CHECK"] * 2 + ["DEL"] * 2
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a == b, (
            f"invocation {i} differs:\ncni-chain: {json.dumps(a)}\nlibcni:    {json.dumps(b)}"
        )

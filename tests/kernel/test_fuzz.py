"""Fuzzing the three plugins as a runtime execs them, against a real kernel.

Each plugin gets a lab: a host netns with the Go bridge's dual-stack attachment of a
container netns (eth0). Hypothesis then generates invocations around that attachment
(tests/harness/fuzz.py): valid ones that really configure port forwarding, shaping or
tuning, and broken ones (config, environment, bytes). For every invocation:

* never a traceback, on stdout or stderr;
* exit 0 with a well-formed result (ADD) or nothing (DEL, CHECK, GC, STATUS), or non-zero
  with exactly one error JSON whose code is a documented one (999 - an unexpected
  exception - counts as a bug) and a message;
* a failed call, and any call that is not a successful ADD, leaves the kernel (nft
  ruleset, legacy iptables, links, qdiscs, filters, sysctls) and the state files exactly
  as they were;
* a successful ADD passes CHECK (from 0.4.0) and DEL with the same input, and after DEL
  the lab is back to where it was (route_localnet and iptables' shared chains, which stay
  by design as in Go, aside).

At least 500 cases per plugin; `make fuzz` (HYPOTHESIS_PROFILE=fuzz) runs 10,000.
CNI_META_FUZZ_CASES overrides the count, CNI_META_FUZZ_STATS names a file that gets one
JSON line of figures per plugin, CNI_META_FUZZ_TRACE one line per call (for debugging).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings

from tests.harness import fuzz
from tests.harness.lab import Lab
from tests.harness.plugins import our, run_plugin

pytestmark = [pytest.mark.root, pytest.mark.slow]

PLUGINS = ("portmap", "bandwidth", "tuning")
MIN_CASES = 500
TRACE = os.environ.get("CNI_META_FUZZ_TRACE", "")  # a file: one JSON line per call


def cases_per_plugin() -> int:
    override = os.environ.get("CNI_META_FUZZ_CASES")
    if override:
        return int(override)
    return max(MIN_CASES, settings().max_examples)


@dataclass
class Stats:
    plugin: str
    cases: int = 0
    seconds: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    adds_ok: int = 0
    checks: int = 0

    def record(self, case: fuzz.Case, rc: int, code: int | None) -> None:
        self.cases += 1
        self.kinds[case.kind] += 1
        verb = (
            case.command
            if case.command in ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
            else "other"
        )
        self.outcomes[f"{verb} ok" if rc == 0 else f"{verb} error {code}"] += 1
        if verb == "ADD" and rc == 0:
            self.adds_ok += 1

    def summary(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "cases": self.cases,
            "seconds": round(self.seconds, 1),
            "adds_ok": self.adds_ok,
            "checks_after_add": self.checks,
            "kinds": dict(self.kinds),
            "outcomes": dict(sorted(self.outcomes.items())),
        }


# Kernel state that a successful ADD + DEL leaves behind on purpose (as Go's portmap does):
# route_localnet on the interface toward the container, and the iptables backend's shared
# chains (CNI-HOSTPORT-DNAT/-MASQ/-SETMARK and the jumps to them).
def drift_is_allowed(path: str, after: dict[str, Any]) -> bool:
    if path.startswith("/sysctl host/") and path.endswith("/route_localnet"):
        return True
    if path.startswith(("/iptables", "/ip6tables")):
        dump = after["iptables" if path.startswith("/iptables") else "ip6tables"]
        return "CNI-DN-" not in dump and "-j DNAT" not in dump
    return False


@dataclass
class World:
    lab: Lab
    plugin: str
    base: fuzz.Base
    ctx: fuzz.EnvContext
    snapshots: fuzz.Snapshotter
    cwd: Path
    last: dict[str, Any] = field(default_factory=dict)

    @property
    def exe(self) -> str:
        return our(self.plugin)

    def run(self, case: fuzz.Case) -> tuple[int, str, str]:
        rc, out, err, _ = fuzz.run_case(self.exe, self.lab.host, case, self.lab.env, self.cwd)
        for stream, text in (("stdout", out), ("stderr", err)):
            assert "Traceback" not in text, f"traceback on {stream}: {text[-2000:]}"
        return rc, out, err

    def again(self, case: fuzz.Case, command: str) -> tuple[int, str, str]:
        return self.run(fuzz.Case(case.kind, {**case.env, "CNI_COMMAND": command}, case.stdin))

    def unchanged(self, why: str) -> None:
        now = self.snapshots.take()
        diff = fuzz.differences(self.last, now)
        self.last = now
        assert not diff, f"{why} changed the lab:\n  " + "\n  ".join(diff)

    def back_to_start(self, why: str) -> None:
        now = self.snapshots.take()
        diff = [
            d
            for d in fuzz.differences(self.last, now, limit=200)
            if not drift_is_allowed(d.split(":")[0], now)
        ]
        # Put route_localnet back, so that a later failed ADD that turns it on is seen.
        was, sysctls = self.last.get("sysctl host", {}), now.get("sysctl host", {})
        for path, value in sysctls.items():
            if path.endswith("/route_localnet") and path in was and value != was[path]:
                with self.lab.host.entered(), open(path, "w") as f:
                    f.write(was[path])
                sysctls[path] = was[path]
        self.last = now
        assert not diff, f"{why} did not return the lab to its state:\n  " + "\n  ".join(diff[:12])

    def check(self, case: fuzz.Case, stats: Stats) -> None:
        note(repr(case))
        rc, out, _ = self.run(case)
        if TRACE:
            with open(TRACE, "a") as f:
                f.write(
                    json.dumps({"plugin": self.plugin, "case": repr(case), "rc": rc, "out": out})
                    + "\n"
                )
        code = None
        try:
            if rc != 0:
                code = fuzz.check_error(out)["code"]
                self.unchanged(f"a failed {case.command} (error {code})")
                return
            if case.command == "ADD":
                fuzz.check_result(out, fuzz.expected_version(case.stdin))
                version = json.loads(out)["cniVersion"]
                # A runtime always sends CHECK a prevResult (libcni: the cached result).
                checkable = version in ("0.4.0", "1.0.0", "1.1.0")
                if case.check_after_add and checkable and fuzz.has_prev_result(case.stdin):
                    stats.checks += 1
                    crc, cout, _ = self.again(case, "CHECK")
                    assert crc == 0 and not cout.strip(), (
                        f"CHECK after a successful ADD failed: {cout}"
                    )
                drc, dout, _ = self.again(case, "DEL")
                assert drc == 0 and not dout.strip(), f"DEL after a successful ADD failed: {dout}"
                self.back_to_start("ADD + DEL")
                return
            if case.command == "VERSION":
                assert fuzz.one_json_object(out)["supportedVersions"], out
            else:
                assert not out.strip(), f"{case.command} printed {out[:300]!r}"
            self.unchanged(f"a successful {case.command}")
        except BaseException:
            # Leave the lab as clean as possible for the next example (hypothesis goes on
            # shrinking): undo a possible ADD, then take whatever is there as the baseline.
            if case.command == "ADD":
                with contextlib.suppress(AssertionError):
                    self.again(case, "DEL")
            self.last = self.snapshots.take()
            raise
        finally:
            stats.record(case, rc, code)


def make_world(lab: Lab, plugin: str) -> World:
    prev = fuzz.attach_with_bridge(lab.host, lab.ctr, lab.workdir)
    scratch = lab.workdir / "scratch"
    scratch.mkdir()
    (scratch / "regular-file").write_text("not a namespace\n")
    (scratch / "empty-dir").mkdir()
    (scratch / "ctr-link").symlink_to(lab.ctr.path)
    cwd = lab.workdir / "cwd"
    cwd.mkdir()
    # No allowlist: the machine's own /etc/cni/tuning/allowlist.conf must not decide.
    lab.env["CNI_TUNING_ALLOWLIST"] = str(lab.workdir / "no-allowlist.conf")
    # The snapshots read (and tolerate the shared chains of) the legacy tables.
    lab.env["CNI_META_IPTABLES"] = "legacy"
    world = World(
        lab=lab,
        plugin=plugin,
        base=fuzz.Base(plugin, prev),
        ctx=fuzz.EnvContext(lab.ctr.path, scratch),
        snapshots=fuzz.Snapshotter(plugin, lab.host, lab.ctr, lab.state_root),
        cwd=cwd,
    )
    warm_up(world, prev)
    world.last = world.snapshots.take()
    return world


WARM_UP: dict[str, dict[str, Any]] = {
    "portmap": {"runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80}]}},
    "bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 100_000},
    "tuning": {"sysctl": {"net.core.somaxconn": "1000"}},
}


def warm_up(world: World, prev: dict[str, Any]) -> None:
    """One ADD + DEL (portmap: per backend), so that the state dirs and lock files exist
    before the baseline, and the nat tables with the shared CNI-HOSTPORT-* chains that the
    iptables backend leaves (as Go's portmap does)."""
    conf = {"cniVersion": "1.0.0", "name": fuzz.NETWORK, "type": world.plugin, "prevResult": prev}
    conf.update(WARM_UP[world.plugin])
    lab = world.lab
    for backend in ("nftables", "iptables") if world.plugin == "portmap" else ("",):
        if backend:
            conf["backend"] = backend
        for command in ("ADD", "DEL"):
            run_plugin(
                world.exe, command, conf, host=lab.host, netns=lab.ctr.path, env=lab.env
            ).ok()
    if world.plugin == "portmap":  # as the lab found it: the first ADD turns it on
        lab.host.sysctl(f"net.ipv4.conf.{fuzz.BRIDGE}.route_localnet", "0")


@pytest.mark.parametrize("plugin", PLUGINS)
def test_fuzzed_calls_answer_honestly_and_failures_leave_no_trace(lab: Lab, plugin: str) -> None:
    world = make_world(lab, plugin)
    stats = Stats(plugin)
    started = time.monotonic()

    @settings(
        max_examples=cases_per_plugin(),
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
        deadline=None,
    )
    @given(fuzz.cases(world.base, world.ctx))
    def one_call(case: fuzz.Case) -> None:
        world.check(case, stats)

    try:
        one_call()
    finally:
        stats.seconds = time.monotonic() - started
        summary = stats.summary()
        print(json.dumps(summary))
        target = os.environ.get("CNI_META_FUZZ_STATS")
        if target:
            with open(target, "a") as f:
                f.write(json.dumps(summary) + "\n")
    # The generator must reach both sides, or the properties above prove little.
    if stats.cases >= 200:
        assert stats.adds_ok >= stats.cases // 10, summary
        failures = sum(n for k, n in stats.outcomes.items() if "error" in k)
        assert failures >= stats.cases // 5, summary


# ---------------------------------------------------------------------------- found by fuzzing


@pytest.mark.parametrize(
    "second",
    [
        # an IPv4-only conflict with another attachment's address-specific mapping
        {"runtimeConfig": {"portMappings": [
            {"hostPort": 9090, "containerPort": 90},
            {"hostPort": 8080, "containerPort": 80, "hostIP": fuzz.GATEWAY4},
        ]}},
        # an IPv4 condition iptables cannot use, with a mark bit nobody uses yet
        {"markMasqBit": 6, "conditionsV4": ["-x", "y"],
         "runtimeConfig": {"portMappings": [{"hostPort": 9090, "containerPort": 90}]}},
    ],
    ids=["ipv4-conflict", "ipv4-bad-condition"],
)  # fmt: skip
def test_an_iptables_add_failing_for_ipv4_leaves_ipv6_untouched(
    lab: Lab, second: dict[str, Any]
) -> None:
    """A dual-stack ADD whose IPv4 half fails used to leave its IPv6 half installed (the
    undo ran in a process that had loaded IPv4's extensions) and report that error."""
    # The snapshots read (and tolerate the shared chains of) the legacy tables.
    lab.env["CNI_META_IPTABLES"] = "legacy"
    prev = fuzz.attach_with_bridge(lab.host, lab.ctr, lab.workdir)
    snapshots = fuzz.Snapshotter("portmap", lab.host, lab.ctr, lab.state_root)
    base = {"cniVersion": "1.0.0", "name": fuzz.NETWORK, "type": "portmap", "prevResult": prev}
    first = {**base, "backend": "iptables", "runtimeConfig": {"portMappings": [
        {"hostPort": 8080, "containerPort": 80, "hostIP": fuzz.GATEWAY4}]}}  # fmt: skip
    run_plugin(our("portmap"), "ADD", first, host=lab.host, netns=lab.ctr.path, env=lab.env).ok()
    before = snapshots.take()
    conf = {**base, "backend": "iptables", **second}
    run = run_plugin(
        our("portmap"), "ADD", conf, host=lab.host, netns=lab.ctr.path, env=lab.env,
        container_id="other",
    )  # fmt: skip
    err = fuzz.check_error(run.stdout)
    assert err["code"] == (101 if "hostIP" in json.dumps(second) else 7), err
    assert not fuzz.differences(before, snapshots.take())


@pytest.mark.parametrize(
    "keys",
    [
        {"backend": "iptables", "externalSetMarkChain": "KUBE-MARK-MASQ"},
        {"backend": "nftables", "conditionsV4": ["ip saddr 10.0.0.0/33"]},  # no DNS lookup
    ],
    ids=["iptables-missing-mark-chain", "nftables-refused-condition"],
)
def test_a_refused_add_leaves_route_localnet_alone(lab: Lab, keys: dict[str, Any]) -> None:
    """route_localnet used to be turned on before the mappings were installed, and stayed
    on when the backend then refused them."""
    world = make_world(lab, "portmap")  # state dirs and legacy nat tables exist, rl is 0
    mappings = {"portMappings": [{"hostPort": 8080, "containerPort": 80}]}
    conf = {"cniVersion": "1.0.0", "name": fuzz.NETWORK, "type": "portmap",
            "prevResult": world.base.prev_result, "snat": True, "runtimeConfig": mappings,
            **keys}  # fmt: skip
    run = run_plugin(our("portmap"), "ADD", conf, host=lab.host, netns=lab.ctr.path, env=lab.env)
    assert fuzz.check_error(run.stdout)["code"] in (7, 100)
    assert lab.host.sysctl(f"net.ipv4.conf.{fuzz.BRIDGE}.route_localnet") == "0"
    assert not fuzz.differences(world.last, world.snapshots.take())

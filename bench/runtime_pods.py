"""Pods through real runtimes, our meta plugins vs Go's: containerd's CRI and `podman run --rm`.

The chain is the Go bridge + host-local, then portmap, bandwidth and tuning (a sysctl in
the pod's netns): conflists/containerd-bridge.conflist with tuning appended. Two pods:

  plain  no port mappings, no bandwidth: every meta plugin passes the result through (the
         pods of a conformance run look like this)
  full   one host port and 8 Mbit/s both ways: every meta plugin does its work

containerd 1.6 runs as in tests/runtimes/test_containerd.py (tests/harness/containerd.py):
the bench is the kubelet, RunPodSandbox (bandwidth as the kubernetes.io annotations), then
StopPodSandbox and RemovePodSandbox, each timed around its gRPC call. podman 4 (CNI
backend, runc) runs as in tests/runtimes/test_podman.py: `podman run --rm` of a busybox
`echo` (the static bandwidth plugin in the full pod's network, since podman never sends a
bandwidth capability), timed around the podman command. Every daemon and podman command
runs in its own throwaway host netns and private mount namespace (private /run and
/var/lib) with its own state: nothing of the machine's netns, /var/lib/cni or runtimes is
touched. Each (runtime, implementation) is its own world; Go and ours alternate (A B A B,
the order rotating per round) after one unrecorded warm-up pod each.

Where the time goes: the runtime's CNI bin dir holds a timing shim per plugin
(bench/cni_trace.c) that execs the real plugin (ours first, then Go's, as an install has
them) and logs plugin, verb, container, start, wall time, CPU and peak RSS. The report
counts the execs each pod makes per step, plugin and verb with their cost, ours vs Go, and
how much of each step's wall time no plugin was running (the runtime's own work). The
shim's cost per exec is measured in the same run and stated.

  python bench/runtime_pods.py [--rounds N] [--quick] [--runtimes containerd,podman]
      -> bench/results/runtime_pods.md (every sample and traced exec: results/raw/)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import (
    GO_BIN,
    SYSTEM_PATH,
    Spawner,
    build_spawner,
    header,
    markdown_table,
    median,
    quick_mode,
    rotated,
    write_raw,
    write_result,
)
from tests.harness import netns as nslib
from tests.harness.containerd import Containerd
from tests.harness.netns import Netns
from tests.harness.runtimes import Podman, have, install_ours, podman, write_conflist

IMPLS = ("Go", "ours")
KINDS = ("plain", "full")
LIST = "containerd-bridge.conflist"
TUNING: dict[str, Any] = {"type": "tuning", "sysctl": {"net.core.somaxconn": "1024"}}
RATE = 8_000_000  # bits/s both ways in the full pod
ANNOTATIONS = {"kubernetes.io/ingress-bandwidth": "8M", "kubernetes.io/egress-bandwidth": "8M"}
STATIC_BANDWIDTH = {
    "ingressRate": RATE,
    "ingressBurst": 400_000,
    "egressRate": RATE,
    "egressBurst": 400_000,
}
HOST_PORT = 18080
IPAM = {"host-local", "static", "dhcp"}  # exec'd by the bridge, inside its exec
CTD_STEPS = ("RunPodSandbox", "StopPodSandbox", "RemovePodSandbox")
POD_TOTAL = "pod total"
PODMAN_STEP = "run --rm"
SHIM_SOURCE = Path(__file__).with_name("cni_trace.c")


# ----------------------------------------------------------------------------- tracing


@dataclass
class Exec:
    """One plugin process a runtime exec'd, as the shim logged it (times in ns)."""

    plugin: str
    verb: str
    container: str
    start: int
    wall: int
    cpu_us: int
    rss_kib: int
    status: int

    @property
    def end(self) -> int:
        return self.start + self.wall


def parse_execs(text: str) -> list[Exec]:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) != 9:
            continue
        out.append(
            Exec(
                f[0], f[1], f[2], int(f[3]), int(f[4]), int(f[5]) + int(f[6]), int(f[7]), int(f[8])
            )
        )
    return out


def build_shim(workdir: Path) -> Path:
    """Compile bench/cni_trace.c, static where the toolchain allows (as bench/spawn.c)."""
    out = workdir / "cni_trace"
    errors = b""
    for flags in (["-static"], []):
        proc = subprocess.run(
            ["cc", "-O2", "-Wall", *flags, "-o", str(out), str(SHIM_SOURCE)], capture_output=True
        )
        if proc.returncode == 0:
            return out
        errors = proc.stderr
    raise RuntimeError(
        f"cannot compile {SHIM_SOURCE} (gcc is in the Makefile's apt list): {errors!r}"
    )


@dataclass
class Trace:
    """A CNI bin dir of timing shims in front of the plugins of `dirs` (first dir wins)."""

    root: Path
    offset: int = 0

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def log(self) -> Path:
        return self.root / "exec.log"

    @classmethod
    def make(cls, root: Path, shim: Path, dirs: list[str]) -> Trace:
        trace = cls(root)
        real = root / "real"
        real.mkdir(parents=True)
        trace.bin.mkdir()
        for d in dirs:
            for entry in sorted(Path(d).iterdir()):
                if (real / entry.name).is_symlink() or not os.access(entry, os.X_OK):
                    continue
                (real / entry.name).symlink_to(entry)
                shutil.copy2(shim, trace.bin / entry.name)
        return trace

    def take(self) -> list[Exec]:
        """The execs logged since the last take (complete lines only)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        done = data.rfind(b"\n") + 1
        self.offset += done
        return parse_execs(data[:done].decode())


def shim_overhead_ms(workdir: Path, shim: Path, reps: int) -> float:
    """Median extra wall time the shim adds to one exec (it wrapping /bin/true vs /bin/true)."""
    trace = Trace.make(workdir / "overhead", shim, [])
    (trace.root / "real" / "true").symlink_to("/bin/true")
    shutil.copy2(shim, trace.bin / "true")
    spawn = Spawner(build_spawner(workdir))
    env = {"PATH": SYSTEM_PATH, "CNI_COMMAND": "VERSION"}
    direct, shimmed = [], []
    for _ in range(reps):
        direct.append(spawn.ok(["/bin/true"], env, b"").ms)
        shimmed.append(spawn.ok([str(trace.bin / "true")], env, b"").ms)
    return median(shimmed) - median(direct)


# ------------------------------------------------------------------------------ worlds


class Deferred:
    """SIGTERM and SIGINT take effect between pods, never inside one.

    A podman killed halfway through `run` leaves a conmon and a `runc init` behind that its
    own `rm -a -f` no longer knows of; so the bench finishes the pod in hand, then unwinds
    (every daemon, podman world and namespace removed) as bench/util.py's SIGTERM does.
    A second signal unwinds at once.
    """

    signum = 0

    def arm(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._note)

    def _note(self, signum: int, _frame: Any) -> None:
        if self.signum:  # asked twice: stop now, whatever is left behind
            raise SystemExit(128 + signum)
        self.signum = signum

    def checkpoint(self) -> None:
        if self.signum:
            raise SystemExit(128 + self.signum)


STOP = Deferred()


@dataclass
class Cycle:
    """One recorded pod: its steps' [start, end] (monotonic ns) and the execs it caused."""

    kind: str
    steps: dict[str, tuple[int, int]]
    execs: list[Exec] = field(default_factory=list)

    @property
    def span(self) -> tuple[int, int]:
        starts, ends = zip(*self.steps.values(), strict=True)
        return min(starts), max(ends)

    def step_of(self, e: Exec) -> str:
        for step, (t0, t1) in self.steps.items():
            if t0 <= e.start <= t1:
                return step
        return "after" if e.start > self.span[1] else "before"


@dataclass
class World:
    """One runtime with one implementation's plugins, in its own host netns and mounts."""

    runtime: str
    impl: str
    trace: Trace
    cycles: list[Cycle] = field(default_factory=list)
    pending: Cycle | None = None

    def settle(self) -> None:
        """Give the execs logged since the last pod to it (a late DEL lands there too)."""
        execs = self.trace.take()
        if self.pending is not None:
            self.pending.execs = execs
            self.cycles.append(self.pending)
            self.pending = None

    def pod(self, kind: str, n: int, record: bool) -> None:
        STOP.checkpoint()
        self.settle()
        steps = self.run_pod(kind, f"{kind}-{n}")
        if record:
            self.pending = Cycle(kind, steps)

    def run_pod(self, kind: str, name: str) -> dict[str, tuple[int, int]]:
        raise NotImplementedError


@dataclass
class ContainerdWorld(World):
    ctd: Containerd | None = None

    def run_pod(self, kind: str, name: str) -> dict[str, tuple[int, int]]:
        assert self.ctd is not None
        ports = ((HOST_PORT, 80, "tcp"),) if kind == "full" else ()
        annotations = ANNOTATIONS if kind == "full" else {}
        t0 = time.monotonic_ns()
        pod = self.ctd.run_pod(name, ports, annotations)
        t1 = time.monotonic_ns()
        self.ctd.stop_pod(pod)
        t2 = time.monotonic_ns()
        self.ctd.remove_pod(pod)
        t3 = time.monotonic_ns()
        return dict(zip(CTD_STEPS, ((t0, t1), (t1, t2), (t2, t3)), strict=True))


@dataclass
class PodmanWorld(World):
    # One podman (storage, network dir) per pod kind: podman validates every conflist in its
    # network dir, a VERSION exec per plugin, whenever a podman process loads its networks,
    # so a second network in the dir would add its VERSION execs to every pod.
    pms: dict[str, Podman] = field(default_factory=dict)

    def run_pod(self, kind: str, name: str) -> dict[str, tuple[int, int]]:
        pm = self.pms[kind]
        ports = ("-p", f"{HOST_PORT}:80") if kind == "full" else ()
        t0 = time.monotonic_ns()
        pm.run("run", "--rm", "--name", name, "--network", f"bench-{kind}", *ports,
               pm.image, "echo")  # fmt: skip
        return {PODMAN_STEP: (t0, time.monotonic_ns())}


@contextmanager
def containerd_world(impl: str, host: Netns, workdir: Path, trace: Trace) -> Iterator[World]:
    ctd = Containerd(host, workdir, [str(trace.bin)], {}, extra_plugins=(TUNING,))
    try:
        ctd.start(LIST)
        yield ContainerdWorld("containerd", impl, trace, ctd=ctd)
    finally:
        ctd.stop()


def podman_network(pm: Podman, kind: str, bridge: int) -> None:
    """The same chain as containerd's; the full pod's network shapes statically."""
    raw: dict[str, Any] = write_conflist(LIST, pm.workdir / "src", pm.workdir, (TUNING,))
    raw["name"] = f"bench-{kind}"
    raw["plugins"][0]["bridge"] = f"cni-podman{bridge}"
    raw["plugins"][0]["ipam"]["ranges"] = [
        [{"subnet": f"10.89.{bridge}.0/24", "gateway": f"10.89.{bridge}.1"}]
    ]
    if kind == "full":
        for plugin in raw["plugins"]:
            if plugin["type"] == "bandwidth":
                plugin.update(STATIC_BANDWIDTH)
    (pm.net_dir / f"bench-{kind}.conflist").write_text(json.dumps(raw, indent=2))


@contextmanager
def podman_world(impl: str, host: Netns, workdir: Path, trace: Trace) -> Iterator[World]:
    world = PodmanWorld("podman", impl, trace)
    with ExitStack() as stack:
        for i, kind in enumerate(KINDS, start=1):
            pm = stack.enter_context(podman(host, workdir / f"podman-{kind}", [str(trace.bin)], {}))
            podman_network(pm, kind, i)
            world.pms[kind] = pm
            stack.callback(kill_leftovers, pm)  # runs before podman()'s own cleanup
        yield world


def kill_leftovers(pm: Podman) -> None:
    """Last resort after an error inside a pod: podman's processes still in its mounts."""
    pm.remove_all()
    if pm.jail is not None:
        for pid in pm.jail.processes():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------ report


def steps_of(runtime: str) -> tuple[str, ...]:
    return (*CTD_STEPS, POD_TOTAL) if runtime == "containerd" else (PODMAN_STEP,)


def step_ms(c: Cycle, step: str) -> float:
    t0, t1 = c.span if step == POD_TOTAL else c.steps[step]
    return (t1 - t0) / 1e6


def covered_ns(execs: list[Exec], t0: int, t1: int) -> int:
    """How much of [t0, t1] at least one plugin process was running."""
    spans = sorted((max(e.start, t0), min(e.end, t1)) for e in execs)
    total, reach = 0, t0
    for a, b in spans:
        a = max(a, reach)
        if b > a:
            total += b - a
            reach = b
    return total


def row_key(c: Cycle, e: Exec) -> tuple[str, str, str]:
    plugin = f"{e.plugin} (in bridge)" if e.plugin in IPAM else e.plugin
    return (c.step_of(e), plugin, e.verb)


Match = Callable[[Cycle, Exec], bool]


def tally(cycles: list[Cycle], match: Match) -> tuple[float, float, float]:
    """(execs per pod, median ms of one exec, median ms per pod of their sum) of the
    execs that `match`."""
    walls = [e.wall / 1e6 for c in cycles for e in c.execs if match(c, e)]
    sums = [sum(e.wall for e in c.execs if match(c, e)) / 1e6 for c in cycles]
    return len(walls) / max(1, len(cycles)), median(walls), median(sums)


def cpu_ms(cycles: list[Cycle], match: Match) -> float:
    """Median per pod of the CPU time (user + sys) of the execs that `match`."""
    return median([sum(e.cpu_us for e in c.execs if match(c, e)) / 1e3 for c in cycles])


def cpu_per_exec(cycles: list[Cycle], match: Match) -> float:
    """Median CPU time (user + sys) of one exec that `match`."""
    return median([e.cpu_us / 1e3 for c in cycles for e in c.execs if match(c, e)])


def counts(go: float, ours: float) -> str:
    return f"{go:g}" if go == ours else f"{go:g} / {ours:g}"


def by_verb(pairs: dict[str, dict[str, World]]) -> str:
    """Per pod and verb: how many plugin execs (IPAM left out: it runs inside the bridge's
    exec) and what they cost, ours vs Go."""
    rows: list[list[object]] = []
    for runtime, pair in pairs.items():
        for kind in KINDS:
            per = {impl: [c for c in w.cycles if c.kind == kind] for impl, w in pair.items()}
            verbs = sorted({e.verb for cs in per.values() for c in cs for e in c.execs})
            for verb in verbs:

                def match(_c: Cycle, e: Exec, verb: str = verb) -> bool:
                    return e.verb == verb and e.plugin not in IPAM

                gn, _, gs = tally(per["Go"], match)
                on, _, os_ = tally(per["ours"], match)
                gc, oc = cpu_ms(per["Go"], match), cpu_ms(per["ours"], match)
                rows.append([runtime, kind, verb, counts(gn, on), gs, os_, f"{os_ - gs:+.1f}",
                             gc, oc, f"{oc - gc:+.1f}"])  # fmt: skip
    return markdown_table(
        ("runtime", "pod", "verb", "execs/pod", "Go ms/pod", "ours ms/pod", "ours-Go ms/pod",
         "Go CPU ms/pod", "ours CPU ms/pod", "ours-Go CPU"),
        rows,
    )  # fmt: skip


def breakdown(go: World, ours: World, kind: str, steps: tuple[str, ...]) -> str:
    """Per pod: execs per step, plugin and verb with their cost; then what no plugin ran."""
    per: dict[str, list[Cycle]] = {
        w.impl: [c for c in w.cycles if c.kind == kind] for w in (go, ours)
    }
    order = {s: i for i, s in enumerate((*steps, "after", "before"))}
    keys = sorted(
        {row_key(c, e) for cs in per.values() for c in cs for e in c.execs},
        key=lambda k: (order.get(k[0], 99), k[1], k[2]),
    )
    rows: list[list[object]] = []
    for key in keys:

        def match(c: Cycle, e: Exec, key: tuple[str, str, str] = key) -> bool:
            return row_key(c, e) == key

        gn, gw, gs = tally(per["Go"], match)
        on, ow, os_ = tally(per["ours"], match)
        gc, oc = cpu_per_exec(per["Go"], match), cpu_per_exec(per["ours"], match)
        rows.append([*key, counts(gn, on), gw, ow, gc, oc, gs, os_, f"{os_ - gs:+.1f}"])

    def summed(impl: str, what: str) -> float:
        vals = []
        for c in per[impl]:
            top = [e for e in c.execs if e.plugin not in IPAM]
            if what == "exec":
                vals.append(sum(e.wall for e in top) / 1e6)
            elif what == "cpu":
                vals.append(sum(e.cpu_us for e in c.execs) / 1e3)
            else:  # the pod's wall time during which no plugin process ran
                t0, t1 = c.span
                vals.append((t1 - t0 - covered_ns(c.execs, t0, t1)) / 1e6)
        return median(vals)

    for label, what in (
        ("all plugin execs (wall, summed; IPAM inside the bridge's)", "exec"),
        ("all plugin execs (CPU, user+sys, IPAM included)", "cpu"),
        ("no plugin running (the runtime's own time)", "idle"),
    ):
        g, o = summed("Go", what), summed("ours", what)
        rows.append([f"**{label}**", "", "", "", "", "", "", "", g, o, f"{o - g:+.1f}"])
    return markdown_table(
        ("step", "plugin", "verb", "execs/pod", "Go ms/exec", "ours ms/exec",
         "Go CPU ms/exec", "ours CPU ms/exec", "Go ms/pod", "ours ms/pod", "ours-Go ms/pod"),
        rows,
    )  # fmt: skip


def report(worlds: list[World], rounds: int, notes: list[str]) -> str:
    text = header(
        "Pods through containerd's CRI and podman: our meta plugins vs Go's",
        f"The Go bridge + host-local, then portmap, bandwidth and tuning (Go's, or ours as "
        f"deploy/install.sh installs them, without any resident helper). containerd 1.6 CRI: "
        f"RunPodSandbox, StopPodSandbox, RemovePodSandbox timed around each gRPC call; podman "
        f"4 (CNI backend, runc, vfs): `podman run --rm` of busybox `echo`. plain = no port, "
        f"no bandwidth (every meta plugin passes through); full = one host port and "
        f"{RATE // 1_000_000} Mbit/s both ways. {rounds} rounds, Go and ours alternating "
        f"(order rotating), medians; each runtime and implementation in its own throwaway "
        f"host netns and private mount namespace. Every plugin exec goes through a timing "
        f"shim (bench/cni_trace.c) in the runtime's CNI bin dir.",
    )
    text += "".join(f"- {n}\n" for n in notes) + "\n"
    rows: list[list[object]] = []
    pairs: dict[str, dict[str, World]] = {}
    for w in worlds:
        pairs.setdefault(w.runtime, {})[w.impl] = w
    for runtime, pair in pairs.items():
        for kind in KINDS:
            for step in steps_of(runtime):
                ms = {
                    impl: median([step_ms(c, step) for c in w.cycles if c.kind == kind])
                    for impl, w in pair.items()
                }
                rows.append(
                    [runtime, kind, step, ms["Go"], ms["ours"], f"{ms['ours'] / ms['Go']:.2f}x"]
                )
    text += "## Wall time per pod (ms)\n\n"
    text += markdown_table(("runtime", "pod", "step", "Go", "ours", "ours/Go"), rows) + "\n\n"
    text += (
        "## Where it goes: plugin execs per pod, by verb\n\n"
        "Summed over the plugins (host-local left out: it runs inside the bridge's exec); "
        "medians per pod of wall time and of CPU time (user + sys: what a busy machine "
        "disturbs least).\n\n"
    )
    text += by_verb(pairs) + "\n\n"
    text += (
        "## Per step, plugin and verb\n\n"
        "Per step of the pod: how many times the runtime exec'd each plugin with each verb, "
        "the median wall and CPU time of one exec, and the median per pod of their wall "
        "times' sum (wall well above CPU: waiting, for the kernel or for a busy CPU). host-local "
        "runs inside the bridge's exec (the bridge execs it), so the sums leave it out. "
        "`after`: execs logged after the pod's last step had returned.\n\n"
    )
    for runtime, pair in pairs.items():
        for kind in KINDS:
            text += f"### {runtime}, {kind} pod\n\n"
            text += breakdown(pair["Go"], pair["ours"], kind, steps_of(runtime)) + "\n\n"
    return text


def raw_data(worlds: list[World]) -> dict[str, Any]:
    return {
        f"{w.runtime} {w.impl}": [
            {
                "kind": c.kind,
                "steps_ms": {s: (t1 - t0) / 1e6 for s, (t0, t1) in c.steps.items()},
                "execs": [
                    {
                        "step": c.step_of(e),
                        "plugin": e.plugin,
                        "verb": e.verb,
                        "offset_ms": (e.start - c.span[0]) / 1e6,
                        "wall_ms": e.wall / 1e6,
                        "cpu_ms": e.cpu_us / 1e3,
                        "rss_kib": e.rss_kib,
                        "status": e.status,
                    }
                    for e in c.execs
                ],
            }
            for c in w.cycles
        ]
        for w in worlds
    }


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="2 rounds: a smoke test")
    ap.add_argument("--runtimes", default="containerd,podman")
    args = ap.parse_args()
    quick_mode(args.quick)
    STOP.arm()
    rounds = 2 if args.quick else args.rounds
    runtimes = args.runtimes.split(",")
    need = {"containerd": ("containerd", "ctr", "runc"), "podman": ("podman", "runc")}
    for runtime in runtimes:
        missing = [b for b in need[runtime] if not have(b)]
        if missing:
            sys.exit(f"{runtime}: {', '.join(missing)} missing (make apt installs them)")
    if "containerd" in runtimes:
        try:
            import cri_api  # noqa: F401  # the test extra's CRI client
        except ImportError:
            sys.exit("container-runtime-interface-api missing (pip install -e '.[test]')")
    notes = [f"load average (1, 5, 15 min) at the start: {loadavg()}"]
    with tempfile.TemporaryDirectory(prefix="cmpr-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        shim = build_shim(workdir)
        our_bin = install_ours(workdir / "install" / "bin", workdir / "install" / "prefix")
        overhead = shim_overhead_ms(workdir, shim, 10 if args.quick else 40)
        notes.append(
            f"the timing shim adds {overhead:.2f} ms to each exec (median, alike for both)"
        )
        worlds: list[World] = []
        for runtime in runtimes:
            for impl in IMPLS:
                (host,) = stack.enter_context(nslib.namespaces("rhost"))
                host.sysctl("net.ipv4.ip_forward", "1")
                data = workdir / f"{runtime}-{impl}"
                dirs = [str(GO_BIN)] if impl == "Go" else [str(our_bin), str(GO_BIN)]
                trace = Trace.make(data / "trace", shim, dirs)
                make = containerd_world if runtime == "containerd" else podman_world
                worlds.append(stack.enter_context(make(impl, host, data, trace)))
        for w in worlds:  # warm up: images, bridges, the Go plugins' shared chains
            for kind in KINDS:
                w.pod(kind, 0, record=False)
        for r in range(rounds):
            for runtime in runtimes:
                pair = [w for w in worlds if w.runtime == runtime]
                for kind in KINDS:
                    for w in rotated(pair, r):
                        w.pod(kind, r + 1, record=True)
            print(f"round {r + 1}/{rounds} done", flush=True)
        time.sleep(1)  # a runtime's late cleanup execs
        for w in worlds:
            w.settle()
        failed = [e for w in worlds for c in w.cycles for e in c.execs if e.status != 0]
        if failed:
            notes.append(f"{len(failed)} plugin execs exited non-zero (raw data has them)")
        notes.append(f"load average at the end: {loadavg()}")
        text = report(worlds, rounds, notes)
        write_raw("runtime_pods.json", raw_data(worlds))
    path = write_result("runtime_pods.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

"""Killing a plugin call as a runtime whose context deadline expired would (Go's
exec.CommandContext SIGKILLs the process it started, nothing else): at a crash point
(tests/harness/crashpoint.py: right before or after a chosen step, deterministic), or
after a delay (random trials that also land where no step is watched).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from tests.harness.chained import Invocation, run
from tests.harness.plugins import REPO, PluginRun


@dataclass(frozen=True)
class Killed:
    delay: float  # seconds after the exec when SIGKILL was sent
    landed: bool  # False: the call had finished before the delay was up
    run: PluginRun  # what the call printed (a finished call's result; a killed one's partial)


def run_and_kill(inv: Invocation, delay: float) -> Killed:
    proc = subprocess.Popen(
        inv.argv,
        env=inv.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    start = time.monotonic()
    assert proc.stdin is not None
    with suppress(BrokenPipeError):
        proc.stdin.write(inv.stdin)  # far below a pipe's buffer: never blocks
        proc.stdin.close()
    proc.stdin = None  # written: communicate() below only collects the output
    time.sleep(max(0.0, delay - (time.monotonic() - start)))
    landed = proc.poll() is None
    if landed:
        proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    return Killed(delay, landed, PluginRun(proc.returncode, out.decode(), err.decode()))


def timed(inv: Invocation) -> tuple[float, PluginRun]:
    """The call's wall time from exec to exit, the way run_and_kill's delay counts."""
    proc = subprocess.Popen(
        inv.argv, env=inv.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    start = time.monotonic()
    out, err = proc.communicate(inv.stdin, timeout=120)
    elapsed = time.monotonic() - start
    return elapsed, PluginRun(proc.returncode, out.decode(), err.decode())


def at_crash_point(
    inv: Invocation, plugin: str, spec: str, env: dict[str, str] | None = None
) -> PluginRun:
    """`inv` (an exec inside a host netns) run through tests.harness.crashpoint: the plugin
    kills itself at `spec` (MODULE:ATTR@N, + for right after)."""
    argv = [*inv.argv[:4], sys.executable, "-m", "tests.harness.crashpoint", plugin, spec]
    full = {**inv.env, **(env or {}), "PYTHONPATH": str(REPO)}
    return run(Invocation(argv, full, inv.stdin))


def crash_points(inv: Invocation, plugin: str, count_file: Path) -> list[str]:
    """Every step of a clean run of `inv` (which it makes, from the current state), each
    before and after: the specs at_crash_point takes."""
    counted = at_crash_point(inv, plugin, "", {"CRASHPOINT_COUNT": str(count_file)})
    assert counted.returncode == 0, f"counting: {counted.stdout} {counted.stderr[-300:]}"
    counts = json.loads(count_file.read_text())
    count_file.unlink()
    return [f"{t}@{n}{w}" for t, c in counts.items() for n in range(1, c + 1) for w in ("", "+")]

"""Running a plugin call and SIGKILLing it after a chosen delay, as a runtime whose
context deadline expired would (Go's exec.CommandContext kills the process it started,
nothing else)."""

from __future__ import annotations

import signal
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass

from tests.harness.chained import Invocation
from tests.harness.plugins import PluginRun


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

"""Killing a plugin call as a runtime whose context deadline expired would (Go's
exec.CommandContext SIGKILLs the process it started, nothing else), at a crash point
(tests/harness/crashpoint.py: right before or after a chosen step, deterministic); and
`Call`, a call in the background, stopped at such a point until the test resumes it
(the races of tests/kernel/test_races.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.harness.chained import Invocation, run
from tests.harness.plugins import REPO, PluginRun
from tests.harness.waiting import blocked_on_flock, proc_state, wait_until


def through_crashpoint(
    inv: Invocation, plugin: str, spec: str, env: dict[str, str] | None = None
) -> Invocation:
    """`inv` (an exec inside a host netns) run through tests.harness.crashpoint: the plugin
    kills (or, with CRASHPOINT_ACTION=stop in `env`, stops) itself at `spec`
    (MODULE:ATTR@N, + for right after)."""
    argv = [*inv.argv[:4], sys.executable, "-m", "tests.harness.crashpoint", plugin, spec]
    return Invocation(argv, {**inv.env, **(env or {}), "PYTHONPATH": str(REPO)}, inv.stdin)


def at_crash_point(
    inv: Invocation, plugin: str, spec: str, env: dict[str, str] | None = None
) -> PluginRun:
    """`inv` run to its kill at `spec` (see through_crashpoint)."""
    return run(through_crashpoint(inv, plugin, spec, env))


def crash_points(inv: Invocation, plugin: str, count_file: Path) -> list[str]:
    """Every step of a clean run of `inv` (which it makes, from the current state), each
    before and after: the specs at_crash_point takes."""
    counted = at_crash_point(inv, plugin, "", {"CRASHPOINT_COUNT": str(count_file)})
    assert counted.returncode == 0, f"counting: {counted.stdout} {counted.stderr[-300:]}"
    counts = json.loads(count_file.read_text())
    count_file.unlink()
    return [f"{t}@{n}{w}" for t, c in counts.items() for n in range(1, c + 1) for w in ("", "+")]


class Call:
    """A plugin call running in the background."""

    def __init__(self, inv: Invocation, plugin: str = "", stop_at: str = "") -> None:
        if stop_at:
            inv = through_crashpoint(inv, plugin, stop_at, {"CRASHPOINT_ACTION": "stop"})
        self.proc = subprocess.Popen(
            inv.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=inv.env,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(inv.stdin)
        self.proc.stdin.close()
        self.proc.stdin = None  # (communicate would flush it)
        self.stop_at = stop_at

    def stopped(self) -> Call:
        """Wait until the call stopped itself at its point (it must not end before)."""
        pid = self.proc.pid
        wait_until(lambda: proc_state(pid) in ("T", "Z", "gone"), f"a stop at {self.stop_at}")
        if proc_state(pid) != "T":
            raise AssertionError(f"ended before reaching {self.stop_at}: {self.result()}")
        return self

    def waiting_for_lock(self) -> Call:
        pid = self.proc.pid
        wait_until(lambda: blocked_on_flock(pid) or self.proc.poll() is not None, "a lock wait")
        if self.proc.poll() is not None:
            raise AssertionError(f"did not wait for the lock: {self.result()}")
        return self

    def resume(self) -> Call:
        os.kill(self.proc.pid, signal.SIGCONT)
        return self

    def result(self, timeout: float = 120) -> PluginRun:
        out, err = self.proc.communicate(timeout=timeout)
        return PluginRun(self.proc.returncode, out.decode(), err.decode())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextmanager
def calls() -> Iterator[list[Call]]:
    """Whatever a failing test leaves running is killed (a stopped call holds its locks)."""
    started: list[Call] = []
    try:
        yield started
    finally:
        for c in started:
            c.kill()

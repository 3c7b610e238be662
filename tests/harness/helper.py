"""Running a resident helper (cnihelper.server) for a test or a whole session.

The helper runs in the machine's own namespaces (it opens nothing there: each worker
enters the namespaces of the plugin process it serves); its socket, stats file (one line
per served call, see tests.harness.helper_stats) and log live in a temporary directory
and everything is stopped and removed afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from tests.harness.plugins import REPO


class Helper:
    def __init__(self, workdir: Path, args: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.args = args
        self.socket = str(workdir / "helper.sock")
        self.stats_file = workdir / "stats.jsonl"
        self.log_file = workdir / "helper.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.harness.helper_stats", "--socket", self.socket,
                 "--stats", str(self.stats_file), *self.args],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=REPO,
                # Anything the helper would put in TMPDIR goes in here (tests look).
                env={**os.environ, "TMPDIR": str(self.workdir)},
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cni-meta-helper exited: {self.log()}")
            if self.listening() and self.children():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"cni-meta-helper did not come up: {self.log()}")

    def listening(self) -> bool:
        """Whether the helper's socket is listening, read from /proc/PID/net/unix (flag
        0x10000 is __SO_ACCEPTCON). Not a probe connection: a spare would take that for
        a request, decline it and be replaced, so the set of children would still move."""
        assert self.proc is not None
        try:
            with open(f"/proc/{self.proc.pid}/net/unix") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 8 and fields[7] == self.socket:
                        return int(fields[3], 16) & 0x10000 != 0
        except (OSError, ValueError):
            pass
        return False

    def children(self) -> set[int]:
        """The helper's forked processes (spares and running workers)."""
        assert self.proc is not None
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(self.proc.pid)],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        return {int(x) for x in out.split()}

    def stats(self) -> list[dict[str, Any]]:
        if not self.stats_file.exists():
            return []
        return [json.loads(line) for line in self.stats_file.read_text().splitlines()]

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        children = self.children() if self.proc.poll() is None else set()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in children:  # the helper kills its spares; make sure of it
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc = None


@contextmanager
def running_helper(*args: str) -> Iterator[Helper]:
    with tempfile.TemporaryDirectory(prefix="cni-meta-helper-") as d:
        os.chmod(d, 0o755)  # so that a test's unprivileged client can reach the socket
        helper = Helper(Path(d), args)
        helper.start()
        try:
            yield helper
        finally:
            helper.stop()


# --- `pytest -p tests.harness.helper` runs a whole session through one helper -----------

_session: dict[str, Any] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.geteuid() != 0:
        return
    cm = running_helper()
    helper = cm.__enter__()
    _session.update(cm=cm, helper=helper)
    os.environ["CNI_META_HELPER"] = helper.socket


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    helper: Helper | None = _session.get("helper")
    if helper is None:
        return
    served = helper.stats()
    os.environ.pop("CNI_META_HELPER", None)
    _session["cm"].__exit__(None, None, None)
    by_plugin: dict[str, int] = {}
    for call in served:
        by_plugin[call["plugin"]] = by_plugin.get(call["plugin"], 0) + 1
    print(f"\ncni-meta-helper served {len(served)} plugin calls: {by_plugin}")
    if not served and exitstatus == 0:
        # The point of the run is that the plugins went through the helper.
        session.exitstatus = 1
        print("cni-meta-helper served no calls: the session did not test what it meant to")

"""Shared benchmark plumbing: exec timing, interleaved rounds, medians, result tables.

Figures are medians of several interleaved runs (ours and Go's alternate, so that noise
from the shared machine hits both alike) and are reported as ratios ours/Go.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Where results go; BENCH_RESULTS=DIR sends a whole run elsewhere (e.g. a trial run).
RESULTS = Path(os.environ.get("BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
# --quick runs (smoke tests) write here instead: bench/results/raw/ is not committed.
QUICK_RESULTS = RESULTS / "raw" / "quick"
_results = [RESULTS]


def clean_exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so that every namespace and podman world made
    so far is removed (the default action would end the process without cleaning up)."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def quick_mode(on: bool) -> None:
    """Send this run's output to QUICK_RESULTS, so a smoke test never replaces real figures.

    Every bench calls this first thing; it also makes SIGTERM clean up like Ctrl-C.
    """
    clean_exit_on_sigterm()
    _results[0] = QUICK_RESULTS if on else RESULTS


def results_dir() -> Path:
    _results[0].mkdir(parents=True, exist_ok=True)
    return _results[0]


def exec_seconds(argv: Sequence[str], env: dict[str, str], stdin: bytes) -> float:
    """Wall time of one process from fork to exit; raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.run(list(argv), input=stdin, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {proc.stdout!r} {proc.stderr!r}")
    return elapsed


@dataclass
class Series:
    name: str
    samples: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples) * 1000


def interleaved(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, Series]:
    """Run every case once per round, in turn, `rounds` times."""
    out = {name: Series(name) for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            out[name].samples.append(fn())
    return out


def machine_line() -> str:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (
        f"{time.strftime('%Y-%m-%d')}, {platform.node()}, {os.cpu_count()} cores ({cpu}), "
        f"kernel {platform.release()}, Python {platform.python_version()}"
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def write_result(name: str, text: str) -> Path:
    path = results_dir() / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------- exec'ing plugins

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
GO_BIN = Path("/usr/lib/cni")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def add_launcher_args(ap: argparse.ArgumentParser) -> None:
    """The options every bench that runs our plugins shares: --launcher."""
    ap.add_argument(
        "--launcher",
        choices=("installed", "venv"),
        default="installed",
        help="ours as deploy/install.sh installs it (default) or the venv's console scripts",
    )


def our_plugins(launcher: str, workdir: Path) -> Path:
    """The directory holding our plugin executables for --launcher `launcher`."""
    if launcher != "installed":
        return VENV_BIN
    from tests.harness.runtimes import install_ours

    return install_ours(workdir / "bin", workdir / "prefix")


def build_spawner(workdir: Path) -> str:
    """Compile bench/spawn.c (static where the toolchain allows: a smaller RSS floor)."""
    out = workdir / "spawn"
    src = Path(__file__).with_name("spawn.c")
    errors = b""
    for flags in (["-static"], []):
        proc = subprocess.run(
            ["cc", "-O2", "-Wall", *flags, "-o", str(out), str(src)], capture_output=True
        )
        if proc.returncode == 0:
            return str(out)
        errors = proc.stderr
    raise RuntimeError(f"cannot compile {src} (gcc is in the Makefile's apt list): {errors!r}")


@dataclass
class Call:
    """One exec'd process, as bench/spawn.c saw it."""

    seconds: float
    rss_kib: int
    cpu_seconds: float
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def ms(self) -> float:
        return self.seconds * 1000

    @property
    def rss_mib(self) -> float:
        return self.rss_kib / 1024

    def json(self) -> Any:
        return json.loads(self.stdout) if self.stdout.strip() else None


class Spawner:
    """Execs programs through bench/spawn.c: wall time, peak RSS and CPU of the program only.

    The process is created in the caller's network namespace: benches enter their
    throwaway host netns with Netns.entered() (setns on the calling thread) around calls,
    so no `ip netns exec` (its own fork, exec and /sys remount) is in any figure.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, argv: Sequence[str], env: dict[str, str], stdin: bytes) -> Call:
        r, w = os.pipe()
        try:
            proc = subprocess.run(
                [self.path, str(w), *argv], input=stdin, env=env, capture_output=True,
                pass_fds=(w,), check=False,
            )  # fmt: skip
        finally:
            os.close(w)
        with os.fdopen(r, "rb") as f:
            report = f.read().split()
        if proc.returncode != 0 or len(report) != 5:
            raise RuntimeError(f"spawn {argv[0]} failed: {proc.stderr!r}")
        ns, rss, user, system, status = (int(x) for x in report)
        return Call(
            ns / 1e9,
            rss,
            (user + system) / 1e6,
            os.waitstatus_to_exitcode(status),
            proc.stdout,
            proc.stderr,
        )

    def ok(self, argv: Sequence[str], env: dict[str, str], stdin: bytes) -> Call:
        call = self(argv, env, stdin)
        if call.returncode != 0:
            what = env.get("CNI_COMMAND", "")
            raise RuntimeError(
                f"{argv[0]} {what} failed ({call.returncode}): "
                f"{call.stdout.decode(errors='replace')} {call.stderr.decode(errors='replace')}"
            )
        return call


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rotated(items: Sequence[T], k: int) -> list[T]:
    """items started at position k: the order of cases changes from round to round."""
    k %= max(1, len(items))
    return [*items[k:], *items[:k]]


def header(title: str, how: str) -> str:
    return f"# {title}\n\n{machine_line()}.\n\n{how}\n\n"


def write_raw(name: str, data: Any) -> Path:
    """Every sample, for whoever wants more than medians (bench/results/raw/ is not committed)."""
    raw = results_dir() / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    path = raw / name
    path.write_text(json.dumps(data, indent=1))
    return path


# ----------------------------------------------------------------------------------- plots


def bar_chart(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    ylabel: str,
    *,
    log: bool = False,
    hline: float | None = None,
    ax: Any = None,
) -> None:
    """Grouped bars: one group per label, one bar per series. Writes `path` unless `ax`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) * len(series) / 2 + 3), 4.5))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(groups)))
    tilt = len(groups) > 8 and not any("\n" in g for g in groups)
    ax.set_xticklabels(groups, rotation=30 if tilt else 0, ha="right" if tilt else "center")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend()
    if fig is not None:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def can_plot() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib missing (pip install -e '.[bench]'): no PNG written")
        return False
    return True

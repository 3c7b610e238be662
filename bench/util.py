"""Shared benchmark plumbing: exec timing, interleaved rounds, medians, result tables.

Figures are medians of several interleaved runs (ours and Go's alternate, so that noise
from the shared machine hits both alike) and are reported as ratios ours/Go.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


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
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(text)
    return path

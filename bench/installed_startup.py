"""Startup of the *installed* portmap (what a runtime execs) vs Go's: VERSION, medians.

Installs with deploy/install.sh into a temporary bin dir, in the two shapes users get:
the venv launcher (`make install`; here reusing the test venv) and the relocatable bundle
(the Kubernetes DaemonSet), beside the venv's bare interpreter (`python -IS -c pass`):
the floor of any Python plugin. VERSION touches no network namespace at all.

  python bench/installed_startup.py [--rounds N] [--quick]   -> bench/results/installed_startup.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.util import (
    exec_seconds,
    interleaved,
    machine_line,
    markdown_table,
    quick_mode,
    write_result,
)

REPO = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent
GO_PORTMAP = "/usr/lib/cni/portmap"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="a few rounds: a smoke test")
    args = ap.parse_args()
    quick_mode(args.quick)
    if args.quick:
        args.rounds = 3
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        install = str(REPO / "deploy" / "install.sh")
        subprocess.run(
            [install, "-q", "--venv", str(VENV), "--bin-dir", f"{work}/venv-bin",
             "--prefix", f"{work}/venv-prefix"],
            check=True,
        )  # fmt: skip
        site = next((VENV / "lib").glob("python3*/site-packages"))
        subprocess.run(
            [str(REPO / "deploy" / "build-bundle.sh"), f"{work}/bundle", "--python",
             "/usr/bin/python3", "--deps-from", str(site)],
            check=True, capture_output=True,
        )  # fmt: skip
        subprocess.run(
            [install, "-q", "--bundle", f"{work}/bundle", "--bin-dir", f"{work}/bundle-bin",
             "--prefix", f"{work}/bundle-prefix"],
            check=True,
        )  # fmt: skip
        stdin = json.dumps({"cniVersion": "1.0.0"}).encode()
        env = {"CNI_COMMAND": "VERSION"}  # what a runtime may leave us: next to nothing
        cases: dict[str, Callable[[], float]] = {
            "Go portmap": lambda: exec_seconds([GO_PORTMAP], env, stdin),
            "ours, venv launcher (make install)": lambda: exec_seconds(
                [f"{work}/venv-bin/portmap"], env, stdin
            ),
            "ours, bundle launcher (DaemonSet)": lambda: exec_seconds(
                [f"{work}/bundle-bin/portmap"], env, stdin
            ),
            # The floor under the venv launcher: its interpreter doing nothing.
            "bare interpreter (python -IS -c pass)": lambda: exec_seconds(
                [str(VENV / "bin" / "python"), "-IS", "-c", "pass"], env, stdin
            ),
        }
        for fn in cases.values():
            fn()
        series = interleaved(cases, args.rounds)
    go = series["Go portmap"].median_ms
    rows = [(name, s.median_ms, s.median_ms / go) for name, s in series.items()]
    text = (
        "# Installed portmap: VERSION startup, ours vs Go\n\n"
        f"{machine_line()}; {args.rounds} interleaved rounds, medians; empty environment.\n\n"
        + markdown_table(("executable", "median ms", "ratio vs Go"), rows)
        + "\n"
    )
    path = write_result("installed_startup.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

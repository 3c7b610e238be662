"""Startup cost of a plugin call: cold VERSION and a pass-through ADD, ours vs Go's tuning.

Every container start execs each plugin of its list, so interpreter start and imports are
paid every time. Runs in throwaway namespaces (a host netns where the plugins run, a
container netns with an eth0), never in the machine's own.

  python bench/startup.py [--rounds N] [--quick]   -> bench/results/startup.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from tests.harness import netns as nslib

VENV_BIN = Path(sys.executable).parent
GO_TUNING = "/usr/lib/cni/tuning"
REPO = Path(__file__).resolve().parents[1]


def lean_launcher(workdir: Path, plugin: str) -> str:
    """What an installed plugin can look like: the interpreter in isolated mode, no site.

    -I ignores the caller's environment and cwd, -S skips site's .pth processing; the
    launcher puts the project and the venv's site-packages on sys.path itself.
    """
    site = next((VENV_BIN.parent / "lib").glob("python3*/site-packages"))
    path = workdir / f"{plugin}-lean"
    path.write_text(
        f"#!{VENV_BIN / 'python'} -IS\n"
        f"import sys\nsys.path[:0] = [{str(REPO)!r}, {str(site)!r}]\n"
        f"from {plugin}.__main__ import main\nmain()\n"
    )
    path.chmod(0o755)
    return str(path)


def import_totals() -> dict[str, float]:
    """python -X importtime totals (ms) for what each path imports."""
    out = {}
    for label, code in (
        ("interpreter only (-I -S)", "pass"),
        ("common.skel (VERSION path)", "import common.skel"),
        ("tuning.__main__", "import tuning.__main__"),
        ("common.config+result (ADD path)", "import common.skel, common.config, common.result"),
    ):
        flags = ["-I", "-S"] if label.startswith("interpreter") else []
        env = {"PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, *flags, "-X", "importtime", "-c", code],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        total = 0
        for line in proc.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
            if m and len(m.group(3)) == 1:  # top-level imports only: their cumulative time
                total += int(m.group(2))
        out[label] = total / 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="a few rounds: a smoke test")
    args = ap.parse_args()
    quick_mode(args.quick)
    if args.quick:
        args.rounds = 3
    base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    with tempfile.TemporaryDirectory() as tmp, nslib.namespaces("bhost", "bctr") as (host, ctr):
        work = Path(tmp)
        host.ip("link", "add", "veth-b0", "type", "veth", "peer", "name", "eth0", "netns", ctr.name)
        ours = str(VENV_BIN / "tuning")
        lean = lean_launcher(work, "tuning")
        version_in = json.dumps({"cniVersion": "1.0.0"}).encode()
        prev = {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": ctr.path}],
            "ips": [{"address": "10.0.0.2/24", "interface": 0}],
        }
        add_conf = json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "bench",
                "type": "tuning",
                "dataDir": str(work / "tuning-data"),
                "prevResult": prev,
            }
        ).encode()
        ver_env = {**base_env, "CNI_COMMAND": "VERSION"}
        add_env = {
            **base_env,
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": "bench1",
            "CNI_NETNS": ctr.path,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/usr/lib/cni",
            "CNI_META_STATE_ROOT": str(work / "state"),
        }
        with host.entered():
            cases: dict[str, Callable[[], float]] = {
                "VERSION go": lambda: exec_seconds([GO_TUNING], ver_env, version_in),
                "VERSION ours (venv script)": lambda: exec_seconds([ours], ver_env, version_in),
                "VERSION ours (lean launcher)": lambda: exec_seconds([lean], ver_env, version_in),
                "ADD go": lambda: exec_seconds([GO_TUNING], add_env, add_conf),
                "ADD ours (venv script)": lambda: exec_seconds([ours], add_env, add_conf),
                "ADD ours (lean launcher)": lambda: exec_seconds([lean], add_env, add_conf),
            }
            for fn in cases.values():  # warm the page cache once
                fn()
            series = interleaved(cases, args.rounds)
    go_version = series["VERSION go"].median_ms
    go_add = series["ADD go"].median_ms
    rows = []
    for name, s in series.items():
        base = go_version if name.startswith("VERSION") else go_add
        rows.append((name, s.median_ms, s.median_ms / base))
    imports = import_totals()
    text = (
        "# Startup: cold VERSION and pass-through ADD (tuning), ours vs Go\n\n"
        f"{machine_line()}; {args.rounds} interleaved rounds, medians.\n\n"
        + markdown_table(("case", "median ms", "ratio vs Go"), rows)
        + "\n\n## Import time (python -X importtime, cumulative, ms)\n\n"
        + markdown_table(("what", "ms"), list(imports.items()))
        + "\n"
    )
    path = write_result("startup.md", text)
    print(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()

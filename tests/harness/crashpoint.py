"""Run a plugin that SIGKILLs itself at a chosen step: deterministic crash points.

    python -m tests.harness.crashpoint PLUGIN [MODULE:ATTR@N[+]]

runs PLUGIN's executable code (its __main__.main, in this process) after wrapping the
function MODULE:ATTR (e.g. `common.libnftables:Context.run`,
`common.statedir:StateDir.write_json`) so that its N-th call kills the process with SIGKILL
right before it runs, or right after it returned with a trailing `+`. Kills at random
moments rarely land in the short windows between two kernel changes; these land exactly
there, at every step (tests/harness/crash.py runs them).

Without a crash point, or with CRASHPOINT_COUNT=path in the environment, nothing is
killed and the number of calls of every watched function is written to that file as
JSON at exit: how many crash points a clean call has.

With CRASHPOINT_ACTION=stop the process SIGSTOPs itself there instead: it keeps every
lock and socket it holds until the test sends SIGCONT, which makes interleavings of two
plugin calls deterministic (tests/kernel/test_races.py). The point may then be any function,
watched or not.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import posix
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

# The steps worth dying at, per plugin: every call that changes the kernel or a state
# file (and the libnftables calls, reads included: portmap reads between its writes).
# os.rename is where a state file write becomes visible: dying just before it leaves a
# written but not yet renamed file.
STATE_STEPS = (
    "common.statedir:StateDir.write_json",
    "common.statedir:StateDir.remove",
    "os:rename",
)
WATCHED = {
    "portmap": (
        "portmap.localnet:Registry.claim",
        "portmap.localnet:Registry._put_back",
        "common.libnftables:Context.run",
        "portmap.kernel:XtablesKernel.run",
        *STATE_STEPS,
    ),
    "bandwidth": ("bandwidth.tc:Rtnl._apply_one", *STATE_STEPS),
    "flatnet": (
        "common.rtnl:RtnlSocket.exchange",
        "common.libnftables:Context.run",
        "flatnet.ipam:spawn",
        "flatnet.links:set_sysctl",
        *STATE_STEPS,
    ),
    "tuning": (
        "tuning.apply:write_sysctl",
        "tuning.apply:change_link",
        *STATE_STEPS,
    ),
    # The package's name (flatnet-ipam's executable runs flatnet_ipam.__main__): its lease
    # files, the cursor, and what it remembers of the lease directory.
    "flatnet_ipam": (
        "flatnet_ipam.store:LeaseStore.claim",
        "flatnet_ipam.store:LeaseStore.free",
        "flatnet_ipam.store:LeaseStore.write_cursor",
        "flatnet_ipam.store:LeaseStore.note_seen",
        *STATE_STEPS,
    ),
}


def _owner_and_name(target: str) -> tuple[Any, str]:
    module_name, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def _wrap(
    target: str, counts: dict[str, int], kill_at: int, after: bool, sig: int = signal.SIGKILL
) -> None:
    owner, name = _owner_and_name(target)
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[target] += 1
        due = counts[target] == kill_at
        if due and not after:
            os.kill(os.getpid(), sig)
        result = original(*args, **kwargs)
        if due and after:
            os.kill(os.getpid(), sig)
        return result

    setattr(owner, name, wrapper)


def main() -> None:
    plugin = sys.argv[1]
    spec = sys.argv[2] if len(sys.argv) > 2 else ""
    point, _, n = spec.partition("@")
    after = n.endswith("+")
    kill_at = int(n.rstrip("+") or 0)
    sig = signal.SIGSTOP if os.environ.get("CRASHPOINT_ACTION") == "stop" else signal.SIGKILL
    targets = list(WATCHED[plugin])
    if point and point not in targets:
        targets.append(point)
    counts = dict.fromkeys(targets, 0)
    for target in targets:
        _wrap(target, counts, kill_at if target == point else 0, after, sig)
    count_file = os.environ.get("CRASHPOINT_COUNT")
    if count_file:
        pid = os.getpid()

        def report() -> None:
            if os.getpid() == pid:  # not in a forked child
                with open(count_file, "w") as f:
                    json.dump(counts, f)

        atexit.register(report)
        # A plugin ends with posix._exit once its answer is out (common.finish), which
        # runs no atexit handler: report on that way out too.
        plain_exit = posix._exit

        def report_and_exit(status: int) -> NoReturn:
            report()
            plain_exit(status)

        posix._exit = report_and_exit
    sys.argv = [plugin]
    importlib.import_module(f"{plugin}.__main__").main()


if __name__ == "__main__":
    main()

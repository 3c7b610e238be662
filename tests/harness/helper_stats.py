"""The resident helper with one JSON line per served call, for tests and benches.

    python -m tests.harness.helper_stats --stats FILE [cni-meta-helper options]

runs cnihelper.server's main() with a Server whose workers append, after answering the
plugin (so it does not wait for this), the plugin, verb, exit status, time inside the
worker ("ms", skel.run only), its ru_maxrss ("maxrss_kb", including the pages it shares
with the helper) and its private memory at the end of the call ("private_kb", what the
call added). The production helper records nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import sys
import time

from cnihelper import server


class StatsServer(server.Server):
    stats = ""
    call: dict[str, object] | None = None

    def _run(self, name: str, environ: dict[bytes, bytes], umask: int, conn: socket.socket) -> int:
        started = time.perf_counter()
        status = super()._run(name, environ, umask, conn)
        self.call = {
            "plugin": name,
            "command": environ.get(b"CNI_COMMAND", b"").decode(errors="replace"),
            "status": status,
            "ms": round((time.perf_counter() - started) * 1000, 3),
        }
        return status

    def _worker(self, conn: socket.socket) -> int:
        status = super()._worker(conn)
        if self.call is not None:
            with contextlib.suppress(OSError):  # the worker's status is the plugin's, whatever
                self.call["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                self.call["private_kb"] = private_kb()
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                fd = os.open(self.stats, flags, 0o600)
                os.write(fd, json.dumps(self.call).encode() + b"\n")
                os.close(fd)
        return status


def private_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        fields = [line.split() for line in f]
    return sum(int(f[1]) for f in fields if f[0] in ("Private_Clean:", "Private_Dirty:"))


def main(argv: list[str]) -> None:
    at = argv.index("--stats")
    StatsServer.stats = os.path.abspath(argv[at + 1])
    server.Server = StatsServer  # type: ignore[misc]  # what server.main() constructs
    server.main(argv[:at] + argv[at + 2 :])


if __name__ == "__main__":
    main(sys.argv[1:])

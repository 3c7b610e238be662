"""Logging to a file, never to stdout (stdout belongs to the CNI protocol).

The file is named by the config key "logFile" or the environment variable
CNI_META_LOG_FILE; with neither, nothing is logged. Every line carries the plugin, the verb
and the attachment, so one file can serve all plugins of a node. A record is always one
line: control characters in it are escaped (common.errors.escape), whatever the message
quotes (a CNI_NETNS, a config value, a tool's output, a traceback).
"""

from __future__ import annotations

import posix  # what os wraps: a call that passes through imports no os
import time

from common.errors import escape

LOG_ENV = "CNI_META_LOG_FILE"
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


def timestamp(now: float) -> str:
    """RFC 3339 local time with microseconds and the UTC offset, e.g.
    2026-11-28T10:50:01.123456+01:00: calls of one container start are milliseconds
    apart, and nodes log in different zones."""
    local = time.localtime(now)
    micros = int((now % 1) * 1_000_000)
    offset = local.tm_gmtoff // 60
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset), 60)
    clock = time.strftime("%Y-%m-%dT%H:%M:%S", local)
    return f"{clock}.{micros:06d}{sign}{hours:02d}:{minutes:02d}"


class Log:
    def __init__(self, path: str = "", prefix: str = "", level: str = "info") -> None:
        self.path = path
        self.prefix = prefix
        self.threshold = LEVELS.get(level.lower(), 20)

    def _write(self, level: str, msg: str) -> None:
        if not self.path or LEVELS[level] < self.threshold:
            return
        stamp = timestamp(time.time())
        # Every record is one line, whatever a message quotes: see escape().
        line = f"{stamp} {posix.getpid()} {level.upper()} {escape(self.prefix)} {escape(msg)}\n"
        try:
            flags = posix.O_WRONLY | posix.O_APPEND | posix.O_CREAT | posix.O_CLOEXEC
            fd = posix.open(self.path, flags, 0o600)
            try:
                posix.write(fd, line.encode("utf-8", "replace"))
            finally:
                posix.close(fd)
        except OSError:
            pass  # logging must never be the reason a container fails to start

    def debug(self, msg: str) -> None:
        self._write("debug", msg)

    def info(self, msg: str) -> None:
        self._write("info", msg)

    def warning(self, msg: str) -> None:
        self._write("warning", msg)

    def error(self, msg: str) -> None:
        self._write("error", msg)

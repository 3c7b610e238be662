"""tuning: table of contents.

ADD     sets sysctls and link attributes in the container namespace, saving the originals
DEL     restores the originals (sysctls included) and forgets them
CHECK   compares the live values with the config
GC      forgets the saved originals of attachments the runtime no longer has
STATUS  ready when the allowlist parses and dataDir is writable

The verbs live in tuning.verbs, imported on first use: VERSION and the banner (podman
calls VERSION for every plugin on every command) pay nothing for them.
"""

from __future__ import annotations

import os
import sys

from common.skel import MAX_STDIN_BYTES, Plugin, Request, run

TYPE_CHECKING = False  # avoids importing typing at runtime
if TYPE_CHECKING:
    from common.result import Result


def plugin(stdin: bytes = b"") -> Plugin:
    """ADD and CHECK also get stdin's bytes: json.loads keeps only the last of two equal
    keys, and a sysctl key given twice must be refused (as Go's tuning does)."""

    def add(request: Request) -> Result:
        from tuning.verbs import add

        return add(request, stdin)

    def check(request: Request) -> None:
        from tuning.verbs import check

        check(request, stdin)

    return Plugin(name="tuning", add=add, delete=delete, check=check, gc=gc, status=status)


def delete(request: Request) -> None:
    from tuning.verbs import delete

    delete(request)


def gc(request: Request) -> None:
    from tuning.verbs import gc

    gc(request)


def status(request: Request) -> None:
    from tuning.verbs import status

    status(request)


def main() -> None:
    if os.environ.get("CNI_COMMAND") not in ("ADD", "CHECK"):
        sys.exit(run(plugin()))  # skel reads stdin itself; the banner must not wait for it
    stdin = sys.stdin.buffer.read(MAX_STDIN_BYTES + 1)
    import io

    sys.exit(run(plugin(stdin), stdin=io.BytesIO(stdin)))


if __name__ == "__main__":
    main()

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

from common.skel import Plugin, Request
from common.skel import main as run_plugin

TYPE_CHECKING = False  # avoids importing typing at runtime
if TYPE_CHECKING:
    from common.result import Result


def add(request: Request) -> Result:
    from tuning.verbs import add

    return add(request)


def delete(request: Request) -> None:
    from tuning.verbs import delete

    delete(request)


def check(request: Request) -> None:
    from tuning.verbs import check

    check(request)


def gc(request: Request) -> None:
    from tuning.verbs import gc

    gc(request)


def status(request: Request) -> None:
    from tuning.verbs import status

    status(request)


PLUGIN = Plugin(name="tuning", add=add, delete=delete, check=check, gc=gc, status=status)


def main() -> None:
    run_plugin(PLUGIN)


if __name__ == "__main__":
    main()

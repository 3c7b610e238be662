"""tuning: table of contents. Until its own issue lands this is a pass-through plugin."""

from __future__ import annotations

from common.skel import Plugin, Request
from common.skel import main as run_plugin

TYPE_CHECKING = False  # avoids importing typing at runtime
if TYPE_CHECKING:
    from common.result import Result


def add(request: Request) -> Result | None:
    return None  # pass prevResult through, in the config's cniVersion


def delete(request: Request) -> None:
    return None


def check(request: Request) -> None:
    return None


PLUGIN = Plugin(name="tuning", add=add, delete=delete, check=check)


def main() -> None:
    run_plugin(PLUGIN)


if __name__ == "__main__":
    main()

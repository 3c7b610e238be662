"""bandwidth: table of contents.

Limits a container's traffic with tbf: container ingress on the host-side veth, container
egress on an ifb that the veth's ingress is redirected to (as upstream); inside the
container netns when its interface is not a veth. The verbs live in bandwidth.verbs,
imported on first use so that VERSION (podman calls it constantly) stays cheap.
"""

from __future__ import annotations

from common.skel import Plugin, Request
from common.skel import main as run_plugin

TYPE_CHECKING = False  # avoids importing typing at runtime
if TYPE_CHECKING:
    from common.result import Result


def add(request: Request) -> Result | None:
    from bandwidth import verbs

    return verbs.add(request)


def delete(request: Request) -> None:
    from bandwidth import verbs

    verbs.delete(request)


def check(request: Request) -> None:
    from bandwidth import verbs

    verbs.check(request)


def gc(request: Request) -> None:
    from bandwidth import verbs

    verbs.gc(request)


def status(request: Request) -> None:
    from bandwidth import verbs

    verbs.status(request)


PLUGIN = Plugin(name="bandwidth", add=add, delete=delete, check=check, gc=gc, status=status)


def main() -> None:
    run_plugin(PLUGIN)


if __name__ == "__main__":
    main()

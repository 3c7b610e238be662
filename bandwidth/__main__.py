"""bandwidth: table of contents.

Limits a container's traffic with tbf: container ingress on the host-side veth, container
egress on an ifb that the veth's ingress is redirected to (as upstream); inside the
container netns when its interface is not a veth. The verbs live in bandwidth.verbs,
imported on first use so that VERSION (podman calls it constantly) stays cheap.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.skel import Plugin


def plugin() -> Plugin:
    from common.skel import verbs_module_plugin

    return verbs_module_plugin("bandwidth")


def main() -> None:
    from common import entry

    entry("bandwidth", plugin)


if __name__ == "__main__":
    main()

"""bandwidth: table of contents.

Limits a container's traffic with tbf: container ingress on the host-side veth, container
egress on an ifb that the veth's ingress is redirected to (as upstream); inside the
container netns when its interface is not a veth. The verbs live in bandwidth.verbs,
imported on first use so that VERSION (podman calls it constantly) stays cheap.
"""

from __future__ import annotations

from common.skel import Plugin, lazy
from common.skel import main as run_plugin

PLUGIN = Plugin(
    name="bandwidth",
    add=lazy("bandwidth.verbs:add"),
    delete=lazy("bandwidth.verbs:delete"),
    check=lazy("bandwidth.verbs:check"),
    gc=lazy("bandwidth.verbs:gc"),
    status=lazy("bandwidth.verbs:status"),
)


def main() -> None:
    run_plugin(PLUGIN)


if __name__ == "__main__":
    main()

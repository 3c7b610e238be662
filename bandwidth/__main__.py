"""bandwidth: table of contents.

Limits a container's traffic with tbf: container ingress on the host-side veth, container
egress on an ifb that the veth's ingress is redirected to (as upstream); inside the
container netns when its interface is not a veth. The verbs live in bandwidth.verbs,
imported on first use so that VERSION (podman calls it constantly) stays cheap.
"""


def main() -> None:
    from common import entry

    entry("bandwidth")


if __name__ == "__main__":
    main()

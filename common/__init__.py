"""CNI plumbing shared by the meta-plugins (docs/architecture.md). Nothing here knows about
ports, rates or sysctls, and nothing here imports a heavy library at import time: every
container start pays for what this package imports.
"""


def entry(name: str) -> None:
    """What every plugin executable runs (its __main__.main): the plugin `name`
    (common.skel.Plugin), in this process, exiting with its status.

    Here rather than in a module of its own: this package is imported on every call anyway,
    and a module more would cost VERSION (podman's most frequent call) another file lookup.
    """
    import sys

    from common.skel import Plugin, run

    sys.exit(run(Plugin(name)))

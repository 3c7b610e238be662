"""CNI plumbing shared by the meta-plugins (docs/architecture.md). Nothing here knows about
ports, rates or sysctls, and nothing here imports a heavy library at import time: every
container start pays for what this package imports.
"""


def entry(name: str) -> None:
    """What every plugin executable runs (its __main__.main): a resident helper, when one
    takes the call, runs it with everything preloaded (and this process exits with its
    status); otherwise this process runs the plugin `name` (common.skel.Plugin).

    Here rather than in a module of its own: this package is imported on every call anyway,
    and a module more would cost VERSION (podman's most frequent call) another file lookup.
    """
    from common.fastpath import delegate

    delegate(name)
    import sys

    from common.skel import Plugin, run

    sys.exit(run(Plugin(name)))

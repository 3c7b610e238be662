"""CNI plumbing shared by the meta-plugins (docs/architecture.md). Nothing here knows about
ports, rates or sysctls, and nothing here imports a heavy library at import time: every
container start pays for what this package imports.
"""


def entry(name: str) -> None:
    """What every plugin executable runs (its __main__.main): runs the plugin `name`
    (common.skel.Plugin) and ends the process with its status.

    Here rather than in a module of its own: this package is imported on every call anyway,
    and a module more would cost VERSION (podman's most frequent call) another file lookup.
    """
    from common.skel import Plugin, run

    finish(run(Plugin(name)))


def finish(status: int) -> None:
    """End the process with `status` once the answer is out, without the interpreter's
    teardown: freeing every module and object (pyroute2's message classes above all) only
    delays the runtime, which waits for our exit. Nothing that matters is skipped: the
    answer and stderr are flushed here, log lines are written unbuffered (common.log),
    state files are renamed into place before the verb returns, and locks are fd-based,
    released by the kernel. If a stream cannot be flushed (the runtime closed the pipe),
    the status says the call failed, as the interpreter's own exit would."""
    import posix
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120  # what CPython exits with when its final flush fails
    posix._exit(status)

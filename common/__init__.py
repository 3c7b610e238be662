"""CNI plumbing shared by the plugins (docs/architecture.md): nothing here knows about ports,
rates or sysctls, or imports a heavy library at import time (every call pays for it)."""


def entry(name: str) -> None:
    """What every plugin executable's __main__.main runs: the plugin `name`, then the end
    of the process. Here, not in a module of its own: this package is imported on every
    call anyway, and a module more would cost VERSION (podman's most frequent call)."""
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

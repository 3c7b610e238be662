"""CNI plumbing shared by the meta-plugins: env and stdin parsing, verb dispatch, errors,
versions and result conversion, netns entry, state files and logging.

Nothing here knows about ports, rates or sysctls, and nothing here imports a heavy library
at import time: every container start pays for what this package imports.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from common.skel import Plugin


def entry(name: str, plugin: Callable[[], Plugin]) -> None:
    """What every plugin executable runs (its __main__.main): the plugin `name`, whose
    table of contents `plugin()` returns; exits.

    Here rather than in a module of its own: this package is imported on every call anyway,
    and a module more would cost VERSION (podman's most frequent call) another file lookup.
    """
    # A resident helper, when there is one, runs this call with everything preloaded
    # (and exits); otherwise this process does the work itself.
    from common.fastpath import delegate

    delegate(name)
    from common.skel import main as run_plugin

    run_plugin(plugin())

"""CNI plumbing shared by the meta-plugins (docs/architecture.md). Nothing here knows about
ports, rates or sysctls, and nothing here imports a heavy library at import time: every
container start pays for what this package imports.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from common.skel import Plugin


def entry(name: str, plugin: Callable[[], Plugin]) -> None:
    """What every plugin executable runs (its __main__.main): a resident helper, when one
    takes the call, runs it with everything preloaded (and this process exits with its
    status); otherwise this process runs the plugin `name`, whose table `plugin()` gives.

    Here rather than in a module of its own: this package is imported on every call anyway,
    and a module more would cost VERSION (podman's most frequent call) another file lookup.
    """
    from common.fastpath import delegate

    delegate(name)
    from common.skel import main as run_plugin

    run_plugin(plugin())

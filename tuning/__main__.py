"""tuning: table of contents.

ADD     sets sysctls and link attributes in the container namespace, saving the originals
DEL     restores the originals (sysctls included) and forgets them
CHECK   compares the live values with the config
GC      forgets the saved originals of attachments the runtime no longer has
STATUS  ready when the allowlist parses and dataDir is writable

The verbs live in tuning.verbs, imported on first use: VERSION and the banner (podman
calls VERSION for every plugin on every command) pay nothing for them.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.skel import Plugin


def plugin() -> Plugin:
    from common.skel import verbs_module_plugin

    return verbs_module_plugin("tuning")


def main() -> None:
    from common import entry

    entry("tuning", plugin)


if __name__ == "__main__":
    main()

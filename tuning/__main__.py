"""tuning: table of contents.

ADD     sets sysctls and link attributes in the container namespace, saving the originals
DEL     restores the originals (sysctls included) and forgets them
CHECK   compares the live values with the config
GC      forgets the saved originals of attachments the runtime no longer has
STATUS  ready when the allowlist parses and dataDir is writable

The verbs live in tuning.verbs, imported on first use: VERSION and the banner (podman
calls VERSION for every plugin on every command) pay nothing for them.
"""


def main() -> None:
    from common import entry

    entry("tuning")


if __name__ == "__main__":
    main()

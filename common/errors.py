"""The one error type every plugin raises, and the CNI well-known error codes."""

from __future__ import annotations

# Well-known codes from the CNI spec. 100 and above are plugin-specific.
INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENVIRONMENT = 4
IO_FAILURE = 5
DECODING_FAILURE = 6
INVALID_CONFIG = 7
INVALID_NETNS = 8
TRY_AGAIN_LATER = 11
STATUS_UNAVAILABLE = 50
STATUS_LIMITED = 51
# Plugin-specific codes, shared by our plugins so that users learn one table.
KERNEL_FAILURE = 100  # the kernel refused a change (netlink, nft, iptables, tc)
CONFLICT = 101  # a resource (host port, ...) is owned by another attachment
CHECK_FAILED = 102  # CHECK found the live state differs from the config
INTERNAL = 999  # a bug: an unexpected exception

# A runtime never sends megabytes: a config that large is a mistake or an attack, which
# common.config.decode refuses (error 6; skel reads one byte more so that it can tell).
MAX_STDIN_BYTES = 1 << 20


def escape(text: str, *, spaces: bool = False) -> str:
    """`text` with every character that could end a line, move the cursor or recolour a
    terminal (control characters, ESC, U+2028, lone surrogates...) written as repr() writes
    it, so that a value quoted in a log line or an error message can never forge a record
    of its own; with `spaces`, a space too (`\\x20`, for the log prefix's fields). The logger
    applies it to every record, CniError to its message and details."""
    if text.isprintable() and not (spaces and " " in text):
        return text
    return "".join(
        "\\x20" if c == " " and spaces else c if c.isprintable() else repr(c)[1:-1] for c in text
    )


class CniError(Exception):
    """An error reported to the runtime as CNI error JSON on stdout."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_json(self, cni_version: str) -> dict[str, object]:
        # Escaped here too: runtimes log msg and details as they get them.
        out: dict[str, object] = {"cniVersion": cni_version, "code": self.code}
        out["msg"] = escape(self.msg)
        if self.details:
            out["details"] = escape(self.details)
        return out

    def __str__(self) -> str:
        return escape(f"{self.msg}: {self.details}" if self.details else self.msg)


def invalid_config(msg: str, details: str = "") -> CniError:
    return CniError(INVALID_CONFIG, msg, details)

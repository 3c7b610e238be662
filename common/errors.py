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

# Bounded input: a runtime never sends megabytes; a config that large is a mistake or an
# attack, and reading it whole would cost the node memory and time. common.config.decode
# refuses more than this with DECODING_FAILURE (skel reads one byte more so that it can
# tell). Here, below both, because skel imports config.
MAX_STDIN_BYTES = 1 << 20


def escape(text: str, *, spaces: bool = False) -> str:
    """`text` as it may appear in a log line or an error message: every character that could
    end the line, move the cursor or recolour a terminal (newline, carriage return, ESC of an
    ANSI sequence, the other control characters, U+2028, lone surrogates...) written the way
    repr() writes it (`\\n`, `\\x1b`, `\\u2028`), so that a value quoted in a message (a
    CNI_NETNS, a config value, a tool's output) can never forge a record of its own. With
    `spaces`, a space too (`\\x20`), for fields that spaces separate (the log prefix).

    The one escaping function: the logger applies it to every record and CniError to its
    message and details wherever they are written."""
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

"""The administrator's sysctl allowlist: which keys a config (or a pod's args) may set.

One regular expression per line, matched against the whole key as written in the config
(so ``net\\.ipv4\\.conf\\.IFNAME\\.accept_redirects`` allows exactly that key). Go's tuning
searches for the pattern anywhere in the key, so ``net.core.somaxconn`` there also allows
``net.core.somaxconn_evil``; here patterns are anchored. Empty lines and lines starting
with ``#`` are skipped. A missing file allows every key, as upstream; an unreadable one is
an error rather than "allow all".
"""

from __future__ import annotations

from common.errors import IO_FAILURE, CniError, invalid_config
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re


class Allowlist(Value):
    __slots__ = ("path", "patterns")

    path: str
    patterns: tuple[re.Pattern[str], ...]

    def __init__(self, path: str, patterns: tuple[re.Pattern[str], ...]) -> None:
        self.path = path
        self.patterns = patterns

    def permits(self, key: str) -> bool:
        return any(p.fullmatch(key) for p in self.patterns)


def parse(path: str, text: str) -> Allowlist:
    import re  # only when there is an allowlist: ~5 ms to import

    patterns = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            patterns.append(re.compile(line))
        except re.error as e:
            raise invalid_config(
                f"sysctl allowlist {path} line {number}: {line[:80]!r} is not a regular expression",
                str(e),
            ) from None
    return Allowlist(path, tuple(patterns))


def load(path: str) -> Allowlist | None:
    """The allowlist at `path`, or None when there is none (everything allowed)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CniError(IO_FAILURE, f"cannot read the sysctl allowlist {path}", str(e)) from None
    return parse(path, text)


def refuse_unlisted(allowlist: Allowlist | None, keys: list[str]) -> None:
    """Error 7 naming the first key the allowlist does not permit."""
    if allowlist is None:
        return
    for key in keys:
        if not allowlist.permits(key):
            shown = ", ".join(p.pattern for p in allowlist.patterns[:10]) or "(none)"
            raise invalid_config(
                f"sysctl {key!r} is not allowed by {allowlist.path}",
                f"the allowlist permits keys matching: {shown}",
            )

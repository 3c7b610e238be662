"""The administrator's sysctl allowlist: which keys a config (or a pod's args) may set.

One regular expression per line, matched against the key as written (with the literal
``IFNAME``). Go's tuning accepts a key when the pattern matches anywhere in it, so there
``net\\.core\\.somaxconn`` also allows ``net.core.somaxconn_evil``; here a match must
cover whole parts of the key, so that a name that only begins with an allowed one is
refused while Go's prefix patterns keep allowing their subtree (docs/tuning.md has the
rules and examples). A missing file allows every key, as upstream; an unreadable one is
an error rather than "allow all".
"""

from __future__ import annotations

from common.errors import IO_FAILURE, CniError, invalid_config
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re

# Around the administrator's pattern: begin at a part boundary, end at one. A key with a
# "/" uses only "/" as its separator (dots stay literal: net/ipv4/conf/eth0.100/rp_filter),
# so `conf/eth0` there must not allow eth0.100.
_WRAP = r"(?:\A|(?<={sep}))(?:{body})(?:\Z|(?<={sep})|(?={sep}))"


class Allowlist(Value):
    path: str
    lines: tuple[str, ...]  # as written, for messages
    dotted: tuple[re.Pattern[str], ...]  # each line within part boundaries of dotted keys
    slashed: tuple[re.Pattern[str], ...]  # ... and of keys written with "/"

    def permits(self, key: str) -> bool:
        return any(p.search(key) for p in (self.slashed if "/" in key else self.dotted))


def parse(path: str, text: str) -> Allowlist:
    import re  # only when an allowlist file exists: most nodes have none

    lines, dotted, slashed = [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            flags = re.compile(line).flags
            # global inline flags such as (?i) must lead the whole expression
            lead = re.match(r"\(\?[aiLmsux]+\)", line)
            body = line[lead.end() :] if lead else line
            dotted.append(re.compile(_WRAP.format(sep=r"[.]", body=body), flags))
            slashed.append(re.compile(_WRAP.format(sep="/", body=body), flags))
        except re.error as e:
            raise invalid_config(
                f"sysctl allowlist {path} line {number}: {line[:80]!r} is not a regular expression",
                str(e),
            ) from None
        lines.append(line)
    return Allowlist(path, tuple(lines), tuple(dotted), tuple(slashed))


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
            shown = ", ".join(allowlist.lines[:10]) or "(none)"
            raise invalid_config(
                f"sysctl {key!r} is not allowed by {allowlist.path}",
                f"the allowlist permits keys matching: {shown}",
            )

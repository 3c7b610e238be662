"""The tuning configuration: parse, merge the four sources, validate. Pure (no kernel).

The sources and their precedence (as in Go's tuning) are in docs/tuning.md. Everything a
user can get wrong is refused here with error 7 saying what to fix, before the
container's namespace is touched.
"""

from __future__ import annotations

import os

from common.config import NetConf
from common.env import Invocation, plugin_dir
from common.errors import IO_FAILURE, CniError, invalid_config
from common.jsonobj import JsonObject, flag, integer, text
from common.jsontext import RepeatedKeys
from common.values import Value

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Callable, Mapping
    from typing import Any

    Parser = Callable[[NetConf, Mapping[str, str], str], Any]  # (conf, CNI_ARGS, key)

DEFAULT_DATA_DIR = "/run/cni/tuning"
ALLOWLIST_PATH = "/etc/cni/tuning/allowlist.conf"
ALLOWLIST_ENV = "CNI_TUNING_ALLOWLIST"  # overrides ALLOWLIST_PATH (tests, unusual installs)

MTU_MIN = 68  # the IPv4 minimum (RFC 791); the kernel refuses less on Ethernet
MTU_MAX = 65535
TXQLEN_MAX = 0xFFFFFFFF  # IFLA_TXQLEN is a u32

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
MAC_EXAMPLE = "six hex bytes like 02:42:ac:11:00:02"


class Sysctl(Value):
    key: str  # exactly as written, for messages and the allowlist
    components: tuple[str, ...]  # of its path below /proc/sys; "IFNAME" still a placeholder
    value: str


class LinkSettings(Value):
    """Interface attributes to set; None means "leave it alone". Each is described once,
    in LINK_OPTIONS."""

    mac: str | None = None  # normalised: lower case, colon separated
    mtu: int | None = None
    promisc: bool | None = None
    allmulti: bool | None = None
    tx_qlen: int | None = None

    @property
    def empty(self) -> bool:
        return all(getattr(self, option.field) is None for option in LINK_OPTIONS)


class TuningConf(Value):
    sysctls: tuple[Sysctl, ...]
    link: LinkSettings
    data_dir: str
    allowlist_path: str


def parse_mac(text: str, source: str) -> str:
    """A unicast, non-zero Ethernet address, normalised to aa:bb:cc:dd:ee:ff.

    Read in the forms Go's net.ParseMAC reads for 48-bit addresses: aa:bb:cc:dd:ee:ff,
    aa-bb-cc-dd-ee-ff or aabb.ccdd.eeff.
    """
    groups: list[str] = []
    if len(text) == 17 and text[2] in ":-":
        groups = text.split(text[2])
    elif len(text) == 14 and text[4] == "." and text[9] == ".":
        groups = [g[i : i + 2] for g in text.split(".") for i in (0, 2)]
    if len(groups) != 6 or any(len(g) != 2 or not set(g) <= _HEX_DIGITS for g in groups):
        raise invalid_config(f"{source}: {text[:40]!r} is not a MAC address", f"use {MAC_EXAMPLE}")
    octets = [int(g, 16) for g in groups]
    if not any(octets):
        raise invalid_config(
            f"{source}: {text} is the all-zero MAC address", f"use a real one: {MAC_EXAMPLE}"
        )
    if octets[0] & 1:
        raise invalid_config(
            f"{source}: {text} is a multicast MAC address (the first byte is odd)",
            "an interface needs a unicast address; locally administered ones start with "
            "x2, x6, xa or xe, e.g. 02:42:ac:11:00:02",
        )
    return ":".join(f"{o:02x}" for o in octets)


def _refuse_surrogates(text: str, what: str) -> None:
    """JSON can spell a lone UTF-16 surrogate ("\\ud800"), which no file name or sysctl
    write can carry: refused here, before anything is changed, not met midway."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise invalid_config(
                f"{what} contains a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text",
                "give it as plain UTF-8 text",
            ) from None


def parse_sysctl_key(key: str, where: str) -> tuple[str, ...]:
    """Split a key into /proc/sys path components, refusing anything that could leave net/.

    As with sysctl(8), a key containing '/' uses '/' as the separator and keeps dots
    literal (net/ipv4/conf/eth0.100/rp_filter); IFNAME is substituted as a whole
    component after splitting, so CNI_IFNAME=eth0.100 works in the dotted form too.
    """
    fix = "write a key relative to /proc/sys that starts with 'net.', like net.core.somaxconn"
    if not key:
        raise invalid_config(f"{where} has an empty key", fix)
    if any(ch.isspace() or ch == "\0" for ch in key):
        raise invalid_config(f"{where} key {key[:80]!r} contains white space or NUL", fix)
    if key.startswith("/"):
        raise invalid_config(f"{where} key {key[:80]!r} is an absolute path", fix)
    _refuse_surrogates(key, f"{where} key {key[:80]!r}")
    components = tuple(key.split("/" if "/" in key else "."))
    if any(c in ("", ".", "..") for c in components):
        raise invalid_config(f"{where} key {key[:80]!r} has an empty, '.' or '..' part", fix)
    if components[0] != "net" or len(components) < 2:
        raise invalid_config(
            f"{where} key {key[:80]!r} is not a network sysctl",
            "tuning sets only keys under net. (/proc/sys/net), e.g. net.core.somaxconn",
        )
    return components


def _sysctl_value(value: Any, where: str) -> str:
    # Go's tuning wants strings; numbers are accepted too because writing 500 for
    # somaxconn is an easy slip that has one obvious meaning.
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise invalid_config(f'{where} must be a string, like "1"')
    text = str(value)
    _refuse_surrogates(text, f"{where}: the value")
    if any(ch in "\n\r\0" for ch in text):
        raise invalid_config(
            f"{where}: the value contains a newline",
            "a newline would let one value write several settings; give a single line",
        )
    return text


def _sysctl_map(obj: JsonObject | None) -> dict[tuple[str, ...], Sysctl]:
    """One sysctl object -> {path components: setting}; a key given twice, or two spellings
    of one path, are an error."""
    if obj is None:
        return {}
    if isinstance(obj.raw, RepeatedKeys):
        raise invalid_config(
            f"{obj.where} key {obj.raw.repeated!r} is given more than once",
            "give each key once",
        )
    out: dict[tuple[str, ...], Sysctl] = {}
    for key, raw_value in obj.raw.items():
        components = parse_sysctl_key(key, obj.where)
        value = _sysctl_value(raw_value, f"{obj.where}[{key!r}]")
        earlier = out.get(components)
        if earlier is not None:
            raise invalid_config(
                f"{obj.where} keys {earlier.key!r} and {key!r} name the same setting",
                "give each key once",
            )
        out[components] = Sysctl(key, components, value)
    return out


def _mtu(obj: JsonObject, key: str) -> int | None:
    value = obj.integer(key)
    if value is None or value == 0:  # Go's tuning: 0 means "not set"
        return None
    if not MTU_MIN <= value <= MTU_MAX:
        raise invalid_config(
            f"{obj.path(key)} is {value}: an MTU must be between {MTU_MIN} and {MTU_MAX}"
        )
    return int(value)


def _tx_qlen(obj: JsonObject, key: str) -> int | None:
    value: int | None = obj.integer(key, maximum=TXQLEN_MAX)
    if value is not None and value < 0:
        raise invalid_config(
            f"{obj.path(key)} is {value}: a transmit queue length cannot be negative",
            "use 0 or more (1000 is the usual Ethernet default)",
        )
    return value


def _mac(conf: NetConf, cni_args: Mapping[str, str], key: str) -> str | None:
    """The effective MAC: the highest-precedence source that gives a non-empty one."""
    lowest_first = (
        ("mac", conf.body.string(key, "")),
        ("CNI_ARGS MAC", next((v for k, v in cni_args.items() if k.upper() == "MAC"), "")),
        ("runtimeConfig.mac", conf.runtime_config.string(key, "")),
        ("args.cni.mac", conf.cni_args_object.string(key, "")),
    )
    for source, value in reversed(lowest_first):
        if value:
            return parse_mac(value, source)
    return None


def _configured(read: Callable[[JsonObject, str], Any]) -> Parser:
    """A config key, which args.cni overrides; `read` gets its value out of one object."""

    def parse(conf: NetConf, cni_args: Mapping[str, str], key: str) -> Any:
        override = read(conf.cni_args_object, key)
        return override if override is not None else read(conf.body, key)

    return parse


def _saved_mac(value: Any) -> str:
    try:
        return parse_mac(text(value), "")
    except CniError as e:
        raise ValueError(e.msg) from None


class LinkOption(Value):
    """One link attribute tuning sets: its LinkSettings field; its key, in the config and
    in the backup file (Go's spelling of both); its name in CHECK's findings; how the
    config's value is read and checked (error 7); how a backup's value is checked (a
    ValueError drops it: see tuning.backup.Backup). How the kernel carries it is the kernel
    port's (tuning.apply); the recipe for adding one: docs/architecture.md."""

    field: str
    key: str
    label: str
    parse: Parser
    decode: Callable[[Any], Any]


LINK_OPTIONS = (
    LinkOption("mac", "mac", "MAC", _mac, _saved_mac),
    LinkOption("mtu", "mtu", "MTU", _configured(_mtu), integer(MTU_MIN, MTU_MAX)),
    LinkOption("promisc", "promisc", "promiscuous mode", _configured(JsonObject.boolean), flag),
    LinkOption("allmulti", "allmulti", "all-multicast mode", _configured(JsonObject.boolean), flag),
    LinkOption("tx_qlen", "txQLen", "txqueuelen", _configured(_tx_qlen), integer(0, TXQLEN_MAX)),
)


def parse_data_dir(conf: NetConf, environ: Mapping[str, str]) -> str:
    data_dir = conf.body.string("dataDir", "") or plugin_dir("tuning", environ, DEFAULT_DATA_DIR)
    if not os.path.isabs(data_dir) or "\0" in data_dir:
        raise invalid_config(
            f"dataDir {data_dir[:120]!r} is not an absolute path", "use e.g. /run/cni/tuning"
        )
    _refuse_surrogates(data_dir, f"dataDir {data_dir[:120]!r}")
    return os.path.normpath(data_dir)


def parse(conf: NetConf, invocation: Invocation, environ: Mapping[str, str]) -> TuningConf:
    sysctls = _sysctl_map(conf.body.child("sysctl"))
    # args.cni overrides the config key by key, matching keys by the setting they name.
    sysctls.update(_sysctl_map(conf.cni_args_object.child("sysctl")))
    link = {o.field: o.parse(conf, invocation.cni_args, o.key) for o in LINK_OPTIONS}
    return TuningConf(
        sysctls=tuple(sysctls.values()),
        link=LinkSettings(**link),
        data_dir=parse_data_dir(conf, environ),
        allowlist_path=environ.get(ALLOWLIST_ENV, "") or ALLOWLIST_PATH,
    )


# ---------------------------------------------------------------------------- the allowlist
# The administrator's sysctl allowlist: one regular expression per line, matched against
# the key as written (with the literal `IFNAME`). Unlike Go's (a match anywhere), a match
# must cover whole parts of the key, so that `net\.core\.somaxconn` does not allow
# `net.core.somaxconn_evil` (docs/tuning.md has the rules and examples).

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


def parse_allowlist(path: str, text: str) -> Allowlist:
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


def load_allowlist(path: str) -> Allowlist | None:
    """The allowlist at `path`, or None when there is none (everything allowed)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise CniError(IO_FAILURE, f"cannot read the sysctl allowlist {path}", str(e)) from None
    return parse_allowlist(path, text)


def refuse_unlisted(allowlist: Allowlist | None, keys: list[str]) -> None:
    if allowlist is None:
        return
    for key in keys:
        if not allowlist.permits(key):
            shown = ", ".join(allowlist.lines[:10]) or "(none)"
            raise invalid_config(
                f"sysctl {key!r} is not allowed by {allowlist.path}",
                f"the allowlist permits keys matching: {shown}",
            )

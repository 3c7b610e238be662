"""The CNI_* environment: which variables each verb needs, and their validation."""

from __future__ import annotations

import posix  # not os: a call that passes through needs nothing else of it

from common.errors import INVALID_ENVIRONMENT, INVALID_NETNS, CniError
from common.values import Value, field

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Which variables a verb cannot do without (the table in the CNI spec). CNI_NETNS is
# optional for DEL: the namespace may already be gone.
REQUIRED: dict[str, tuple[str, ...]] = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "VERSION": (),
    "GC": ("CNI_PATH",),
    "STATUS": ("CNI_PATH",),
}
VERBS = tuple(REQUIRED)

# The rules libcni applies (pkg/utils): what a runtime may send us.
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_CHARS = _NAME_START | frozenset("_.-")
_MAX_IFNAME = 15  # IFNAMSIZ - 1
MAX_CONTAINER_ID = 1024


def is_plain_name(text: str) -> bool:
    """libcni's rule for container ids and network names: [a-zA-Z0-9][a-zA-Z0-9_.-]*
    (checked without `re`, too costly to import on every call)."""
    return bool(text) and text[0] in _NAME_START and all(c in _NAME_CHARS for c in text)


def validate_container_id(cid: str) -> None:
    if not is_plain_name(cid) or len(cid) > MAX_CONTAINER_ID:
        raise CniError(
            INVALID_ENVIRONMENT,
            f"invalid CNI_CONTAINERID {cid[:80]!r}",
            "it must start with a letter or digit and contain only letters, digits, "
            f"'_', '.' and '-' (at most {MAX_CONTAINER_ID} characters)",
        )


def validate_ifname(name: str) -> None:
    problem = ""
    # The kernel counts bytes; os.environ holds undecodable bytes as lone surrogates.
    size = len(name.encode("utf-8", "surrogateescape"))
    if not name:
        problem = "it is empty"
    elif size > _MAX_IFNAME:
        problem = f"it is longer than {_MAX_IFNAME} bytes"
    elif any("\udc80" <= c <= "\udcff" for c in name):
        problem = "it is not valid UTF-8"
    elif name in (".", "..", "all", "default"):
        # The kernel refuses these names; "all" and "default" would also turn tuning's
        # per-interface sysctl keys (net.ipv4.conf.IFNAME...) into namespace-wide ones.
        problem = f"{name!r} cannot be an interface name"
    elif any(c in "/:" or c.isspace() for c in name):
        problem = "it must not contain '/', ':' or white space"
    if problem:
        raise CniError(INVALID_ENVIRONMENT, f"invalid CNI_IFNAME {name[:40]!r}", problem)


DEFAULT_STATE_ROOT = "/run/cni/meta-plugins"
STATE_ROOT_ENV = "CNI_META_STATE_ROOT"


def plugin_dir(plugin: str, environ: Mapping[str, str] | None = None, default: str = "") -> str:
    """<state root>/<plugin>; `default` instead when CNI_META_STATE_ROOT is not set (tuning
    keeps Go's /run/cni/tuning). Here, not in common.store: tuning's config names its
    dataDir with it, and a call that passes through needs no store."""
    import os

    root = (os.environ if environ is None else environ).get(STATE_ROOT_ENV)
    if not root and default:
        return default
    return os.path.join(root or DEFAULT_STATE_ROOT, plugin)


def parse_cni_args(text: str) -> dict[str, str]:
    """CNI_ARGS 'K=V;K2=V2' -> dict. Empty pairs are skipped; a pair without '=' is an error."""
    out: dict[str, str] = {}
    for pair in text.split(";"):
        if not pair:
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CniError(
                INVALID_ENVIRONMENT,
                f"invalid CNI_ARGS pair {pair[:80]!r}",
                "CNI_ARGS must be 'KEY=VALUE' pairs separated by ';'",
            )
        out[key] = value
    return out


class Invocation(Value):
    """What the runtime told us through the environment."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    path: tuple[str, ...] = ()
    cni_args: dict[str, str] = field(default_factory=dict)


def read_invocation(environ: Mapping[str, str]) -> Invocation:
    command = environ.get("CNI_COMMAND", "")
    if command not in VERBS:
        raise CniError(
            INVALID_ENVIRONMENT,
            f"unknown CNI_COMMAND {command[:40]!r}",
            "expected one of " + ", ".join(VERBS),
        )
    for var in REQUIRED[command]:
        if not environ.get(var):
            raise CniError(
                INVALID_ENVIRONMENT, f"required environment variable {var} is missing for {command}"
            )
    if command == "VERSION":
        return Invocation(command)
    cid = environ.get("CNI_CONTAINERID", "")
    ifname = environ.get("CNI_IFNAME", "")
    netns = environ.get("CNI_NETNS", "")
    if command in ("ADD", "DEL", "CHECK"):
        validate_container_id(cid)
        validate_ifname(ifname)
        if netns:
            check_netns_path(netns, must_exist=command != "DEL")
    return Invocation(
        command=command,
        container_id=cid,
        netns=netns,
        ifname=ifname,
        path=tuple(p for p in environ.get("CNI_PATH", "").split(":") if p),
        cni_args=parse_cni_args(environ.get("CNI_ARGS", "")),
    )


def check_netns_path(path: str, *, must_exist: bool) -> None:
    """The netns must be a namespace file, and not the one we run in (error 8)."""
    try:
        target = posix.stat(path)
    except FileNotFoundError:
        if must_exist:
            raise CniError(INVALID_NETNS, f"network namespace {path} does not exist") from None
        return
    except OSError as e:
        raise CniError(INVALID_NETNS, f"cannot open network namespace {path}", str(e)) from None
    own = posix.stat("/proc/self/ns/net")
    if target.st_dev != own.st_dev:
        # nsfs files share one device; anything else (a regular file, a typo'd dir) is not a ns.
        raise CniError(INVALID_NETNS, f"{path} is not a network namespace")
    if target.st_ino == own.st_ino:
        raise CniError(
            INVALID_NETNS,
            f"CNI_NETNS {path} is the plugin's own network namespace",
            "the runtime must pass the container's namespace, not the host's",
        )

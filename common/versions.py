"""CNI spec versions: the supported set, comparison, and per-verb minimums."""

from __future__ import annotations

from common.errors import INCOMPATIBLE_VERSION, CniError

SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = SUPPORTED_VERSIONS[-1]
# libcni treats a config without cniVersion as 0.1.0 (the spec prose says 0.2.0; the
# result formats of the two are identical, so either answer is compatible).
DEFAULT_VERSION = "0.1.0"

# The first version in which a verb exists.
VERB_MINIMUM = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


def parse(version: str) -> tuple[int, ...]:
    """One of SUPPORTED_VERSIONS as numbers to compare: '1.0.0' -> (1, 0, 0)."""
    return tuple(map(int, version.split(".")))


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def require_supported(version: str) -> None:
    if version not in SUPPORTED_VERSIONS:
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"incompatible CNI version {version!r}",
            "supported versions: " + ", ".join(SUPPORTED_VERSIONS),
        )


def require_verb(verb: str, version: str) -> None:
    minimum = VERB_MINIMUM.get(verb)
    if minimum is not None and not at_least(version, minimum):
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"config version {version} does not allow {verb}",
            f"{verb} needs cniVersion {minimum} or later",
        )

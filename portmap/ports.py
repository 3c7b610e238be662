"""portmap's kernel ports, declared: one per backend and the host's extras both need.

`portmap.kernel` implements them on the host, the tests' fake netfilter
(tests/harness/fake_portmap.py) in memory; neither inherits from the other, and mypy
checks both against these declarations. Only mypy and the tests import this module (the
verbs and backends name it under TYPE_CHECKING): `typing` is not loaded on a plugin call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable

    from portmap.kernel import Route


class NftContext(Protocol):
    """One libnftables context."""

    def set_json_output(self, on: bool) -> None: ...

    def run(self, text: str) -> tuple[int, str, str]:
        """(return code, output, error text) of one batch of nft commands."""
        ...


class NftKernel(Protocol):
    """The nftables backend's port."""

    def usable(self) -> bool:
        """Whether libnftables loads here."""
        ...

    def context(self) -> NftContext:
        """A libnftables context in this netns; OSError when the library is missing."""
        ...

    def has(self, family: int, table: str, chain: str | None = None) -> bool:
        """Whether nftables has this table (or this chain of it), asked without a context."""
        ...

    def may_have_element(self, table: str, set_name: str, key: bytes | None = None) -> bool:
        """Whether the inet table's set may hold the element with this key (None: whether
        the set is there), asked without a context: False for sure."""
        ...


class XtablesKernel(Protocol):
    """The iptables backend's port: the tools of either variant, and looks at the nat
    tables that run no tool."""

    def tool(self, variant: str, family: int, kind: str) -> str | None:
        """Path of e.g. ip6tables-nft-save; None when it is not installed."""
        ...

    def run(self, argv: list[str], data: bytes = b"") -> tuple[int, str]:
        """(exit status, stdout and stderr) of a tool run with `data` on its stdin."""
        ...

    def host_variant(self) -> str:
        """The variant of the host's `iptables` command: "nft" or "legacy"."""
        ...

    def legacy_nat_exists(self, family: int) -> bool:
        """Whether the legacy nat table of `family` exists."""
        ...

    def may_have(self, variant: str, family: int, chain: str) -> bool:
        """Whether that variant's nat table may hold `chain` (False for sure)."""
        ...


class Kernel(Protocol):
    """The host as portmap's verbs reach it."""

    @property
    def nft(self) -> NftKernel: ...

    @property
    def xtables(self) -> XtablesKernel: ...

    def route_v4(self, ip: str) -> Route | None:
        """The host's route to an IPv4 container address, as the kernel resolves it (its
        output device's name; not its kind); None when there is none."""
        ...

    def link_kind(self, name: str) -> str:
        """The kind of the device `name` ("bridge", "veth", ...; "" for a plain one)."""
        ...

    def read_sysctl(self, path: str) -> str: ...

    def write_sysctl(self, path: str, value: str) -> None: ...

    def guard_localnet(self, interfaces: Iterable[str]) -> None:
        """Drop new, non-DNAT packets to 127.0.0.0/8 arriving on exactly `interfaces`
        (none: no guard); OSError when it cannot be made so."""
        ...

    def guard_text(self, interfaces: Iterable[str]) -> str:
        """guard_localnet's change as nft text for a transaction of the caller's ("": the
        guard is not nftables' here)."""
        ...

    def localnet_guarded(self, ifname: str) -> bool:
        """Whether the localhost guard holds `ifname` (False when not sure): no write."""
        ...

    def flush_udp_conntrack(self, family: int, targets: Iterable[tuple[str | None, int]]) -> int:
        """Delete the UDP conntrack entries to these (host address or any, port) targets;
        how many were deleted."""
        ...

"""tuning's kernel port, declared: the container's network namespace is all the verbs
ask of the kernel. tuning.apply implements it on the host, the tests' fake kernel
(tests/harness/fake_kernel.py) in memory; neither inherits from the other, and mypy
checks both against this. Only mypy and the tests import this module: `typing` is not
loaded on a plugin call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from types import TracebackType

    from common.rtnl import RtnlSocket


class ContainerNetns(Protocol):
    """The container's network namespace, entered for a with-block."""

    def __enter__(self) -> ContainerNetns: ...

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def rtnl(self) -> RtnlSocket:
        """The namespace's rtnetlink socket, opened on first use, closed on leaving."""
        ...

    def read_sysctl(self, file: str) -> str: ...

    def write_sysctl(self, file: str, value: str) -> None: ...

    def if_inet6(self) -> str:
        """/proc's list of the namespace's IPv6 addresses."""
        ...


class Kernel(Protocol):
    def netns(self, path: str) -> ContainerNetns: ...

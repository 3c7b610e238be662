"""bandwidth's kernel port, declared: all the verbs ask of the kernel.

`bandwidth.tc.Kernel` implements it on the host, the tests' fake
(tests/harness/fake_kernel.py) in memory; neither inherits from the other, and mypy
checks both against this declaration. Only mypy and the tests import this module (the
verbs name it under TYPE_CHECKING): `typing` is not loaded on a plugin call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from bandwidth.tc import Rtnl


class Kernel(Protocol):
    def rtnl(self, netns: str = "") -> Rtnl:
        """An rtnetlink socket in the netns at path `netns` ("": the plugin's own), in
        bandwidth's words (links, qdiscs, filters)."""
        ...

    def has_device(self, name: str, netns: str = "") -> bool:
        """Whether that netns has a device named `name` (one that cannot be entered has
        none), asked without rtnetlink."""
        ...

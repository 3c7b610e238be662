"""A specific hostIP mapping keeps its address against a later attachment's wildcard on
the same port (issue 29, finding 2), whichever backend, with real TCP traffic."""

from __future__ import annotations

import pytest

from tests.harness.lab import Lab
from tests.harness.portmap_world import HOST4, HOST4B, make_world
from tests.harness.traffic import echo_server, reaches

pytestmark = pytest.mark.root


def test_a_later_wildcard_does_not_take_an_earlier_specific_address(lab: Lab, backend: str) -> None:
    """The attacker's own specific mapping (another port) used to put all its jumps, its
    wildcard 8080 included, above the victim's in CNI-HOSTPORT-DNAT."""
    w = make_world(lab, backend=backend)
    victim, attacker = lab.ctr, lab.new_netns("attacker")
    w.attach(victim, f"{HOST4}:8080:80/tcp")
    w.attach(attacker, "8080:80/tcp", f"{HOST4}:9999:81/tcp")
    with (
        echo_server(victim, 80, "tcp", "victim"),
        echo_server(attacker, 80, "tcp", "attacker"),
        echo_server(attacker, 81, "tcp", "attacker81"),
    ):
        assert reaches(lab.host, HOST4, 8080) == b"victim:ping"  # the host's own connection
        assert reaches(w.ext, HOST4, 8080) == b"victim:ping"
        # the attacker keeps what is its own
        assert reaches(w.ext, HOST4B, 8080) == b"attacker:ping"
        assert reaches(w.ext, HOST4, 9999) == b"attacker81:ping"
        w.detach(victim)
        assert reaches(w.ext, HOST4, 8080) == b"attacker:ping"


def test_a_later_specific_address_beats_an_earlier_wildcard(lab: Lab, backend: str) -> None:
    """The other order: the specific mapping of the later attachment still wins, also
    when that attachment has a wildcard mapping of another port."""
    w = make_world(lab, backend=backend)
    wild, specific = lab.ctr, lab.new_netns("specific")
    w.attach(wild, "8080:80/tcp", "7070:80/tcp")
    w.attach(specific, f"{HOST4}:8080:80/tcp", "6060:80/tcp")
    with echo_server(wild, 80, "tcp", "wild"), echo_server(specific, 80, "tcp", "specific"):
        assert reaches(lab.host, HOST4, 8080) == b"specific:ping"
        assert reaches(w.ext, HOST4B, 8080) == b"wild:ping"
        assert reaches(w.ext, HOST4B, 7070) == b"wild:ping"
        assert reaches(w.ext, HOST4B, 6060) == b"specific:ping"

"""A whole chain's ADD, CHECK and DEL, with real traffic, by plugins that cannot import
CPython's private accelerator modules (tests/unit/test_stdlib_fallback.py has the rest)."""

from __future__ import annotations

import pytest

from tests.harness.lab import Lab, LabChain
from tests.harness.plugins import GO_BIN, load_conflist
from tests.harness.stdlib_fallback import wrappers
from tests.harness.traffic import echo_server, request


@pytest.mark.root
def test_chain_add_check_del_without_the_private_modules(lab: Lab) -> None:
    bindir = wrappers(lab.workdir / "bin")
    chain = LabChain(lab, [bindir, GO_BIN])
    conflist = load_conflist("ipv4.conflist", lab.workdir)
    mac = "02:42:ac:11:00:42"
    flags = {"bandwidth": "8000000", "mac": mac}
    chain.add(conflist, lab.ctr, "18742:7042/tcp", **flags)
    with echo_server(lab.ctr, 7042, "tcp", tag="fb"):
        assert request(lab.host, "127.0.0.1", 18742, "tcp", b"hi") == b"fb:hi"
    assert mac in lab.ctr.ip("link", "show", "eth0")
    assert "tbf" in lab.host.run("tc", "qdisc", "show")
    state = sorted(p.name for p in lab.state_root.rglob("*.json"))
    assert state, "the plugins wrote no state"
    chain.check(conflist, lab.ctr, "18742:7042/tcp", **flags)
    chain.delete(conflist, lab.ctr, "18742:7042/tcp", **flags)
    assert not list(lab.state_root.rglob("*.json"))
    assert "tbf" not in lab.host.run("tc", "qdisc", "show")

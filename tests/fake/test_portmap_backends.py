"""Which backends a portmap GC reaches: the config's, those its network's records name, and
each that says itself it may hold mappings no record names (no root: the fake netfilter)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.identity import Attachment
from common.log import Log
from portmap import config as cfg
from portmap import state
from portmap.verbs import for_gc
from tests.harness.fake_portmap import FakeNetfilter


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeNetfilter:
    monkeypatch.setenv("CNI_META_STATE_ROOT", str(tmp_path / "state"))
    return FakeNetfilter()


def gc_backends(fake: FakeNetfilter, backend: str) -> list[str]:
    found = for_gc(cfg.Options(backend=backend), "net", state.store(), Log(""), fake)
    return [backend.name for backend in found]


def test_iptables_says_it_may_hold_mappings_where_its_top_chain_may_be(
    fake: FakeNetfilter,
) -> None:
    assert gc_backends(fake, backend="nftables") == ["nftables"]
    # the Go portmap's chains, made perhaps before ours was installed
    fake.xtables.table("nft", 6)["CNI-HOSTPORT-DNAT"] = []
    assert gc_backends(fake, backend="nftables") == ["iptables", "nftables"]
    assert [b.may_hold() for b in for_gc(cfg.Options(), "net", state.store(), Log(""), fake)] == [
        True,
        False,  # nftables: an ADD records its elements before it writes them
    ]


def test_gc_reaches_the_backend_a_record_of_the_network_names(fake: FakeNetfilter) -> None:
    assert gc_backends(fake, backend="nftables") == ["nftables"]
    chain = state.Chain(4, cfg.go_chain_name("net", "c1"), "nft")
    state.store().save(Attachment("net", "c1", "eth0"), state.XtablesRecord(
        "net", "c1", "eth0", committed=True, chains=(chain,)))  # fmt: skip
    assert gc_backends(fake, backend="nftables") == ["iptables", "nftables"]
    assert gc_backends(fake, backend="iptables") == ["iptables"]

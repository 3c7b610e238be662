"""flatnet-ipam's index record (flatnet_ipam.store.Lease): its own fast decoder gives the
answers of the generic one of common.state (which every other record type uses), and its
file name is common.state's tagged name."""

from __future__ import annotations

from typing import Any

import pytest

from common import state
from flatnet_ipam.store import Lease

GOOD: dict[str, Any] = {
    "network": "n1", "containerID": "c1", "ifname": "eth0", "committed": True,
    "addresses": ["10.0.0.2", "fd00::2"], "boot": "b", "adopted": False,
}  # fmt: skip
CASES = [
    GOOD,
    {k: v for k, v in GOOD.items() if k not in ("committed", "adopted")},
    {**GOOD, "committed": None, "adopted": None},
    {**GOOD, "network": ""},
    {**GOOD, "containerID": None},
    {k: v for k, v in GOOD.items() if k != "ifname"},
    {**GOOD, "committed": "yes"},
    {**GOOD, "adopted": 1},
    {**GOOD, "boot": ""},
    {k: v for k, v in GOOD.items() if k != "boot"},
    {k: v for k, v in GOOD.items() if k != "addresses"},
    {**GOOD, "addresses": "10.0.0.2"},
    {**GOOD, "addresses": ["10.0.0.2", "nope"]},
    {**GOOD, "addresses": ["10.0.0.2", ""]},
    {**GOOD, "addresses": [7]},
    {**GOOD, "addresses": []},
    [GOOD],
    "text",
]


def generic(raw: Any) -> tuple[str, Any]:
    try:
        return "ok", state.Record.from_json.__func__(Lease, raw)  # type: ignore[attr-defined]
    except ValueError:
        return "refused", None


def fast(raw: Any) -> tuple[str, Any]:
    try:
        return "ok", Lease.from_json(raw)
    except ValueError:
        return "refused", None


@pytest.mark.parametrize("raw", CASES)
def test_the_fast_decoder_answers_as_the_generic_one(raw: Any) -> None:
    assert fast(raw) == generic(raw)


def test_a_record_survives_its_round_trip() -> None:
    record = Lease("n1", "c1", "eth0", True, ["10.0.0.2"], "b", adopted=True)
    assert Lease.from_json(record.to_json()) == record


@pytest.mark.parametrize("owner", [("n1", "c1", "eth0"), ("n2", "c1", "eth0"), ("n1", "x", "y")])
def test_its_file_name_is_the_stores_tagged_name(owner: tuple[str, str, str]) -> None:
    assert Lease.file_name(*owner) == state.tagged_name(*owner)

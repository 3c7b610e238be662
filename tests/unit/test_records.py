"""Record codecs (common.records): one declaration per record type, decoded the same way
for all of them, and the files already on nodes still read."""

from __future__ import annotations

import pytest

from common.identity import Attachment
from common.jsonobj import integer, non_empty, text
from common.records import Flat, Key, Record
from common.values import Value
from portmap.state import Chain, NftRecord, Recorded, XtablesRecord


class Limits(Value):
    low: int = 0
    high: int = 0


class Strict(Record):
    device: str = ""
    note: str = ""
    limits: Limits = Limits()
    KEYS = {
        "device": Key("device", non_empty, required=True),
        "note": Key("note", text),
        "limits": Flat(
            Limits, {"low": Key("low", integer(0, 9)), "high": Key("hi", integer(0, 9))}
        ),
    }


class Tolerant(Strict):
    TOLERANT = True


OWNER = {"network": "n", "containerID": "c", "ifname": "eth0"}


def test_owner_committed_and_fields_round_trip_with_flat_keys_in_one_object() -> None:
    rec = Strict("n", "c", "eth0", True, device="d", limits=Limits(1, 2))
    assert rec.to_json() == {**OWNER, "committed": True, "device": "d", "note": "",
                             "low": 1, "hi": 2}  # fmt: skip
    assert Strict.from_json(rec.to_json()) == rec


def test_absent_keys_take_the_default_but_a_strict_record_needs_its_required_ones() -> None:
    assert Strict.from_json({**OWNER, "device": "d"}) == Strict("n", "c", "eth0", device="d")
    with pytest.raises(ValueError, match="device is missing"):
        Strict.from_json(OWNER)
    with pytest.raises(ValueError, match="network is missing"):
        Strict.from_json({"device": "d"})
    assert Tolerant.from_json({}) == Tolerant()


def test_a_wrong_value_makes_a_strict_record_unusable_and_a_tolerant_one_drops_it() -> None:
    raw = {**OWNER, "device": "d", "hi": 10, "committed": "yes"}
    with pytest.raises(ValueError, match="committed is not true or false"):
        Strict.from_json(raw)
    assert Tolerant.from_json(raw) == Tolerant("n", "c", "eth0", device="d")
    assert Strict.from_json([1]) is None and Tolerant.from_json("x") is None


def test_one_naming_scheme_tells_a_networks_files_by_their_names() -> None:
    name = Record.file_name(Attachment("net", "c", "eth0"))
    assert name == f"{Attachment('net', 'c', 'eth0').tag}.json"  # portmap's files keep theirs
    other = Record.file_name(Attachment("net", "other", "eth1"))
    assert name.startswith(other.split("-")[0] + "-")


def test_portmap_records_on_nodes_read_as_before() -> None:
    on_node = {**OWNER, "backend": "nftables", "objects": [["claims4", "0.0.0.0 . tcp . 80"]],
               "committed": False}  # fmt: skip
    rec = Recorded.from_json(on_node)
    assert rec == NftRecord("n", "c", "eth0", False, elements=(("claims4", "0.0.0.0 . tcp . 80"),))
    assert rec is not None and rec.to_json() == on_node
    chains = {**OWNER, "backend": "iptables", "objects": [[4, "CNI-DN-1", "nft"]],
              "committed": True}  # fmt: skip
    rec = Recorded.from_json(chains)
    assert rec == XtablesRecord("n", "c", "eth0", True, chains=(Chain(4, "CNI-DN-1", "nft"),))
    assert rec is not None and rec.to_json() == chains
    assert Recorded.from_json({"objects": "x", "backend": 4}) == Recorded()

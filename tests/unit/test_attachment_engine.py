"""The attachment engine's protocol (common.attachment), without root: a store in a
temporary directory, a kernel that is a list of names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common import jsontext
from common.attachment import Engine, UndoFailed
from common.errors import KERNEL_FAILURE, CniError
from common.identity import Attachment
from common.log import Log
from common.records import Key, Record
from common.store import AttachmentStore


def _names(raw: object) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ValueError("is not a list of names")
    return tuple(raw)


class Rec(Record):
    objects: tuple[str, ...] = ()
    KEYS = {"objects": Key("objects", _names, list)}

    @staticmethod
    def file_name(attachment: Attachment) -> str:
        return f"{attachment.network}-{attachment.container_id}-{attachment.ifname}.json"


OWNER = Attachment("net", "c1", "eth0")
FAILED = CniError(KERNEL_FAILURE, "the kernel said no")


@pytest.fixture
def engine(tmp_path: Path) -> Engine[Rec]:
    store = AttachmentStore(str(tmp_path / "state"), Rec)
    return Engine(store, Log(str(tmp_path / "log")))


def on_disk(engine: Engine[Rec]) -> dict[str, object] | None:
    data = engine.store.read_bytes(engine.store.file_of(OWNER))
    return None if data is None else jsontext.loads(data)


def rec(*objects: str) -> Rec:
    return Rec("net", "c1", "eth0", objects=objects)


def test_intent_is_on_disk_uncommitted_before_the_kernel_is_touched(engine: Engine[Rec]) -> None:
    with engine.add(OWNER) as change:
        assert change.previous is None
        change.intend(rec("a", "b"))
        assert on_disk(engine) == {**rec("a", "b").to_json(), "committed": False}
    assert on_disk(engine) == {**rec("a", "b").to_json(), "committed": True}


def test_confirm_rewrites_the_file_so_a_gc_in_between_sees_an_add_in_flight(
    engine: Engine[Rec],
) -> None:
    with engine.add(OWNER) as change:
        change.intend(rec("a"))
        before = engine.store.stamps()  # a GC starts while this ADD runs
    stale, in_flight = engine.store.sweep("net", set(), before)
    assert stale == [] and [r.container_id for r in in_flight] == ["c1"]


def test_confirm_may_record_less_than_the_intent(engine: Engine[Rec]) -> None:
    with engine.add(OWNER) as change:
        change.intend(rec("old", "new"))
        change.confirm(rec("new"))
    assert engine.store.load(OWNER) == rec("new").replace(committed=True)


def test_a_failed_add_runs_undo_then_forgets(engine: Engine[Rec]) -> None:
    undone = []
    with pytest.raises(CniError) as caught, engine.add(OWNER) as change:
        change.intend(rec("a"), undo=lambda: undone.append("a"))
        raise FAILED
    assert caught.value is FAILED and undone == ["a"]
    assert on_disk(engine) is None


def test_a_failed_undo_keeps_the_intent_for_del(engine: Engine[Rec]) -> None:
    def undo() -> None:
        raise CniError(KERNEL_FAILURE, "undo failed too")

    with pytest.raises(CniError) as caught, engine.add(OWNER) as change:
        change.intend(rec("a"), undo=undo)
        raise FAILED
    assert caught.value is FAILED  # the ADD's own error, not the undo's
    assert engine.store.load(OWNER) == rec("a")  # an intent: committed is False


def test_apply_that_undid_itself_puts_the_older_record_back(engine: Engine[Rec]) -> None:
    with engine.add(OWNER) as change:
        change.intend(rec("first"))
    with pytest.raises(CniError), engine.add(OWNER) as change:
        assert change.previous == rec("first").replace(committed=True)
        change.intend(rec("first", "second"))  # no undo: the apply rolls back by itself
        raise FAILED
    assert engine.store.load(OWNER) == rec("first").replace(committed=True)


def test_apply_that_undid_itself_without_an_older_record_forgets(engine: Engine[Rec]) -> None:
    with pytest.raises(CniError), engine.add(OWNER) as change:
        change.intend(rec("a"))
        raise FAILED
    assert on_disk(engine) is None


def test_what_the_plugin_found_in_the_kernel_is_what_a_failed_add_leaves(
    engine: Engine[Rec],
) -> None:
    with pytest.raises(CniError), engine.add(OWNER) as change:
        change.intend(rec("a", "b"))
        change.found(rec("leftover"))  # read back after a first refusal
        change.intend(rec("leftover", "a", "b"))
        raise FAILED
    assert engine.store.load(OWNER) == rec("leftover").replace(committed=True)
    with pytest.raises(CniError), engine.add(OWNER) as change:
        change.intend(rec("leftover", "a"))
        change.found(None)
        raise FAILED
    assert on_disk(engine) is None


def test_undo_failed_keeps_the_intent(engine: Engine[Rec]) -> None:
    with pytest.raises(UndoFailed), engine.add(OWNER) as change:
        change.intend(rec("a"))
        raise UndoFailed(KERNEL_FAILURE, "half done")
    assert engine.store.load(OWNER) == rec("a")


def test_a_failure_before_the_intent_leaves_the_store_alone(engine: Engine[Rec]) -> None:
    with engine.add(OWNER) as change:
        change.intend(rec("a"))
    with pytest.raises(CniError), engine.add(OWNER) as change:
        raise FAILED
    assert engine.store.load(OWNER) == rec("a").replace(committed=True)


def test_other_exceptions_leave_the_intent_as_a_kill_would(engine: Engine[Rec]) -> None:
    with pytest.raises(KeyError), engine.add(OWNER) as change:
        change.intend(rec("a"), undo=lambda: pytest.fail("no undo for a bug"))
        raise KeyError("bug")
    assert engine.store.load(OWNER) == rec("a")


def test_add_holds_the_lock(engine: Engine[Rec], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CNI_META_LOCK_TIMEOUT", "0")
    with engine.add(OWNER), pytest.raises(CniError) as caught, engine.add(OWNER):
        pass
    assert caught.value.code == 11


def test_delete_tears_down_the_record_and_forgets_it(engine: Engine[Rec]) -> None:
    with engine.add(OWNER) as change:
        change.intend(rec("a"))
    seen: list[Rec | None] = []

    def teardown(record: Rec | None) -> str:
        seen.append(record)
        return "done"

    assert engine.delete(OWNER, teardown) == "done"
    assert seen == [rec("a").replace(committed=True)] and on_disk(engine) is None
    assert engine.delete(OWNER, teardown) == "done"  # nothing left: fine
    assert seen[-1] is None


def test_delete_forgets_a_record_it_cannot_use(engine: Engine[Rec]) -> None:
    engine.store.write_json(engine.store.file_of(OWNER), {"objects": "not a list"})
    seen: list[Rec | None] = []
    engine.delete(OWNER, seen.append)
    assert seen == [None] and on_disk(engine) is None


def test_a_failed_teardown_keeps_the_record_for_the_retried_del(engine: Engine[Rec]) -> None:
    with engine.add(OWNER) as change:
        change.intend(rec("a"))

    def teardown(r: Rec | None) -> None:
        raise FAILED

    with pytest.raises(CniError):
        engine.delete(OWNER, teardown)
    assert engine.store.load(OWNER) == rec("a").replace(committed=True)


def test_gc_tears_down_stale_records_and_spares_those_in_flight(engine: Engine[Rec]) -> None:
    store = engine.store
    for cid in ("valid", "stale", "flying", "elsewhere"):
        store.save(Attachment("net", cid, "eth0"), Rec("net", cid, "eth0", objects=(cid,)))
    store.save(Attachment("other", "x", "eth0"), Rec("other", "x", "eth0"))
    before = store.stamps()
    flying = Attachment("net", "flying", "eth0")
    store.save(flying, Rec("net", "flying", "eth0", objects=("again",)))
    torn: list[str] = []
    valid = {Attachment("net", "valid", "eth0")}
    with engine.collecting(
        "net",
        valid,
        lambda r: torn.append(r.container_id),
        owns=lambda r: r.container_id != "elsewhere",
        before=before,
    ) as alive:
        assert alive == {Attachment("net", "valid", "eth0"), Attachment("net", "flying", "eth0")}
    assert torn == ["stale"]
    assert valid == {Attachment("net", "valid", "eth0")}  # the caller's set is not changed
    left = sorted(os.listdir(store.directory))
    assert "net-stale-eth0.json" not in left
    assert {"net-valid-eth0.json", "net-flying-eth0.json", "net-elsewhere-eth0.json"} <= set(left)


def test_gc_removes_unusable_files_only_when_asked(engine: Engine[Rec]) -> None:
    store = engine.store
    store.write_json("net-bad-eth0.json", [1, 2])
    store.write_json("other-bad-eth0.json", [1, 2])
    with engine.collecting("net", set()):
        pass
    assert store.has(Attachment("net", "bad", "eth0"))
    with engine.collecting("net", set(), unusable="net-"):
        pass
    assert not store.has(Attachment("net", "bad", "eth0"))
    assert store.has(Attachment("other", "bad", "eth0"))

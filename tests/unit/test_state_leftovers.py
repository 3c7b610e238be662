"""A writer killed between writing `<name>.tmp` and renaming it leaves the temporary file
behind (common.statedir's one atomic write); GC removes it under its lock, unless it
changed since GC started."""

from __future__ import annotations

import os
from pathlib import Path

from common.attachment import Engine
from common.identity import Attachment
from common.log import Log
from common.records import Record
from common.store import AttachmentStore


def test_gc_removes_the_leftover_of_a_writer_killed_before_its_rename(tmp_path: Path) -> None:
    store = AttachmentStore(str(tmp_path / "state"), Record)
    engine = Engine(store, Log(""))
    killed = Attachment("net", "killed", "eth0")
    alive = Attachment("net", "alive", "eth0")
    store.save(alive, Record("net", "alive", "eth0", True))
    store.ensure()
    Path(store.path(store.file_of(killed) + ".tmp")).write_text('{"network": "net"}')
    with engine.collecting("net", {alive}) as still:
        assert still == {alive}
    assert os.listdir(store.directory) == ["lock", store.file_of(alive)]


def test_gc_keeps_a_temporary_file_that_changed_since_it_started(tmp_path: Path) -> None:
    store = AttachmentStore(str(tmp_path / "state"), Record)
    store.ensure()
    busy = Path(store.path("busy.json.tmp"))
    busy.write_text("{}")
    before = store.stamps()
    os.utime(busy, ns=(1, 1))  # written since: the other portmap backend's writer is busy
    with Engine(store, Log("")).collecting("net", set(), before=before):
        pass
    assert busy.exists()

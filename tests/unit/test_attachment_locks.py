"""A lock per attachment (common.attachment.Engine(each=...)), without root.

Another process holds one attachment's ADD/DEL lock (as a plugin call stopped midway
would, e.g. a DEL reading a container's filters): another attachment's call goes ahead,
the same attachment's call and GC wait (error 11 at the deadline). Record locks do not
exclude each other within one process, so the holder is a child process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from common.attachment import Engine
from common.errors import TRY_AGAIN_LATER, CniError
from common.identity import Attachment
from common.log import Log
from common.records import Record
from common.store import AttachmentStore

A = Attachment("net", "ctr-a", "eth0")
B = Attachment("net", "ctr-b", "eth0")


def at(container_id: str, ifname: str = "eth0", network: str = "net") -> Attachment:
    return Attachment(network, container_id, ifname)


def key(owner: Attachment) -> str:
    return f"{owner.network}/{owner.container_id}"


def engine(state: Path, tmp_path: Path, *, per_attachment: bool = True) -> Engine[Record]:
    store = AttachmentStore(str(state), Record)
    return Engine(store, Log(str(tmp_path / "log")), each=key if per_attachment else None)


HOLDER = textwrap.dedent("""
    import sys
    from common.attachment import Engine
    from common.identity import Attachment
    from common.records import Record
    from common.store import AttachmentStore

    store = AttachmentStore(sys.argv[1], Record)
    each = (lambda o: f"{o.network}/{o.container_id}") if sys.argv[3] == "each" else None
    with Engine(store, None, each=each).add(Attachment("net", sys.argv[2], "eth0")):
        print("held", flush=True)
        sys.stdin.read()  # until the test closes it
""")


@contextmanager
def held_by_another_process(state: Path, container_id: str, mode: str) -> Iterator[None]:
    """An ADD of (net, container_id, eth0) in a child process, inside its block."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state), container_id, mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        yield
    finally:
        assert child.stdin is not None
        child.stdin.close()
        assert child.wait(timeout=30) == 0


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CNI_META_LOCK_TIMEOUT", "0.2")


def test_another_attachments_add_and_del_go_ahead(tmp_path: Path, short_deadline: None) -> None:
    state = tmp_path / "state"
    eng = engine(state, tmp_path)
    with held_by_another_process(state, "ctr-a", "each"):
        with eng.add(at("ctr-b")) as change:
            change.intend(Record(network="net", container_id="ctr-b", ifname="eth0"))
        assert eng.delete(at("ctr-b"), lambda record: record and record.container_id) == "ctr-b"


def test_the_same_attachment_and_gc_wait(tmp_path: Path, short_deadline: None) -> None:
    state = tmp_path / "state"
    eng = engine(state, tmp_path)
    with held_by_another_process(state, "ctr-a", "each"):
        with pytest.raises(CniError) as caught, eng.add(at("ctr-a")):
            pass
        assert caught.value.code == TRY_AGAIN_LATER
        with pytest.raises(CniError) as caught:
            eng.delete(at("ctr-a"), lambda record: None)
        assert caught.value.code == TRY_AGAIN_LATER
        with pytest.raises(CniError) as caught, eng.collecting("net", set()):
            pass
        assert caught.value.code == TRY_AGAIN_LATER  # GC sees the store with no ADD midway
    with eng.collecting("net", {A, B}) as alive:  # free again once the holder is done
        assert alive == {A, B}


def test_without_each_every_call_waits_for_the_one_lock(
    tmp_path: Path, short_deadline: None
) -> None:
    state = tmp_path / "state"
    eng = engine(state, tmp_path, per_attachment=False)
    with held_by_another_process(state, "ctr-a", "store"):
        with pytest.raises(CniError) as caught, eng.add(at("ctr-b")):
            pass
        assert caught.value.code == TRY_AGAIN_LATER


def test_what_stays_is_one_lock_file_per_kind(tmp_path: Path) -> None:
    state = tmp_path / "state"
    eng = engine(state, tmp_path)
    for cid in ("ctr-a", "ctr-b", "ctr-c"):
        with eng.add(at(cid)) as change:
            change.intend(Record(network="net", container_id=cid, ifname="eth0"))
        eng.delete(at(cid), lambda record: None)
    assert sorted(p.name for p in state.iterdir()) == ["attachments.lock", "lock"]

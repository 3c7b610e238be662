"""The attachment engine: the one crash-safe protocol by which every plugin changes the
kernel for an attachment and keeps its record in the store (common.store). A plugin's
verbs supply parse, plan, observe/reconcile and apply against their kernel port; the
engine does the rest, the same for everyone:

- **lock**: every verb runs under the store's lock (or the one named), so an ADD, a DEL
  and a GC of one attachment never interleave. With `each`, ADD and DEL hold it shared
  plus their attachment's own, so calls of different attachments run side by side, while
  GC holds it exclusively: it still sees a store no ADD is writing;
- **intent before the kernel**: `Change.intend(record)` writes the record with
  ``committed`` false before the kernel is touched: "these objects *may* exist" (the
  plugin was killed, or failed, after writing it); a committed one: "these exist";
- **confirm**: `Change.confirm(record)` (or leaving the block normally) writes it again,
  committed. GC relies on that re-save: a file replaced after GC took its stamps belongs
  to an ADD in flight, which GC spares (sweep in common.store);
- **undo, then forget**: when the ADD fails (a CniError) after an intent, the engine runs
  the intent's `undo` and forgets the record once that worked; when the undo fails, the
  record stays for the DEL the runtime sends next. An intent without `undo` belongs to an
  apply that puts the kernel back itself: the record from before the ADD is put back (or
  what `Change.found` last saw of the kernel), unless the apply raised `UndoFailed`;
- **teardown**: DEL lets the plugin tear down what the record says (None: there is no
  usable one), then forgets it whatever the file held, so that a DEL can always finish;
  a teardown that raises keeps the record for the retried DEL;
- **GC**: stamps before the lock, then the store's sweep: stale records torn down and
  forgotten, those of ADDs in flight kept, and the attachments still alive handed to the
  plugin's own sweep of the kernel.

    with engine.add(attachment) as change:     # lock taken, change.previous loaded
        change.intend(record, undo=callable)   # undo: None = apply puts the kernel back
        ...apply...                            # CniError: undo, forget / put previous back
        change.found(record_or_None)           # optional: what the kernel holds now
        change.confirm(record)                 # optional: the block's end confirms the intent
    engine.delete(attachment, teardown)        # teardown(record or None) -> its result
    with engine.collecting(network, valid, teardown, owns=..., unusable="", before=...) as alive:
        ...the plugin's own kernel sweep, sparing `alive`...

An ADD that fails before its intent leaves the store as it was. Exceptions other than
CniError (a bug, a signal) leave the intent in place, as a kill would.
"""

from __future__ import annotations

from contextlib import contextmanager

from common.errors import CniError
from common.records import Generic, R

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import TypeVar

    from common.identity import Attachment
    from common.log import Log
    from common.store import AttachmentStore, Stamps

    T = TypeVar("T")


class UndoFailed(CniError):
    """ADD failed, and putting back what it had already changed failed too: its record
    must outlive the ADD so that DEL can finish the undo."""


def _marked(record: R, committed: bool) -> R:
    return record if record.committed is committed else record.replace(committed=committed)


class Change(Generic[R]):
    """One ADD's record, between the lock and the end of the block (see Engine.add)."""

    def __init__(self, store: AttachmentStore[R], attachment: Attachment, log: Log) -> None:
        self.store = store
        self.attachment = attachment
        self.log = log
        self.previous: R | None = store.load(attachment)
        self._intent: R | None = None
        self._undo: Callable[[], object] | None = None

    def intend(self, record: R, undo: Callable[[], object] | None = None) -> None:
        """Record that `record`'s objects may exist from now on (before the kernel is
        touched); `undo`: see the module's docstring."""
        self._intent = _marked(record, False)
        self._undo = undo
        self.store.save(self.attachment, self._intent)

    def found(self, record: R | None) -> None:
        """What the kernel holds of this attachment now, as the plugin just read it (None:
        nothing): the record a failed ADD leaves when its apply changed nothing."""
        self.previous = None if record is None else _marked(record, True)

    def confirm(self, record: R | None = None) -> None:
        """Record that `record` (default: the intent) exists as recorded; ends the ADD."""
        final = self._intent if record is None else record
        self._intent = None
        if final is not None:
            self.store.save(self.attachment, _marked(final, True))

    def _failed(self, error: CniError) -> None:
        if self._intent is None:
            return  # nothing was recorded for this ADD (or it was confirmed)
        if isinstance(error, UndoFailed):
            self.log.error(f"ADD failed and was not fully undone; DEL will finish: {error}")
            return
        if self._undo is not None:
            try:
                self._undo()
            except CniError as e:
                self.log.error(f"could not undo a failed ADD (DEL will finish it): {e}")
                return
            self.store.forget(self.attachment)
        elif self.previous is None:
            self.store.forget(self.attachment)
        else:
            self.store.save(self.attachment, self.previous)


def _nothing(record: object) -> None:
    """The teardown of a record that only stands for itself (nothing in the kernel)."""


def _everything(record: object) -> bool:
    return True


class Engine(Generic[R]):
    """The lifecycle of one plugin's attachments in `store` (see the module docstring).

    `each`: the key of an attachment's own lock (attachments whose kernel objects may
    meet share a key); None: every call holds the store's lock alone."""

    def __init__(
        self,
        store: AttachmentStore[R],
        log: Log,
        lock: str = "",
        *,
        each: Callable[[Attachment], str] | None = None,
    ) -> None:
        self.store = store
        self.log = log
        self.lock = lock
        self.each = each

    @contextmanager
    def locked(self, attachment: Attachment) -> Iterator[None]:
        """The lock ADD and DEL of `attachment` hold: the store's, or with `each` the
        store's shared and then the attachment's own, one byte of `attachments.<lock file>`."""
        store = self.store
        if self.each is None:
            with store.lock(self.lock):
                yield
            return
        own = f"attachments.{self.lock or store.lock_name}"
        with store.lock(self.lock, shared=True), store.lock(own, key=self.each(attachment)):
            yield

    @contextmanager
    def add(self, attachment: Attachment) -> Iterator[Change[R]]:
        with self.locked(attachment):
            change = Change(self.store, attachment, self.log)
            try:
                yield change
            except CniError as e:
                change._failed(e)
                raise
            if change._intent is not None:
                change.confirm()

    def delete(self, attachment: Attachment, teardown: Callable[[R | None], T]) -> T:
        """Tear down what the record says (None: there is no usable one; the plugin finds
        what it can from the kernel) and forget it; returns what `teardown` returns."""
        with self.locked(attachment):
            result = teardown(self.store.load(attachment))
            self.store.forget(attachment)
            return result

    @contextmanager
    def collecting(
        self,
        network: str,
        valid: set[Attachment],
        teardown: Callable[[R], object] = _nothing,
        *,
        owns: Callable[[R], bool] = _everything,
        unusable: str | None = None,
        before: Stamps | None = None,
    ) -> Iterator[set[Attachment]]:
        """GC of `network` (see the module's docstring): `owns` says which stale records
        are this sweep's (not another backend's in a shared store); `unusable`: also remove
        the files no call can use whose names start with it (None: leave them); `before`:
        the stamps, when the caller took them earlier than this call."""
        store = self.store
        if before is None:
            before = store.stamps()  # before the lock, which an ADD in flight may hold
        with store.lock(self.lock):  # exclusive, also with `each`: no ADD or DEL runs
            for name in store.leftovers(before):
                store.remove(name)
            if unusable is not None:
                for name, problem in store.unusable(before, unusable):
                    store.remove(name)
                    self.log.warning(
                        f"gc: removed unusable state file {store.path(name)}: {problem}"
                    )
            stale, in_flight = store.sweep(network, valid, before)
            alive = set(valid)
            for record in in_flight:
                alive.add(record.attachment)
                self.log.info(
                    f"gc: kept {record.container_id}/{record.ifname}: its ADD was running"
                )
            for record in stale:
                if owns(record):
                    teardown(record)
                    store.forget(record.attachment)
                    self.log.info(f"gc: removed {record.container_id}/{record.ifname}")
            yield alive

"""The attachment engine: the one crash-safe protocol by which every plugin changes the
kernel for an attachment and keeps its record in the store (common.state).

A plugin's verbs supply what is theirs: parse, plan, observe/reconcile and apply against
their kernel port. The engine supplies the rest, the same for everyone:

- **lock**: every verb runs under the store's lock (or the one named), so an ADD, a DEL
  and a GC of the same attachment never interleave. With `each` (a lock per attachment),
  ADD and DEL hold that lock shared plus their attachment's own, so calls of different
  attachments run side by side (one container's slow call stalls no other), while GC
  holds it exclusively: it still sees a store no ADD is writing;
- **intent before the kernel**: `Change.intend(record)` writes the record with
  ``committed`` false before the kernel is touched. A record means one thing for every
  plugin: an intent says "these objects *may* exist" (the plugin was killed, or failed,
  somewhere after writing it), a committed record says "these exist as recorded";
- **confirm**: `Change.confirm(record)` (or leaving the block normally) writes it again,
  committed. That re-save is also what GC relies on: a file replaced after GC took its
  stamps belongs to an ADD that was in flight, which GC leaves alone (see sweep in
  common.state);
- **undo, then forget**: when the ADD fails (a CniError leaves the block) after an intent,
  the engine runs the intent's `undo` and forgets the record once that worked; when the
  undo fails, the record stays, because the DEL the runtime sends next needs it. An
  intent without `undo` belongs to an apply that puts the kernel back by itself (one
  transaction, or its own rollback): the record it had before the ADD is put back, as
  it was or as the plugin found the kernel since (`Change.found`). An apply that could
  not put everything back raises `UndoFailed`: the intent stays for DEL;
- **teardown**: DEL loads the record (None: there is none, or none it can use), lets the
  plugin tear down, then forgets it, whatever the file held, so that a DEL can always
  finish. When the teardown raises, the record stays for the retried DEL;
- **GC**: stamps before the lock, then the store's sweep: stale records are torn down and
  forgotten, records of ADDs in flight are kept, and the attachments still alive
  (valid plus in flight) are handed to the plugin's own sweep of the kernel.

API (records are common.state.Record: `network`, `container_id`, `ifname`, `committed`
and the plugin's own fields):

    engine = Engine(store, log, lock="")      # lock: a lock file name; "" = the store's
    Engine(store, log, each=key_of)            # key_of(owner) -> str: a lock per key

    with engine.add(owner) as change:          # lock taken, change.previous loaded
        change.previous                        # the record before this ADD, or None
        change.intend(record, undo=callable)   # undo: None = apply puts the kernel back
        ...apply...                            # CniError: undo, forget / put previous back
        change.found(record_or_None)           # optional: what the kernel holds now
        change.confirm(record)                 # optional: the block's end confirms the intent

    engine.delete(owner, teardown)             # teardown(record or None) -> its result

    with engine.collecting(network, valid, teardown, owns=..., unusable="", before=...) as alive:
        ...the plugin's own kernel sweep, sparing `alive`...

An ADD that fails before its intent leaves the store as it was. Exceptions other than
CniError (a bug, a signal) leave the intent in place, as a kill would: the protocol
holds for that case too.
"""

from __future__ import annotations

from common.errors import CniError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager
    from types import TracebackType
    from typing import Any

    from common.gc import AttachmentId
    from common.log import Log
    from common.state import AttachmentStore, Owner, Stamps


class UndoFailed(CniError):
    """ADD failed, and putting back what it had already changed failed too: its record
    must outlive the ADD so that DEL can finish the undo."""


def _marked(record: Any, committed: bool) -> Any:
    """`record` with its `committed` flag set (a record type without one is as it is)."""
    if "committed" not in type(record)._field_names or record.committed is committed:
        return record
    return record.replace(committed=committed)


class Change:
    """One ADD's record, between the lock and the end of the block (see Engine.add)."""

    def __init__(self, store: AttachmentStore, owner: Owner, log: Log) -> None:
        self.store = store
        self.owner = owner
        self.log = log
        self.previous: Any = store.load(owner)
        self._intent: Any = None
        self._undo: Callable[[], object] | None = None

    def intend(self, record: Any, undo: Callable[[], object] | None = None) -> None:
        """Record that `record`'s objects may exist from now on: call it before the kernel
        is touched. `undo` puts the kernel back when the ADD fails after this; None: the
        apply does that itself, and the record from before the ADD is put back."""
        self._intent = _marked(record, False)
        self._undo = undo
        self.store.save(self.owner, self._intent)

    def found(self, record: Any) -> None:
        """What the kernel holds of this attachment now, as the plugin just read it (None:
        nothing): the record a failed ADD leaves when its apply changed nothing."""
        self.previous = None if record is None else _marked(record, True)

    def confirm(self, record: Any = None) -> None:
        """Record that `record` (default: the intent) exists as recorded; ends the ADD."""
        final = self._intent if record is None else record
        self._intent = None
        self.store.save(self.owner, _marked(final, True))

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
            self.store.forget(self.owner)
        elif self.previous is None:
            self.store.forget(self.owner)
        else:
            self.store.save(self.owner, self.previous)


def _nothing(record: Any) -> None:
    """The teardown of a record that only stands for itself (nothing in the kernel)."""


def _everything(record: Any) -> bool:
    return True


class _Adding:
    """The block of Engine.add. A class rather than a @contextmanager generator:
    contextlib (with functools and collections) would be imported by every ADD for it."""

    __slots__ = ("_lock", "change", "engine", "owner")

    def __init__(self, engine: Engine, owner: Owner) -> None:
        self.engine = engine
        self.owner = owner

    def __enter__(self) -> Change:
        engine = self.engine
        lock = engine.locked(self.owner)
        lock.__enter__()
        try:
            self.change = Change(engine.store, self.owner, engine.log)
        except BaseException as e:
            lock.__exit__(type(e), e, e.__traceback__)
            raise
        self._lock = lock
        return self.change

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if isinstance(error, CniError):
                self.change._failed(error)
            elif error is None and self.change._intent is not None:
                self.change.confirm()
        finally:
            self._lock.__exit__(kind, error, tb)


class _Both:
    """Two locks taken in order for one block, released in reverse (a class, not
    contextlib: see _Adding)."""

    __slots__ = ("inner", "outer")

    def __init__(self, outer: AbstractContextManager[None], inner: AbstractContextManager[None]):
        self.outer, self.inner = outer, inner

    def __enter__(self) -> None:
        self.outer.__enter__()
        try:
            self.inner.__enter__()
        except BaseException as e:
            self.outer.__exit__(type(e), e, e.__traceback__)
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            self.inner.__exit__(*exc)
        finally:
            self.outer.__exit__(*exc)


class Engine:
    """The lifecycle of one plugin's attachments in `store` (see the module docstring).

    `each`: the key of an attachment's own lock (attachments whose kernel objects may
    meet share a key); None: every call holds the store's lock alone."""

    def __init__(
        self,
        store: AttachmentStore,
        log: Log,
        lock: str = "",
        *,
        each: Callable[[Owner], str] | None = None,
    ) -> None:
        self.store = store
        self.log = log
        self.lock = lock
        self.each = each

    def locked(self, owner: Owner) -> AbstractContextManager[None]:
        """The lock ADD and DEL of `owner` hold: the store's, or with `each` the store's
        shared and then the attachment's own, one byte of `attachments.<lock file>`."""
        store = self.store
        if self.each is None:
            return store.lock(self.lock)
        shared = store.lock(self.lock, shared=True)
        own = store.lock(f"attachments.{self.lock or store.lock_name}", key=self.each(owner))
        return _Both(shared, own)

    def add(self, owner: Owner) -> AbstractContextManager[Change]:
        return _Adding(self, owner)

    def delete(self, owner: Owner, teardown: Callable[[Any], Any]) -> Any:
        """Tear down what the record says (None: there is no usable one; the plugin finds
        what it can from the kernel) and forget it; returns what `teardown` returns."""
        with self.locked(owner):
            result = teardown(self.store.load(owner))
            self.store.forget(owner)
            return result

    def collecting(
        self,
        network: str,
        valid: set[AttachmentId],
        teardown: Callable[[Any], object] = _nothing,
        *,
        owns: Callable[[Any], bool] = _everything,
        unusable: str | None = None,
        before: Stamps | None = None,
    ) -> AbstractContextManager[set[AttachmentId]]:
        """GC of `network`: under the lock, tear down and forget each stale record that
        `owns` (another backend's records in a shared store are not this sweep's), keep
        those of ADDs in flight, and yield the attachments still alive for the plugin's
        own kernel sweep, still under the lock. `unusable`: also remove the files no call
        can use whose names start with it (None: leave them). `before`: the stamps, when
        the caller took them earlier than this call."""
        from contextlib import contextmanager  # only GC pays for it (see _Adding)

        return contextmanager(self._collecting)(network, valid, teardown, owns, unusable, before)

    def _collecting(
        self,
        network: str,
        valid: set[AttachmentId],
        teardown: Callable[[Any], object],
        owns: Callable[[Any], bool],
        unusable: str | None,
        before: Stamps | None,
    ) -> Iterator[set[AttachmentId]]:
        from common.gc import AttachmentId

        store = self.store
        if before is None:
            before = store.stamps()  # before the lock, which an ADD in flight may hold
        with store.lock(self.lock):  # exclusive, also with `each`: no ADD or DEL runs
            if unusable is not None:
                for name, problem in store.unusable(before, unusable):
                    store.remove(name)
                    self.log.warning(
                        f"gc: removed unusable state file {store.path(name)}: {problem}"
                    )
            stale, in_flight = store.sweep(network, valid, before)
            alive = set(valid)
            for record in in_flight:
                alive.add(AttachmentId(record.container_id, record.ifname))
                self.log.info(
                    f"gc: kept {record.container_id}/{record.ifname}: its ADD was running"
                )
            for record in stale:
                if owns(record):
                    teardown(record)
                    store.forget(record)
                    self.log.info(f"gc: removed {record.container_id}/{record.ifname}")
            yield alive

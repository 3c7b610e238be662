"""The attachment store: what each plugin remembers per attachment between ADD and DEL.

One JSON file per attachment under <root>/<plugin>/ (a StateDir: written whole, under a
lock with a deadline), holding the plugin's record type (common.records), swept by GC
the same way for every plugin. Layout, modes and what stays after the last DEL:
docs/architecture.md ("The attachment store").
"""

from __future__ import annotations

from common.errors import CniError
from common.records import Generic, R, decode
from common.statedir import TMP_SUFFIX, StateDir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from common.identity import Attachment
    from common.log import Log

    Stamps = dict[str, tuple[int, int]]


class AttachmentStore(StateDir, Generic[R]):
    """One record of type `codec` per attachment, in the file the type names for it;
    nothing else reads them. `load` and `save` take the attachment apart from the record,
    so that a record without an owner (Go's tuning's) is put back where it was found."""

    def __init__(self, directory: str, codec: type[R], log: Log | None = None) -> None:
        super().__init__(directory)
        self.codec = codec
        self.log = log  # where load says which file it could not use

    def file_of(self, attachment: Attachment) -> str:
        return self.codec.file_name(attachment)

    def has(self, attachment: Attachment) -> bool:
        return self._stat(self.file_of(attachment)) is not None

    def load(self, attachment: Attachment) -> R | None:
        """The attachment's record, or None: no file, or one it cannot use (see examine;
        said in the store's log). The caller's next save or forget replaces or removes
        such a file: a DEL forgets it whatever it held, so that it always finishes."""
        name = self.file_of(attachment)
        record, problem = self.examine(name)
        if problem and self.log is not None:
            self.log.warning(f"ignoring unusable state file {self.path(name)}: {problem}")
        return record

    def read(self, name: str) -> R | None:
        return self.examine(name)[0]

    def examine(self, name: str) -> tuple[R | None, str]:
        """(record, "") from the file `name`; (None, "") when there is none; (None, what
        is wrong) when it is there but no call can use it: not JSON, nested too deep, or
        refused by the codec (a value of the wrong type or out of range)."""
        data = self.read_bytes(name)
        if data is None:
            return None, ""
        raw, problem = decode(data)
        if not problem:
            try:
                record = self.codec.from_json(raw)
            except Exception as e:  # pure decoding of a damaged file: whatever it provokes
                problem = f"{type(e).__name__}: {e}"
            else:
                if record is not None:
                    return record, ""
                problem = f"not a {self.codec.__name__}"
        return None, f"{problem[:120]} ({len(data)} bytes: {data[:300]!r})"

    def save(self, attachment: Attachment, record: R) -> None:
        self.write_json(self.file_of(attachment), record.to_json())

    def forget(self, attachment: Attachment) -> None:
        self.remove(self.file_of(attachment))

    def entries(self, network: str) -> dict[str, R]:
        """File name -> record of every attachment of `network` (a record that names
        another attachment than its file's name says is nobody's: left alone)."""
        out = {}
        for name in self.names():
            record = self.read(name)
            if record is None or record.network != network or not record.container_id:
                continue
            try:
                if name == self.file_of(record.attachment):
                    out[name] = record
            except CniError:  # an owner no file of ours could be named after
                continue
        return out

    # GC. A runtime lists the attachments it knows; one whose ADD has not returned yet is
    # not in that list, yet it is about to be alive. GC cannot tell it from a leak by the
    # list, so it asks the files: every ADD (re)writes its record at its end, under the
    # lock GC takes too. A file that appeared or was replaced after GC started belongs to
    # an ADD that was in flight then: GC leaves that attachment alone, and the next GC
    # (whose list was made after the ADD returned) decides. A file exactly as it was when
    # GC started belongs to a call that had ended before: fair game.

    def stamps(self) -> Stamps:
        """name -> (inode, mtime) of each file, taken when GC starts, before it waits for
        the lock that an ADD in flight may hold."""
        out: Stamps = {}
        for name in self.names(""):
            st = self._stat(name)
            if st is not None:
                out[name] = (st.st_ino, st.st_mtime_ns)
        return out

    def unusable(self, before: Stamps, prefix: str = "") -> list[tuple[str, str]]:
        """(name, what is wrong) of each file whose name starts with `prefix` that no call
        can use (examine), unchanged since GC started (`before`): GC removes them, as a
        DEL does its own. An ADD writes whole files, so a file that changed meanwhile is
        left to the next GC."""
        now = self.stamps()
        out = []
        for name in self.names():
            if name.startswith(prefix) and name in before and before[name] == now.get(name):
                problem = self.examine(name)[1]
                if problem:
                    out.append((name, problem))
        return out

    def leftovers(self, before: Stamps) -> list[str]:
        """The temporary files of writers killed before their rename (write_json) that are
        as they were when GC started: no writer is busy with them, as writers hold the
        lock GC holds (or, portmap's other backend, need microseconds)."""
        now = self.stamps()
        return [n for n in now if n.endswith(TMP_SUFFIX) and before.get(n) == now[n]]

    def sweep(
        self, network: str, valid: set[Attachment], before: Stamps
    ) -> tuple[list[R], list[R]]:
        """(stale, in flight): the records of `network`'s attachments not in `valid`,
        split by whether their file is as it was at `before` (stamps() when GC started).
        Call it holding the lock ADD writes under."""
        now = self.stamps()
        stale: list[R] = []
        in_flight: list[R] = []
        for name, record in self.entries(network).items():
            if record.attachment not in valid:
                (stale if before.get(name) == now.get(name) else in_flight).append(record)
        return stale, in_flight

"""State dirs and tuning's dataDir that someone else owns or can write (root: chown).

One with symlinks planted at the names of the lock, state and temporary files is refused
before anything is written or re-moded, and no file is ever written through a symlink;
our own is made private, and one swapped after it was checked receives nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.errors import CniError
from common.identity import Attachment
from common.statedir import StateDir

NOBODY = 65534


def planted_dir(tmp_path: Path, names: list[str], owner: int = NOBODY, mode: int = 0o755) -> Path:
    """A directory someone else owns, with a symlink at each of `names` pointing at a
    root-owned file of its own: what root would overwrite by writing through them."""
    d = tmp_path / "planted"
    d.mkdir()
    for name in names:
        target = tmp_path / f"target-{name}"
        target.write_text("root's file\n")
        target.chmod(0o644)
        (d / name).symlink_to(target)
        os.lchown(d / name, owner, owner)
    os.chown(d, owner, owner)
    d.chmod(mode)
    return d


def targets_unchanged(tmp_path: Path) -> None:
    targets = sorted(tmp_path.glob("target-*"))
    assert targets
    for t in targets:
        st = t.stat()
        assert t.read_text() == "root's file\n" and st.st_mode & 0o7777 == 0o644, t
        assert st.st_uid == 0, t


BACKUP_NAME = "ctr_eth0.json"
TUNING_FILES = ["tuning.lock", BACKUP_NAME, BACKUP_NAME + ".tmp"]


@pytest.mark.root
@pytest.mark.parametrize("step", ["lock", "save", "load"])
def test_a_data_dir_someone_else_owns_is_refused_before_any_write(
    tmp_path: Path, step: str
) -> None:
    from tuning.backup import Backup, BackupStore
    from tuning.config import LinkSettings

    store = BackupStore(str(planted_dir(tmp_path, TUNING_FILES)))
    owner = Attachment("net", "ctr", "eth0")
    with pytest.raises(CniError) as e:
        if step == "lock":
            with store.lock():
                pass
        elif step == "save":
            store.save(owner, Backup(link=LinkSettings(mtu=1500)))
        else:
            with store.lock():
                store.load(owner)
    assert e.value.code == 7, e.value
    assert f"belongs to uid {NOBODY}" in e.value.msg and "dataDir" in e.value.details
    targets_unchanged(tmp_path)


@pytest.mark.root
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_a_data_dir_others_can_write_is_refused_and_not_re_moded(tmp_path: Path, mode: int) -> None:
    from tuning.backup import Backup, BackupStore
    from tuning.config import LinkSettings

    d = planted_dir(tmp_path, TUNING_FILES, owner=0, mode=mode)
    with pytest.raises(CniError) as e:
        owner = Attachment("net", "ctr", "eth0")
        BackupStore(str(d)).save(owner, Backup(link=LinkSettings(mtu=1500)))
    assert e.value.code == 7 and "writable by" in e.value.msg, e.value
    assert d.stat().st_mode & 0o7777 == mode  # a shared /tmp is not chmod-ed either
    targets_unchanged(tmp_path)


@pytest.mark.root
@pytest.mark.parametrize("owner", [0, NOBODY])
def test_a_state_dir_that_is_a_symlink_is_refused_without_chmod_through_it(
    tmp_path: Path, owner: int
) -> None:
    """ensure() used to chmod 0700 through the symlink, then check who owns the link."""
    real = tmp_path / "target-dir"
    real.mkdir()
    os.chown(real, owner, owner)
    real.chmod(0o755)
    link = tmp_path / "state" / "portmap"
    link.parent.mkdir()
    link.symlink_to(real)
    with pytest.raises(CniError) as e:
        StateDir(str(link)).write_json("x.json", {})
    assert e.value.code == 5 and "symlink" in e.value.msg, e.value
    assert real.stat().st_mode & 0o7777 == 0o755 and not list(real.iterdir())


@pytest.mark.root
def test_symlinks_in_our_own_state_dir_are_never_written_through(tmp_path: Path) -> None:
    """Even in a directory of ours (a leftover, a bug elsewhere): the lock refuses the
    symlink, and a state file is replaced, never written through."""
    d = planted_dir(tmp_path, ["lock", "a.json", "b.json.tmp", "c.json"], owner=0, mode=0o700)
    sd = StateDir(str(d))
    with pytest.raises(CniError) as e, sd.lock():
        pass
    assert e.value.code == 5
    sd.write_json("a.json", {"a": 1})
    sd.write_json("b.json", {"b": 1})
    assert sd.read_bytes("a.json") == b'{"a": 1}' and sd.read_bytes("b.json") == b'{"b": 1}'
    assert not (d / "a.json").is_symlink()
    with pytest.raises(CniError):
        sd.read_bytes("c.json")  # not followed either
    targets_unchanged(tmp_path)


def test_our_own_state_dir_is_still_made_private(tmp_path: Path) -> None:
    d = tmp_path / "state" / "bandwidth"
    d.mkdir(parents=True, mode=0o755)
    d.chmod(0o755)
    sd = StateDir(str(d))
    sd.write_json("x.json", {"x": 1})
    assert d.stat().st_mode & 0o777 == 0o700 and sd.read_bytes("x.json") == b'{"x": 1}'
    assert (d / "x.json").stat().st_mode & 0o777 == 0o600


def test_a_state_dir_swapped_after_it_was_checked_receives_nothing(tmp_path: Path) -> None:
    """The directory is opened and checked once; every file operation after that is
    relative to that descriptor, so renaming another directory into its place (a race
    of anyone who can write a parent) redirects none of them."""
    d = tmp_path / "state" / "tuning"
    sd = StateDir(str(d))
    sd.write_json("a.json", {"a": 1})
    d.rename(tmp_path / "state" / "moved")
    d.mkdir(mode=0o700)
    sd.write_json("b.json", {"b": 1})
    with sd.lock():
        pass
    sd.remove("a.json")
    assert sorted(p.name for p in (tmp_path / "state" / "moved").iterdir()) == ["b.json", "lock"]
    assert list(d.iterdir()) == [] and sd.names() == ["b.json"]

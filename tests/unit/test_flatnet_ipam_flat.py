"""flatnet-ipam's ADD, CHECK and DEL do no per-lease work: one more attachment's calls
open, stat and list exactly as many files with 300 leases held as with none (counted,
not timed: the figures are bench/ipam_scale.py's). The library runs in-process on a
private dataDir; no root needed (the files are all it touches)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from common.config import parse_netconf
from flatnet_ipam import lib
from flatnet_ipam.config import IpamConfig

COUNTED = ("open", "stat", "listdir", "scandir", "unlink", "link", "rename")


def config(data_dir: Path) -> IpamConfig:
    raw = {"cniVersion": "1.1.0", "name": "flatnet", "type": "flatnet-ipam",
           "ipam": {"subnet": "10.66.0.0/16", "dataDir": str(data_dir)}}  # fmt: skip
    return lib.parse_config(parse_netconf(raw))


@pytest.fixture
def count(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    calls: Counter[str] = Counter()

    def counted(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    for name in COUNTED:
        monkeypatch.setattr(os, name, counted(name, getattr(os, name)))
    yield calls


def one_more(cfg: IpamConfig, calls: Counter[str]) -> dict[str, Counter[str]]:
    out = {}
    for verb, call in (("ADD", lib.allocate), ("CHECK", lib.check), ("DEL", lib.release)):
        calls.clear()
        call(cfg, "one-more", "eth0")
        out[verb] = Counter(calls)
    return out


def test_add_check_del_touch_as_many_files_with_300_leases_as_with_none(
    tmp_path: Path, count: Counter[str]
) -> None:
    empty, full = config(tmp_path / "empty"), config(tmp_path / "full")
    for i in range(300):
        lib.allocate(full, f"held{i}", "eth0")
    for cfg in (empty, full):  # each store as a steady series of our calls leaves it
        lib.allocate(cfg, "warm", "eth0")
        lib.release(cfg, "warm", "eth0")
    assert one_more(empty, count) == one_more(full, count)
    assert all(c["listdir"] == c["scandir"] == 0 for c in one_more(full, count).values())


def test_gc_of_300_stale_leases_reads_each_record_once(tmp_path: Path, count: Counter[str]) -> None:
    cfg = config(tmp_path)
    for i in range(300):
        lib.allocate(cfg, f"held{i}", "eth0")
    count.clear()
    lib.gc(cfg, set())
    assert not [p for p in (tmp_path / "flatnet").iterdir() if p.name[0].isdigit()]
    # Each record opened once, each lease once (its holder checked before unlinking).
    assert count["open"] < 2 * 300 + 20, count

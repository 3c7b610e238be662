"""The iptables backend's memory and start-up shortcuts, against the real libraries.

`release_blob` frees libiptc's raw copy of a table by reaching into its handle; it checks
the handle's layout first and does nothing where it does not match, which would silently
bring back a third copy of the table at every call (7 MB at 5,000 attachments). These
tests make that visible: on this system it must free the blob, and libiptc must go on
working with the handle (changes, commit, free). `import_iptc` must find python-iptables'
libraries without running ldconfig or gcc (~40 ms per call when it does).

Each check runs in its own Python process (python-iptables loads extensions per family
and per process), inside a throwaway network namespace where it touches iptables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import netns as nslib

REPO = Path(__file__).resolve().parents[1]

RELEASE = """
import sys
from portmap.iptables import import_iptc, release_blob
family = int(sys.argv[1])
iptc = import_iptc()
cls = iptc.Table6 if family == 6 else iptc.Table
table = cls(cls.NAT, autocommit=False)
first, again = release_blob(table), release_blob(table)
table.create_chain("CNI-MEMTEST")
table.commit()
table.refresh()  # the old handle (blob already freed) is freed, a new one read
seen = table.is_chain("CNI-MEMTEST")
refreshed = release_blob(table)
table.close()
print(first, again, seen, refreshed)
"""

NO_PROGRAMS = """
import subprocess
started = []
original = subprocess.Popen.__init__
def record(self, args, *a, **k):
    started.append(str(args[0] if isinstance(args, (list, tuple)) else args))
    original(self, args, *a, **k)
subprocess.Popen.__init__ = record
from portmap.iptables import import_iptc
iptc = import_iptc()
iptc.Table  # loaded for real
print(" ".join(started) or "none")
"""


def python(*argv: str, netns: nslib.Netns | None = None) -> str:
    cmd = [sys.executable, "-I", "-c", *argv]
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns.name, *cmd]
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.root
@pytest.mark.parametrize("family", [4, 6])
def test_libiptc_blob_is_freed_and_the_handle_keeps_working(family: int) -> None:
    with nslib.namespaces("host") as (host,):
        out = python(f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + RELEASE, str(family),
                     netns=host)  # fmt: skip
        assert out == "True False True True"
        save = "ip6tables-legacy-save" if family == 6 else "iptables-legacy-save"
        assert ":CNI-MEMTEST - [0:0]" in host.run(save, "-t", "nat")


def test_import_iptc_runs_no_ldconfig_or_gcc() -> None:
    out = python(f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + NO_PROGRAMS)
    programs = [os.path.basename(p) for p in out.split()] if out != "none" else []
    assert [p for p in programs if p != "modprobe"] == []  # load_kernel's modprobe may run

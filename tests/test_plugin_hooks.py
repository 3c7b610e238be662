"""Each plugin's hooks module offers the resident helper all it does per plugin today.

The helper (common/helper.py) still names plugin modules itself; these tests pin that the
hooks cover the same ground, so that it can call them instead.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from types import ModuleType

from common import helper


def _hooks(plugin: str) -> ModuleType:
    return importlib.import_module(f"{plugin}.hooks")


def _loaded_after(code: str) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(run.stdout.split())


def test_hook_rehearsals_are_the_calls_the_helper_rehearses() -> None:
    from_hooks = [(p, cmd, keys) for p in helper.PLUGINS for cmd, keys in _hooks(p).rehearsal()]
    assert [(p, cmd) for p, cmd, _ in from_hooks] == [(p, cmd) for p, cmd, _ in helper.REHEARSAL]
    for (plugin, _, keys), (_, _, mappings) in zip(from_hooks, helper.REHEARSAL, strict=True):
        base = json.loads(helper._rehearsal_conf(plugin, None, "/proc/self/fd/7"))
        want = json.loads(helper._rehearsal_conf(plugin, mappings, "/proc/self/fd/7"))
        assert {**base, **keys} == want


def test_hook_preloads_load_the_plugin_modules_the_helper_preloads() -> None:
    by_helper = _loaded_after("from common.helper import preload\npreload()")
    by_hooks = _loaded_after(
        "import importlib\n"
        "for p in ('portmap', 'bandwidth', 'tuning'):\n"
        "    importlib.import_module(p + '.hooks').preload()"
    )
    # The tables of contents (<plugin>.__main__) stay the helper's own business.
    wanted = {
        m
        for m in by_helper
        if m.split(".")[0] in (*helper.PLUGINS, "iptc") and not m.endswith(".__main__")
    }
    assert "portmap.nft" in wanted and "iptc" in wanted
    assert wanted - by_hooks == set()


def test_hook_release_frees_rehearsal_contexts() -> None:
    from portmap import libnftables, nft

    nft.Nft()  # a context, as a rehearsal leaves one (no kernel call: no root needed)
    assert libnftables._live != []
    for plugin in helper.PLUGINS:
        _hooks(plugin).release()
    assert libnftables._live == []

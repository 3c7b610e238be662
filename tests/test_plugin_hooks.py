"""Each plugin's hooks module is all the resident helper (cnihelper.server) touches of it
besides the table of contents: preload warms what the verbs use, rehearsal names the
calls a spare runs, release frees what a rehearsal left."""

from __future__ import annotations

import json
import subprocess
import sys

from cnihelper import server


def _loaded_after(code: str) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-c", f"import sys\n{code}\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(run.stdout.split())


def test_helper_preload_loads_every_module_the_verbs_import() -> None:
    loaded = _loaded_after("from cnihelper.server import preload\npreload()")
    wanted = {
        "portmap.verbs",
        "portmap.nft",
        "portmap.xtables",
        "portmap.netlink",
        "bandwidth.verbs",
        "bandwidth.tc",
        "tuning.verbs",
        "tuning.apply",
    }
    assert wanted - loaded == set()


def test_rehearsals_are_each_plugins_usual_calls_and_never_iptables() -> None:
    calls = server.rehearsal()
    assert [(p, c) for p, c, _ in calls] == [
        ("portmap", "ADD"),
        ("portmap", "DEL"),
        ("bandwidth", "DEL"),
        ("tuning", "DEL"),
    ]
    for plugin, _, keys in calls:
        conf = json.loads(server._rehearsal_conf(plugin, keys, "/proc/self/fd/7"))
        assert conf["type"] == plugin
        assert conf["prevResult"]["interfaces"][0]["sandbox"] == "/proc/self/fd/7"
        if plugin == "portmap":
            # python-iptables keeps tables (and libiptc a socket) per process
            assert conf["backend"] == "nftables"
            assert conf["runtimeConfig"]["portMappings"]


def test_hook_release_frees_rehearsal_contexts() -> None:
    from portmap import libnftables, nft

    nft.Nft()  # a context, as a rehearsal leaves one (no kernel call: no root needed)
    assert libnftables._live != []
    for hooks in server.HOOKS.values():
        hooks.release()
    assert libnftables._live == []

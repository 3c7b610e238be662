"""Each plugin's hooks module is all the resident helper (cnihelper.server) touches of it
besides the table of contents: preload warms what the verbs use."""

from __future__ import annotations

import subprocess
import sys


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

"""cnichain's pytest plugin as a user's session sees it: a failing test still gets its
namespaces and attachments cleaned up, and what cleanup finds left over is an error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.root

INNER = """
import json, os
from pathlib import Path

CONFLIST = {{
    "cniVersion": "1.0.0", "name": "inner",
    "plugins": [
        {{"type": "bridge", "bridge": "in-br0", "isGateway": True,
          "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "10.66.0.0/24"}}]]}}}},
        {{"type": "tuning", "mtu": 1400}},
    ],
}}
PATH = {path!r}


def test_fails_after_attaching(cni_chain):
    cni_chain.attach(cni_chain.network(CONFLIST, PATH))
    Path({names!r}).write_text(json.dumps([cni_chain.host.name, cni_chain.ctr.name]))
    assert False, "the test body failed"


def test_leaves_a_state_file(cni_chain):
    stale = cni_chain.state_root / "tuning" / "stale-record"
    stale.parent.mkdir(parents=True)
    stale.write_text("{{}}")
"""


def test_failing_test_is_cleaned_up_and_leftovers_are_errors(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    from tests.harness.plugins import GO_BIN, OUR_BIN

    names = tmp_path / "names.json"
    pytester.makepyfile(INNER.format(path=[str(OUR_BIN), str(GO_BIN)], names=str(names)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*state files left after DEL:*tuning/stale-record*"])
    for name in json.loads(names.read_text()):
        assert name.startswith("cnit-")
        assert not os.path.exists(f"/run/netns/{name}")

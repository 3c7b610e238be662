"""After an install, the node's podman must run our plugins, or install.sh says the one
line that makes it so. Debian's podman 4.3 searches /usr/lib/cni (the Go plugins of
containernetworking-plugins) before /opt/cni/bin. Scratch roots, as tests/runtimes/test_install.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.plugins import GO_BIN, OUR_BIN, REPO

pytestmark = pytest.mark.root

INSTALL = REPO / "deploy" / "install.sh"
VENV = Path(OUR_BIN).parent
# What podman 4's containers/common searches when containers.conf does not say, ours first.
THE_LINE = (
    'cni_plugin_dirs = ["/opt/cni/bin", "/usr/local/libexec/cni", "/usr/libexec/cni",'
    ' "/usr/local/lib/cni", "/usr/lib/cni"]'
)
# Debian's containers-common ships its containers.conf with every key commented out.
DEBIAN_CONF = """[network]
# Path to directory where CNI plugin binaries are located.
#
#cni_plugin_dirs = [
#  "/usr/local/libexec/cni",
#  "/usr/libexec/cni",
#  "/usr/local/lib/cni",
#  "/usr/lib/cni",
#  "/opt/cni/bin",
#]
"""


def debian_node(node: Path, *, podman: bool = True) -> Path:
    """A node with Debian's Go plugins in /usr/lib/cni and (or not) podman."""
    go = node / "usr" / "lib" / "cni"
    go.mkdir(parents=True)
    for name in ("bridge", "host-local", "portmap", "bandwidth", "tuning"):
        shutil.copy2(GO_BIN / name, go / name)
    if podman:
        (node / "usr" / "bin").mkdir(parents=True)
        (node / "usr" / "bin" / "podman").write_text("#!/bin/sh\n")
        (node / "usr" / "share" / "containers").mkdir(parents=True)
        (node / "usr" / "share" / "containers" / "containers.conf").write_text(DEBIAN_CONF)
    (node / "venv").symlink_to(VENV)  # --venv is named as seen inside the root
    return node


def install(node: Path) -> str:
    proc = subprocess.run(
        [str(INSTALL), "--quiet", "--root", str(node), "--venv", "/venv"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_install_under_debians_podman_prints_the_one_line_and_it_suffices(tmp_path: Path) -> None:
    node = debian_node(tmp_path / "node")
    said = install(node).splitlines()
    assert "/usr/lib/cni/portmap" in said[0]
    assert "of /etc/containers/containers.conf " in said[1]
    assert said[-1] == THE_LINE
    # The operator does what it says: the next install finds nothing to say.
    (node / "etc" / "containers").mkdir(parents=True)
    (node / "etc" / "containers" / "containers.conf").write_text(f"[network]\n{THE_LINE}\n")
    assert install(node) == ""


def test_a_containers_conf_that_searches_our_dir_first_needs_nothing(tmp_path: Path) -> None:
    node = debian_node(tmp_path / "node")
    (node / "etc" / "containers").mkdir(parents=True)
    (node / "etc" / "containers" / "containers.conf").write_text(
        '[engine]\ncni_plugin_dirs = ["/usr/lib/cni"]  # not [network]: podman ignores it\n'
        '[network]\ncni_plugin_dirs = [\n  "/opt/cni/bin/",  # ours\n  "/usr/lib/cni",\n]\n'
    )
    assert install(node) == ""


def test_a_containers_conf_that_leaves_our_dir_out_is_named(tmp_path: Path) -> None:
    node = debian_node(tmp_path / "node")
    (node / "etc" / "containers").mkdir(parents=True)
    (node / "etc" / "containers" / "containers.conf").write_text(
        '[network]\ncni_plugin_dirs = ["/usr/libexec/cni"]\n'
    )
    said = install(node).splitlines()
    assert "nothing in /opt/cni/bin (it is not searched)" in said[0]
    assert said[-1] == 'cni_plugin_dirs = ["/opt/cni/bin", "/usr/libexec/cni"]'


def test_without_podman_an_install_says_nothing_of_it(tmp_path: Path) -> None:
    assert install(debian_node(tmp_path / "node", podman=False)) == ""


def test_a_setting_in_containers_conf_d_is_changed_where_it_is(tmp_path: Path) -> None:
    node = debian_node(tmp_path / "node")
    drop_ins = node / "etc" / "containers" / "containers.conf.d"
    drop_ins.mkdir(parents=True)
    (drop_ins / "10-site.conf").write_text('[network]\ncni_plugin_dirs = ["/usr/lib/cni"]\n')
    said = install(node).splitlines()
    assert "/etc/containers/containers.conf.d/10-site.conf" in said[1]
    assert said[-1] == 'cni_plugin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]'

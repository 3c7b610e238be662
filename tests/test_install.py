"""deploy/install.sh, deploy/build-bundle.sh and the Kubernetes DaemonSet.

What a runtime needs from an installed plugin: an executable that works with an empty
environment, from any working directory, whatever PYTHON* variables the caller has, and
installing it must leave every other plugin in the bin dir alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.plugins import GO_BIN, OUR_BIN, REPO

INSTALL = REPO / "deploy" / "install.sh"
BUILD_BUNDLE = REPO / "deploy" / "build-bundle.sh"
MANIFEST = REPO / "deploy" / "kubernetes" / "daemonset.yaml"
PLUGINS = ("portmap", "bandwidth", "tuning")
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"  # resolved here: plugins get no PATH
VENV = Path(OUR_BIN).parent
SITE = next((VENV / "lib").glob("python3*/site-packages"))


def install(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(INSTALL), *args], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def version(exe: Path | str, *, cwd: str = "/", env: dict[str, str] | None = None,
            chroot: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """VERSION the way a runtime calls it: nothing but CNI_COMMAND unless env says more."""
    argv = [str(exe)] if chroot is None else [CHROOT, str(chroot), str(exe)]
    proc = subprocess.run(
        argv, input=b'{"cniVersion": "0.4.0"}', capture_output=True, check=False, cwd=cwd,
        env={"CNI_COMMAND": "VERSION", **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def go_bin_dir(dest: Path) -> Path:
    """A CNI bin dir as a node has it: the Go plugins, ours not yet there."""
    dest.mkdir(parents=True)
    for name in ("bridge", "host-local", "loopback", "portmap", "bandwidth", "tuning"):
        shutil.copy2(GO_BIN / name, dest / name)
    return dest


def test_installed_plugins_run_with_an_empty_environment_from_any_cwd(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    install("--quiet", "--venv", str(VENV), "--bin-dir", str(bin_dir),
            "--prefix", str(tmp_path / "prefix"))  # fmt: skip
    hostile = {"PYTHONPATH": str(tmp_path / "evil"), "PYTHONHOME": "/nonexistent",
               "PYTHONSAFEPATH": "", "PATH": ""}  # fmt: skip
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "common").mkdir()
    (evil / "common" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    for plugin in PLUGINS:
        exe = bin_dir / plugin
        assert os.access(exe, os.X_OK)
        assert version(exe)["cniVersion"] == "0.4.0"
        assert version(exe, cwd=str(evil), env=hostile)["supportedVersions"][-1] == "1.1.0"


def test_install_moves_go_plugins_aside_keeps_the_others_and_uninstall_restores(
    tmp_path: Path,
) -> None:
    bin_dir = go_bin_dir(tmp_path / "bin")
    before = {p.name: sha(p) for p in bin_dir.iterdir()}
    prefix = tmp_path / "prefix"
    install("--quiet", "--venv", str(VENV), "--bin-dir", str(bin_dir), "--prefix", str(prefix))
    for name in ("bridge", "host-local", "loopback"):
        assert sha(bin_dir / name) == before[name]
        version(bin_dir / name)  # the Go plugins still run
    for plugin in PLUGINS:
        assert sha(prefix / "displaced" / plugin) == before[plugin]
        assert b"cni-meta-plugins launcher" in (bin_dir / plugin).read_bytes()
    # A second install (an upgrade) must not displace our own launchers.
    install("--quiet", "--venv", str(VENV), "--bin-dir", str(bin_dir), "--prefix", str(prefix))
    assert {p.name for p in (prefix / "displaced").iterdir()} == set(PLUGINS)

    install("--quiet", "--uninstall", "--prefix", str(prefix))  # bin dir from the record
    assert {p.name: sha(p) for p in bin_dir.iterdir()} == before
    assert not prefix.exists()


def test_uninstall_without_install_changes_nothing(tmp_path: Path) -> None:
    bin_dir = go_bin_dir(tmp_path / "bin")
    before = {p.name: sha(p) for p in bin_dir.iterdir()}
    install("--quiet", "--uninstall", "--bin-dir", str(bin_dir), "--prefix", str(tmp_path / "p"))
    assert {p.name: sha(p) for p in bin_dir.iterdir()} == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bin-dir", "relative/bin"], "must be absolute"),
        (["--plugins", "portmap flannel"], "unknown plugin"),
        (["--venv", "/nonexistent"], "has no bin/python"),
        (["--bundle", "/tmp"], "not a bundle"),
        (["--frobnicate"], "unknown argument"),
    ],
)
def test_install_refuses_bad_arguments_clearly(
    tmp_path: Path, args: list[str], message: str
) -> None:
    proc = subprocess.run(
        [str(INSTALL), "--prefix", str(tmp_path / "p"), "--bin-dir", str(tmp_path / "b"), *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert message in proc.stderr


@pytest.mark.slow
def test_default_install_builds_its_own_venv_from_source(tmp_path: Path) -> None:
    """What `make install` does: a fresh venv, the project pip-installed (not editable)."""
    bin_dir, prefix = tmp_path / "bin", tmp_path / "prefix"
    install("--quiet", "--python", "/usr/bin/python3", "--bin-dir", str(bin_dir),
            "--prefix", str(prefix))  # fmt: skip
    assert (prefix / "venv").is_symlink()
    first_line = (bin_dir / "portmap").read_text().splitlines()[0]
    assert first_line == f"#!{prefix}/venv/bin/python -IS"
    for plugin in PLUGINS:
        version(bin_dir / plugin)
    # Not an editable install: the plugins do not depend on this checkout.
    probe = subprocess.run(
        [str(prefix / "venv" / "bin" / "python"), "-I", "-c",
         "import portmap, sys; sys.stdout.write(portmap.__file__)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert str(prefix) in probe.stdout and str(REPO) not in probe.stdout


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "b"
    subprocess.run(
        [str(BUILD_BUNDLE), str(out), "--python", "/usr/bin/python3", "--deps-from", str(SITE)],
        check=True, capture_output=True,
    )  # fmt: skip
    return out


def empty_root(path: Path) -> Path:
    """A root filesystem with nothing but a static /bin/sh: no libc, no Python."""
    (path / "bin").mkdir(parents=True)
    shutil.copy2("/bin/busybox", path / "bin" / "busybox")
    (path / "bin" / "sh").symlink_to("busybox")
    return path


@pytest.mark.root
def test_bundle_installed_into_a_scratch_root_runs_with_nothing_else_there(
    tmp_path: Path, bundle: Path
) -> None:
    root = empty_root(tmp_path / "node")
    install("--quiet", "--bundle", str(bundle), "--root", str(root))
    for plugin in PLUGINS:
        launcher = root / "opt" / "cni" / "bin" / plugin
        text = launcher.read_text()
        assert "/opt/cni-meta-plugins/bundle" in text and str(root) not in text
        assert version(f"/opt/cni/bin/{plugin}", chroot=root)["cniVersion"] == "0.4.0"
    # The kernel-facing library loads from the bundle too (libnftables).
    b = "/opt/cni-meta-plugins/bundle"
    code = (f"import sys; sys.path.insert(0, '{b}/site'); import pyroute2; "
            "from portmap import libnftables; libnftables.Context(); print('ok')")  # fmt: skip
    proc = subprocess.run(
        [CHROOT, str(root), f"{b}/lib/ld-linux.so", "--library-path", f"{b}/lib",
         f"{b}/bin/python3", "-I", "-S", "-c", code],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.stdout.strip() == "ok", proc.stderr


def manifest() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    doc: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    return doc


def test_daemonset_manifest_is_a_node_wide_installer() -> None:
    doc = manifest()
    assert doc["apiVersion"] == "apps/v1" and doc["kind"] == "DaemonSet"
    spec = doc["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items())
    pod = spec["template"]["spec"]
    assert {"operator": "Exists"} in pod["tolerations"]  # every node, control plane too
    assert pod["priorityClassName"] == "system-node-critical"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["cni-bin"]["hostPath"]["path"] == "/opt/cni/bin"
    assert len(pod["initContainers"]) == 1 and len(pod["containers"]) == 1
    for c in (*pod["initContainers"], *pod["containers"]):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"].get("privileged", False) is False


@pytest.mark.root
def test_daemonset_install_command_works_against_a_scratch_node(
    tmp_path: Path, bundle: Path
) -> None:
    """Run the init container's command as the kubelet would, with the node's / in a dir."""
    pod = manifest()["spec"]["template"]["spec"]
    init = pod["initContainers"][0]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    node = empty_root(tmp_path / "node")
    go_bin_dir(node / "opt" / "cni" / "bin")
    container = tmp_path / "container"  # the container's view: hostPaths at their mountPaths
    for mount in init["volumeMounts"]:
        if mount["name"] in volumes:
            host_dir = node / volumes[mount["name"]].lstrip("/")
            host_dir.mkdir(parents=True, exist_ok=True)
            inside = container / mount["mountPath"].lstrip("/")
            inside.parent.mkdir(parents=True, exist_ok=True)
            inside.symlink_to(host_dir)
    args = [a.replace("/bundle", str(bundle), 1) if a == "/bundle" else a for a in init["args"]]
    args = [str(container / "host") if a == "/host" else a for a in args]
    assert init["command"] == ["/install.sh"]
    install("--quiet", *args)
    for plugin in PLUGINS:
        assert version(f"/opt/cni/bin/{plugin}", chroot=node)["cniVersion"] == "0.4.0"
    assert sha(node / "opt" / "cni" / "bin" / "bridge") == sha(GO_BIN / "bridge")
    assert (node / "opt" / "cni-meta-plugins" / "displaced" / "portmap").exists()


def test_uninstall_removes_only_what_install_made_from_a_shared_prefix(tmp_path: Path) -> None:
    prefix = tmp_path / "opt"  # e.g. --prefix /opt: other software lives there too
    (prefix / "other").mkdir(parents=True)
    (prefix / "other" / "keep").write_text("not ours")
    bin_dir = tmp_path / "bin"
    install("--quiet", "--venv", str(VENV), "--bin-dir", str(bin_dir), "--prefix", str(prefix))
    install("--quiet", "--uninstall", "--bin-dir", str(bin_dir), "--prefix", str(prefix))
    assert sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*")) == ["other", "other/keep"]
    assert list(bin_dir.iterdir()) == []


@pytest.mark.root
def test_the_installed_helper_launcher_serves_the_installed_plugins(tmp_path: Path) -> None:
    """install.sh writes PREFIX/cni-meta-helper (what the systemd unit and the DaemonSet's
    helper-patch.yaml run); it serves the plugins installed beside it (same code), and
    uninstall removes it."""
    bin_dir, prefix = tmp_path / "bin", tmp_path / "prefix"
    install("--quiet", "--venv", str(VENV), "--bin-dir", str(bin_dir), "--prefix", str(prefix))
    launcher = prefix / "cni-meta-helper"
    assert "cni-meta-plugins launcher" in launcher.read_text()
    sock = tmp_path / "helper.sock"
    helper = subprocess.Popen(
        [str(launcher), "--socket", str(sock)], env={},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    children = Path(f"/proc/{helper.pid}/task/{helper.pid}/children")
    try:
        for _ in range(600):
            if sock.exists():
                break
            assert helper.poll() is None, helper.stderr and helper.stderr.read()
            time.sleep(0.05)
        time.sleep(0.5)  # its spares are forked
        spares = set(children.read_text().split())
        assert spares
        assert version(bin_dir / "tuning", env={"CNI_META_HELPER": str(sock)})["cniVersion"]
        # Seen from outside: the spare that took the call exits when it is done (and is
        # replaced); one that declined the call would say why on the helper's stderr.
        for _ in range(100):
            if spares - set(children.read_text().split()):
                break
            time.sleep(0.05)
        assert spares - set(children.read_text().split()), "no spare took the call"
    finally:
        helper.terminate()
        helper.wait(30)
    assert helper.stderr is not None
    assert "declined" not in helper.stderr.read().decode()
    install("--quiet", "--uninstall", "--bin-dir", str(bin_dir), "--prefix", str(prefix))
    assert not prefix.exists()


def test_daemonset_helper_patch_runs_the_installed_helper_on_the_plugins_socket() -> None:
    yaml = pytest.importorskip("yaml")
    from common import fastpath

    pod = manifest()["spec"]["template"]["spec"]
    patch = yaml.safe_load((MANIFEST.parent / "helper-patch.yaml").read_text())
    extra = patch["spec"]["template"]["spec"]
    assert extra["hostPID"] is True  # the helper serves callers in its own pid namespace
    (helper,) = extra["containers"]
    assert helper["name"] not in {c["name"] for c in pod["containers"]}
    prefix_dir = next(a for a in pod["initContainers"][0]["args"] if a.startswith("/opt/cni-meta"))
    assert helper["command"] == [f"{prefix_dir}/cni-meta-helper"]
    assert helper["args"] == ["--socket", fastpath.DEFAULT_SOCKET]
    volumes = {v["name"]: v for v in [*pod["volumes"], *extra["volumes"]]}
    mounts = {m["mountPath"]: m["name"] for m in helper["volumeMounts"]}
    # The installed tree at the path the plugins' launchers name (same code id), and the
    # socket's directory as the node's runtime sees it.
    assert volumes[mounts[prefix_dir]]["hostPath"]["path"] == prefix_dir
    sock_dir = os.path.dirname(fastpath.DEFAULT_SOCKET)
    assert volumes[mounts[sock_dir]]["hostPath"]["path"] == sock_dir
    unpatch = yaml.safe_load((MANIFEST.parent / "helper-unpatch.yaml").read_text())
    undo = unpatch["spec"]["template"]["spec"]
    assert undo["hostPID"] is False
    assert [c["name"] for c in undo["containers"]] == [helper["name"]]
    assert {v["name"] for v in undo["volumes"]} == {v["name"] for v in extra["volumes"]}

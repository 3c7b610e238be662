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
from pathlib import Path
from typing import Any

import pytest

from tests.harness.plugins import GO_BIN, OUR_BIN, REPO

INSTALL = REPO / "deploy" / "install.sh"
BUILD_BUNDLE = REPO / "deploy" / "build-bundle.sh"
MANIFEST = REPO / "deploy" / "kubernetes" / "daemonset.yaml"
PLUGINS = ("portmap", "bandwidth", "tuning", "flatnet", "flatnet-ipam")
# Ours that have a Go plugin of the same name, which an install moves aside.
REPLACES_GO = ("portmap", "bandwidth", "tuning")
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
    for plugin in REPLACES_GO:
        assert sha(prefix / "displaced" / plugin) == before[plugin]
    for plugin in PLUGINS:
        assert b"cni-meta-plugins launcher" in (bin_dir / plugin).read_bytes()
    # A second install (an upgrade) must not displace our own launchers.
    install("--quiet", "--venv", str(VENV), "--bin-dir", str(bin_dir), "--prefix", str(prefix))
    assert {p.name for p in (prefix / "displaced").iterdir()} == set(REPLACES_GO)

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
    assert (prefix / "venv").is_symlink()  # names the current tree; launchers name it too
    tree = (prefix / "venv").resolve()
    assert tree.parent == prefix and tree.name.startswith("venv.")
    first_line = (bin_dir / "portmap").read_text().splitlines()[0]
    assert first_line == f"#!{tree}/bin/python -IS"
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
        assert "/opt/cni-meta-plugins/bundle." in text and str(root) not in text
        assert version(f"/opt/cni/bin/{plugin}", chroot=root)["cniVersion"] == "0.4.0"
    # The kernel-facing library loads from the bundle too (libnftables).
    b = "/opt/cni-meta-plugins/bundle"
    code = (f"import sys; sys.path.insert(0, '{b}/site'); import pyroute2; "
            "from common import libnftables; libnftables.Context(); print('ok')")  # fmt: skip
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


# ------------------------------------------------------- names install.sh did not make


def listing(top: Path) -> list[str]:
    return sorted(str(p.relative_to(top)) for p in top.rglob("*"))


def scratch_node(path: Path) -> Path:
    """A scratch root whose /opt already holds other software's names, like ours."""
    for name in ("venv.2023-backup", "bundle.keep-me", "other"):
        (path / "opt" / name).mkdir(parents=True)
        (path / "opt" / name / "keep").write_text("not ours")
    return path


def test_uninstall_from_a_shared_prefix_removes_only_the_names_it_recorded(
    tmp_path: Path,
) -> None:
    """Finding 4: with --prefix /opt, --uninstall removed /opt/venv.2023-backup and
    /opt/bundle, which install.sh never made."""
    node = scratch_node(tmp_path / "node")
    (node / "opt" / "bundle").mkdir()
    (node / "opt" / "bundle" / "keep").write_text("not ours")
    (node / "env").symlink_to(VENV)  # --venv names a path inside the root
    before = listing(node / "opt")
    where = ("--root", str(node), "--prefix", "/opt", "--bin-dir", "/opt/cni/bin")
    install("--quiet", "--venv", "/env", *where)
    assert (node / "opt" / "cni" / "bin" / "portmap").exists()
    install("--quiet", "--uninstall", *where)
    assert listing(node / "opt") == sorted([*before, "cni", "cni/bin"])


@pytest.mark.root
def test_bundle_installs_and_uninstall_leave_names_they_did_not_make(
    tmp_path: Path, bundle: Path
) -> None:
    """Finding 4: a --bundle install removed /opt/bundle.keep-me (every sibling of the
    bundle link); and a name it did not make is refused, not taken over."""
    node = scratch_node(tmp_path / "node")
    before = listing(node / "opt")
    where = ("--root", str(node), "--prefix", "/opt", "--bin-dir", "/cni")
    for _ in range(3):  # an install and two upgrades
        install("--quiet", "--bundle", str(bundle), *where)
        assert set(before) <= set(listing(node / "opt"))
    install("--quiet", "--uninstall", *where)
    assert listing(node / "opt") == before

    (node / "opt" / "bundle").mkdir()  # not ours: install.sh must not replace it
    before = listing(node)
    proc = subprocess.run([str(INSTALL), "--bundle", str(bundle), *where],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode != 0
    assert f"{node}/opt/bundle exists and was not made by install.sh" in proc.stderr
    assert listing(node) == before  # refused before anything was written


# ------------------------------------------------------------------ the retired helper

HELPER_UNIT = "etc/systemd/system/cni-meta-helper.service"
HELPER_WANTS = "etc/systemd/system/multi-user.target.wants/cni-meta-helper.service"


def helper_era_node(path: Path) -> Path:
    """A scratch root as an install with the resident helper left it: the unit that
    `make install-helper` wrote and enabled, the helper's launcher, the venv link and its
    tree, and the install record of that version (no list of names)."""
    empty_root(path)
    prefix = path / "opt" / "cni-meta-plugins"
    (prefix / "venv.1700000000.42" / "bin").mkdir(parents=True)
    (prefix / "venv").symlink_to("venv.1700000000.42")
    (prefix / "cni-meta-helper").write_text(
        "#!/opt/cni-meta-plugins/venv/bin/python -IS\n"
        "# cni-meta-plugins launcher: cni-meta-helper (deploy/install.sh)\n"
    )
    (prefix / ".cni-meta-plugins").write_text("bin_dir=/opt/cni/bin\nplugins=portmap\n")
    unit = path / HELPER_UNIT
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/opt/cni-meta-plugins/cni-meta-helper --socket "
                    "/run/cni/meta-helper.sock\n")  # fmt: skip
    (path / HELPER_WANTS).parent.mkdir()
    (path / HELPER_WANTS).symlink_to(f"/{HELPER_UNIT}")
    return path


def fake_systemctl(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A PATH whose systemctl only records its calls: none may happen below --root."""
    calls = tmp_path / "systemctl-calls"
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "systemctl").write_text(f'#!/bin/sh\necho "$*" >>{calls}\n')
    (fake / "systemctl").chmod(0o755)
    return {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}, calls


@pytest.mark.root
@pytest.mark.parametrize("action", ["upgrade", "uninstall"])
def test_over_a_helper_install_the_unit_and_launcher_are_removed(
    tmp_path: Path, bundle: Path, action: str
) -> None:
    node = helper_era_node(tmp_path / "node")
    env, calls = fake_systemctl(tmp_path)
    prefix = node / "opt" / "cni-meta-plugins"
    args = ["--uninstall"] if action == "uninstall" else ["--bundle", str(bundle)]
    proc = subprocess.run([str(INSTALL), "--quiet", "--root", str(node), *args],
                          capture_output=True, text=True, check=False, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not (node / HELPER_UNIT).exists()
    assert not (node / HELPER_WANTS).is_symlink()
    assert not (prefix / "cni-meta-helper").exists()
    assert not calls.exists(), "systemctl was called for a scratch root"
    if action == "uninstall":
        assert not prefix.exists()  # the old version's record was understood
    else:
        # The old tree stays for calls still running on it; the venv link, which would
        # name a tree that is no longer current, is gone.
        assert (prefix / "venv.1700000000.42").is_dir()
        assert not (prefix / "venv").exists()
        assert version("/opt/cni/bin/portmap", chroot=node)["cniVersion"]
        install("--quiet", "--root", str(node), "--uninstall")
        assert not prefix.exists()


def test_a_unit_of_that_name_for_another_prefix_is_left_alone(tmp_path: Path) -> None:
    """Only the unit that runs this prefix's helper launcher is ours to remove."""
    node = helper_era_node(tmp_path / "node")
    env, calls = fake_systemctl(tmp_path)
    proc = subprocess.run(
        [str(INSTALL), "--quiet", "--root", str(node), "--prefix", "/srv/cni", "--uninstall"],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (node / HELPER_UNIT).exists() and not calls.exists()


# -------------------------------------------------------- an upgrade under a running call

MARK = '\nimport sys as _tree\n_tree.stderr.write("tree={tag} " + __name__ + "\\n")\n'


def marked_bundle(src: Path, dest: Path, tag: str) -> Path:
    """A copy of the bundle whose common and tuning modules say which tree they came from
    (on stderr, when their import completes)."""
    shutil.copytree(src, dest, symlinks=True)
    for package in ("common", "tuning"):
        for cache in (dest / "site" / package).rglob("__pycache__"):
            shutil.rmtree(cache)
        for module in (dest / "site" / package).rglob("*.py"):
            module.write_text(module.read_text() + MARK.format(tag=tag))
    return dest


@pytest.mark.root
def test_a_call_running_during_an_upgrade_imports_only_its_own_tree(
    tmp_path: Path, bundle: Path
) -> None:
    """Finding 7: a call that started on the old tree and imports lazily (everything after
    reading stdin) must not load modules of the new one. The call is held in its read of
    stdin, past start-up, while the upgrade runs: no clock, a pipe the test controls."""
    old = marked_bundle(bundle, tmp_path / "old", "old")
    new = marked_bundle(bundle, tmp_path / "new", "new")
    bin_dir, prefix = tmp_path / "bin", tmp_path / "prefix"
    where = ("--bin-dir", str(bin_dir), "--prefix", str(prefix))
    install("--quiet", "--bundle", str(old), *where)
    old_tree = (prefix / "bundle").resolve()
    call = subprocess.Popen(
        [str(bin_dir / "tuning")], env={"CNI_COMMAND": "ADD"},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert call.stdin is not None and call.stderr is not None
    seen: list[str] = []
    while "tree=old common.skel\n" not in seen:  # started: next it reads stdin
        line = call.stderr.readline().decode()
        assert line, f"the call ended before reading stdin: {seen}"
        seen.append(line)
    try:
        install("--quiet", "--bundle", str(new), *where)
    finally:
        out, err = call.communicate(b'{"cniVersion": "1.0.0", "name": "n", "type": "tuning"}')
    after = err.decode().splitlines()
    assert "tree=old common.config" in after, after  # it did import lazily, after the upgrade
    assert not [line for line in after if line.startswith("tree=new")], after
    assert json.loads(out)["code"]  # no CNI_CONTAINERID etc.: an error, as from any version

    # A new call runs the new tree; the old one stays for calls like the one above until
    # the next upgrade, which removes it.
    fresh = subprocess.run([str(bin_dir / "tuning")], env={"CNI_COMMAND": "VERSION"},
                           input=b"{}", capture_output=True, check=True)  # fmt: skip
    marks = [line for line in fresh.stderr.decode().splitlines() if line.startswith("tree=")]
    assert marks and all(line.startswith("tree=new") for line in marks), marks
    assert old_tree.is_dir()
    install("--quiet", "--bundle", str(new), *where)
    assert not old_tree.exists()
    install("--quiet", "--uninstall", *where)
    assert not prefix.exists()


# ------------------------------------------------ whose Python runs, and an aborted install


def failing_install(
    tmp_path: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """An install that builds a venv and whose pip then fails at once: the source's
    pyproject.toml is not TOML and no index is asked (PIP_NO_INDEX)."""
    source = tmp_path / "broken-source"
    source.mkdir(exist_ok=True)
    (source / "pyproject.toml").write_text("[project\nthis is not toml\n")
    proc = subprocess.run(
        [str(INSTALL), "--quiet", "--source", str(source), "--bin-dir", str(tmp_path / "bin"),
         "--prefix", str(tmp_path / "prefix"), *args],
        capture_output=True, text=True, check=False, cwd=cwd or tmp_path,
        env={**os.environ, "PIP_NO_INDEX": "1", **(env or {})},
    )  # fmt: skip
    return proc


PLANTED = {
    # what a local user could leave in the directory root runs install.sh from
    "venv.py": {"venv.py": "import pathlib; pathlib.Path({mark!r}).write_text('venv.py ran')\n"},
    "pip/": {
        "pip/__init__.py": "",
        "pip/__main__.py": "import pathlib; pathlib.Path({mark!r}).write_text('pip/ ran')\n",
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("planted", PLANTED)
def test_a_venv_py_or_pip_planted_in_the_cwd_is_not_run(tmp_path: Path, planted: str) -> None:
    """Finding 6 of issue 29: `python -m venv` and `-m pip` without -I imported a venv.py
    or pip/ from the working directory, as root."""
    cwd, mark = tmp_path / "cwd", tmp_path / "planted-code-ran"
    for name, text in PLANTED[planted].items():
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text(text.format(mark=str(mark)))
    proc = failing_install(tmp_path, cwd=cwd)
    assert not mark.exists(), mark.read_text()
    assert proc.returncode == 1
    assert "pip install failed" in proc.stderr  # the real venv and pip ran, up to pip's end
    # ... and the aborted install left nothing: no tree, no record, no prefix
    assert not (tmp_path / "prefix").exists(), listing(tmp_path / "prefix")


@pytest.mark.slow
def test_the_venv_is_built_by_the_system_python_not_the_first_on_path(tmp_path: Path) -> None:
    """Where python3 on PATH is not the system's (pyenv, conda), the node's venv was
    built with it: the default is /usr/bin/python3."""
    fake_bin, mark = tmp_path / "fake-bin", tmp_path / "fake-python-ran"
    fake_bin.mkdir()
    fake = fake_bin / "python3"
    fake.write_text(f'#!/bin/sh\necho ran > {mark}\nexec /usr/bin/python3 "$@"\n')
    fake.chmod(0o755)
    proc = failing_install(tmp_path, env={"PATH": f"{fake_bin}:{os.environ['PATH']}"})
    assert not mark.exists()
    assert "pip install failed" in proc.stderr
    # --python still chooses another one
    failing_install(tmp_path, "--python", str(fake))
    assert mark.exists()


def test_an_install_aborted_midway_leaves_no_tree_and_no_record(tmp_path: Path) -> None:
    """Finding 6 of issue 29: a failed `python -m venv` left an empty, recorded tree (and
    the prefix and its record) behind."""
    proc = failing_install(tmp_path, "--python", "/bin/false")
    assert not (tmp_path / "prefix").exists(), listing(tmp_path / "prefix")
    assert proc.returncode == 1
    assert "-m venv failed" in proc.stderr


def test_an_upgrade_aborted_midway_leaves_the_install_as_it_was(tmp_path: Path) -> None:
    prefix, bin_dir = tmp_path / "prefix", tmp_path / "bin"
    install("--quiet", "--venv", str(VENV), "--bin-dir", str(bin_dir), "--prefix", str(prefix))

    def contents() -> dict[Path, bytes | None]:
        found = [*prefix.rglob("*"), *bin_dir.rglob("*")]
        return {p: None if p.is_dir() else p.read_bytes() for p in found}

    before = contents()
    assert failing_install(tmp_path, "--python", "/bin/false").returncode == 1
    assert contents() == before


def test_an_unknown_flag_is_named_in_one_line_with_exit_2(tmp_path: Path) -> None:
    """Issue 33 item 6: an unknown flag printed the whole help."""
    proc = subprocess.run([str(INSTALL), "--frobnicate"], capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == "install.sh: unknown argument: --frobnicate (see --help)\n"
    assert proc.stdout == ""

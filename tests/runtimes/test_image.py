"""The DaemonSet's image (`make image`: deploy/build-image.sh, deploy/Containerfile) and the
manifests that run it (deploy/kubernetes/daemonset.yaml and uninstall.yaml).

podman builds the image offline (in a network namespace of its own that has nothing but a
loopback, so a registry pull could only fail) into a private storage root, and runs it with
`--network none` against a throwaway host root. Every podman command runs in a private
mount namespace whose /var/lib (podman's blob cache) and /run (runc's state) are the
test's own: the machine's podman storage, mount table and network namespace are left alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.plugins import GO_BIN, OUR_BIN, REPO
from tests.harness.runtimes import stop_process, wait_for

BUILD_IMAGE = REPO / "deploy" / "build-image.sh"
MANIFESTS = REPO / "deploy" / "kubernetes"
PLUGINS = ("portmap", "bandwidth", "tuning", "flatnet", "flatnet-ipam")
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"  # resolved here: plugins get no PATH
SITE = next((Path(OUR_BIN).parent / "lib").glob("python3*/site-packages"))
TAG = "localhost/cmpt-cni-meta-plugins:test"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

# Run "$@" with the test's own /var/lib ("$1") and an empty /run (in a new mount namespace).
PRIVATE_JAIL = 'mount --bind "$1" /var/lib && mount -t tmpfs tmpfs /run && shift && exec "$@"'


def load(name: str) -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    doc: dict[str, Any] = yaml.safe_load((MANIFESTS / name).read_text())
    return doc


def pod_spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = load(name)["spec"]["template"]["spec"]
    return spec


# ------------------------------------------------------------------ the manifests as data


def test_both_manifests_pin_one_image_by_digest() -> None:
    """`kubectl set image '*=REF@sha256:...'` (the documented procedure) replaces every
    image of both manifests; each must already be a digest reference, never a tag."""
    images = {
        c["image"]
        for name in ("daemonset.yaml", "uninstall.yaml")
        for c in (*pod_spec(name)["initContainers"], *pod_spec(name)["containers"])
    }
    assert len(images) == 1
    (image,) = images
    name, _, digest = image.partition("@")
    assert name.rsplit("/", 1)[-1] == "cni-meta-plugins" and DIGEST.fullmatch(digest)


def test_uninstall_manifest_mirrors_the_install() -> None:
    install, uninstall = pod_spec("daemonset.yaml"), pod_spec("uninstall.yaml")
    assert load("uninstall.yaml")["kind"] == "DaemonSet"  # one pod on every node, as install
    for key in ("volumes", "tolerations", "nodeSelector", "hostNetwork", "priorityClassName"):
        assert uninstall[key] == install[key], key
    (init_i,), (init_u,) = install["initContainers"], uninstall["initContainers"]
    assert init_u["command"] == init_i["command"] == ["/install.sh"]
    assert init_u["volumeMounts"] == init_i["volumeMounts"]
    assert "--uninstall" in init_u["args"] and "--uninstall" not in init_i["args"]
    assert [a for a in init_u["args"] if a != "--uninstall"] == [
        a for a in init_i["args"] if a not in ("--bundle", "/bundle")
    ]


# ------------------------------------------------------------------------ podman, privately


@dataclass
class PrivatePodman:
    """podman with its own storage, config and state, each command in a private mount ns."""

    workdir: Path
    runroot: Path  # podman refuses a runroot longer than 50 characters

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.workdir / "containers.conf")}

    def setup(self) -> PrivatePodman:
        for d in ("tmp", "var-lib"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        # runc, cgroupfs and file locks: what works on every test machine (crun fails on
        # hybrid cgroups; the default locks live in the machine's /dev/shm). The network
        # backend pinned: with none set, podman picks netavark for a fresh store wherever
        # netavark is installed (the podman bench installs it).
        (self.workdir / "containers.conf").write_text(
            f"""[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[network]
network_backend = "cni"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{self.workdir / "events.log"}"
tmp_dir = "{self.workdir / "tmp"}"
lock_type = "file"
"""
        )
        return self

    @property
    def command(self) -> list[str]:
        return ["podman", "--root", str(self.workdir / "storage"), "--runroot",
                str(self.runroot), "--storage-driver", "vfs"]  # fmt: skip

    def jailed(self, argv: list[str], *, offline: bool = False) -> list[str]:
        net = ["--net"] if offline else []
        return ["unshare", "--mount", "--propagation", "slave", *net, "--", "sh", "-c",
                PRIVATE_JAIL, "sh", str(self.workdir / "var-lib"), *argv]  # fmt: skip

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.jailed([*self.command, *args]), env=self.env,
                              capture_output=True, text=True, check=False)  # fmt: skip
        if check:
            assert proc.returncode == 0, f"podman {' '.join(args)}: {proc.stderr}"
        return proc

    def build(self, context: Path) -> str:
        """deploy/build-image.sh as `make image` runs it, offline; returns the digest."""
        env = {**self.env, "PODMAN": " ".join(self.command)}
        argv = [str(BUILD_IMAGE), "--tag", TAG, "--deps-from", str(SITE), "--context", str(context)]
        proc = subprocess.run(self.jailed(argv, offline=True), env=env, capture_output=True,
                              text=True, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        image, digest = proc.stdout.splitlines()[-2:]
        assert image.split() == ["image:", TAG]
        return digest.split()[-1]


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivatePodman]:
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman/runc not installed")
    if not Path("/bin/busybox").is_file():
        pytest.skip("busybox-static not installed")
    runroot = Path(tempfile.mkdtemp(prefix="cmpt-img-"))
    pm = PrivatePodman(tmp_path_factory.mktemp("podman"), runroot).setup()
    try:
        yield pm
    finally:
        pm("rmi", "--all", "--force", check=False)
        shutil.rmtree(runroot, ignore_errors=True)
        shutil.rmtree(pm.workdir / "storage", ignore_errors=True)


@pytest.fixture(scope="module")
def image(podman: PrivatePodman, tmp_path_factory: pytest.TempPathFactory) -> str:
    return podman.build(tmp_path_factory.mktemp("context"))


# ---------------------------------------------------------------------------- a host root


def host_root(path: Path) -> Path:
    """A node's / as the image sees it at /host: the Go portmap and bridge in /opt/cni/bin,
    and a static busybox /bin/sh so that the launchers run under chroot."""
    (path / "bin").mkdir(parents=True)
    shutil.copy2("/bin/busybox", path / "bin" / "busybox")
    (path / "bin" / "sh").symlink_to("busybox")
    (path / "opt" / "cni" / "bin").mkdir(parents=True)
    for name in ("portmap", "bridge"):
        shutil.copy2(GO_BIN / name, path / "opt" / "cni" / "bin" / name)
    return path


def tree(top: Path) -> dict[str, bytes]:
    """Every path below top with its content (a symlink's target, b'' for a dir)."""
    out = {}
    for p in sorted(top.rglob("*")):
        rel = str(p.relative_to(top))
        if p.is_symlink():
            out[rel] = os.readlink(p).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            out[rel] = b""
    return out


def version_in(root: Path, exe: str) -> dict[str, Any]:
    proc = subprocess.run(
        [CHROOT, str(root), exe], input=b'{"cniVersion": "1.0.0"}', capture_output=True,
        check=False, env={"CNI_COMMAND": "VERSION"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


def modules_compiled_at_start(root: Path) -> list[str]:
    """The modules a plugin start compiles from source in the installed bundle, instead of
    loading their bytecode (python -v says `code object from X.py`)."""
    b = "/opt/cni-meta-plugins/bundle"
    code = f"import sys; sys.path.insert(0, '{b}/site'); import portmap.__main__"
    proc = subprocess.run(
        [CHROOT, str(root), f"{b}/lib/ld-linux.so", "--library-path", f"{b}/lib",
         f"{b}/bin/python3", "-I", "-S", "-v", "-c", code],
        capture_output=True, text=True, check=False, env={},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return re.findall(r"^# code object from (\S+\.py)$", proc.stderr, re.MULTILINE)


def assert_installed(root: Path) -> None:
    for plugin in PLUGINS:
        assert b"cni-meta-plugins launcher" in (root / "opt/cni/bin" / plugin).read_bytes()
        assert version_in(root, f"/opt/cni/bin/{plugin}")["cniVersion"] == "1.0.0"
    displaced = root / "opt/cni-meta-plugins/displaced/portmap"
    assert displaced.read_bytes() == (GO_BIN / "portmap").read_bytes()


# ---------------------------------------------------------------------------------- tests


@pytest.mark.root
@pytest.mark.slow
def test_image_is_built_offline_from_scratch_and_reproducibly(
    podman: PrivatePodman, image: str, tmp_path: Path
) -> None:
    assert DIGEST.fullmatch(image)
    info = json.loads(podman("image", "inspect", TAG).stdout)[0]
    assert info["Digest"] == image
    assert len(info["RootFS"]["Layers"]) == 1  # FROM scratch: one layer, no base image
    assert info["Config"]["Entrypoint"] == ["/install.sh", "--bundle", "/bundle", "--root", "/host"]
    # The same commit builds the same image, whatever the clock says.
    assert podman.build(tmp_path / "context") == image


@pytest.mark.root
@pytest.mark.slow
def test_image_installs_into_a_host_root_and_uninstall_restores_it(
    podman: PrivatePodman, image: str, tmp_path: Path
) -> None:
    root = host_root(tmp_path / "host")
    before = tree(root)
    run = ("run", "--rm", "--network", "none", "-v", f"{root}:/host", TAG)
    podman(*run)
    # Bytecode made at build time is still valid on the node: the first plugin start
    # compiles nothing (an image layer keeps whole seconds of the sources' times).
    assert modules_compiled_at_start(root) == []
    assert_installed(root)
    assert (root / "opt/cni/bin/bridge").read_bytes() == before["opt/cni/bin/bridge"]

    podman(*run, "--uninstall")
    assert tree(root) == before  # Go's portmap byte-identical, nothing of ours left


def kubelet_run_args(container: dict[str, Any], pod: dict[str, Any], node: Path) -> list[str]:
    """`podman run` options that give a manifest's container what the kubelet would: its
    command and args, user, capabilities, read-only root, and its volumes (hostPath from
    the node's root, emptyDir as a tmpfs)."""
    sc = container["securityContext"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    opts = ["--rm", "--network", "none", "--user", str(sc["runAsUser"]),
            "--cap-drop", "all"]  # fmt: skip
    for cap in sc["capabilities"].get("add", []):
        opts += ["--cap-add", cap]
    if sc["readOnlyRootFilesystem"]:
        opts.append("--read-only")
    if sc["allowPrivilegeEscalation"] is False:
        opts += ["--security-opt", "no-new-privileges"]
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            source = node / volume["hostPath"]["path"].lstrip("/")
            assert volume["hostPath"]["type"] == "DirectoryOrCreate"
            source.mkdir(parents=True, exist_ok=True)
            opts += ["-v", f"{source}:{mount['mountPath']}"]
        else:
            assert "emptyDir" in volume
            opts += ["--tmpfs", mount["mountPath"]]
    command = container["command"]
    return [*opts, "--entrypoint", command[0], TAG, *command[1:], *container.get("args", [])]


@pytest.mark.root
@pytest.mark.slow
def test_manifests_install_and_uninstall_as_the_kubelet_would_run_them(
    podman: PrivatePodman, image: str, tmp_path: Path
) -> None:
    """The init containers of daemonset.yaml and uninstall.yaml, run in the image with
    their exact command, user, capabilities, read-only root and volumes."""
    node = host_root(tmp_path / "node")
    (node / "opt" / "cni-meta-plugins").mkdir()  # the kubelet makes hostPath dirs
    before = tree(node)
    for name, check in (("daemonset.yaml", assert_installed), ("uninstall.yaml", None)):
        pod = pod_spec(name)
        (init,) = pod["initContainers"]
        podman("run", *kubelet_run_args(init, pod, node))
        if check is not None:
            check(node)
    # The prefix dir itself is a mount point in the container: it stays, empty.
    assert tree(node) == before


def keepalive_sleeps() -> bool:
    """The keepalive loop is in its `sleep 3600`, as nobody: its TERM trap is set."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uid = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        if cmdline == b"sleep\x003600\x00" and uid is not None and uid.group(1) == "65534":
            return True
    return False


@pytest.mark.root
@pytest.mark.slow
def test_keepalive_container_idles_as_nobody_and_stops_on_term(
    podman: PrivatePodman, image: str, tmp_path: Path
) -> None:
    """The DaemonSet's main container: its shell loop runs in the image as the manifest
    runs it (uid 65534, no capabilities, read-only root) and exits 0 on SIGTERM."""
    pod = pod_spec("daemonset.yaml")
    (keepalive,) = pod["containers"]
    argv = podman.jailed([*podman.command, "run", *kubelet_run_args(keepalive, pod, tmp_path)])
    proc = subprocess.Popen(argv, env=podman.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(keepalive_sleeps, timeout=120, what="the keepalive container's sleep")
        proc.send_signal(signal.SIGTERM)  # podman run passes it on to the container
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    finally:
        stop_process(proc)

"""A private containerd 1.6 with its CRI plugin: the path Kubernetes takes to our plugins.

The daemon runs inside the test's host netns and a private mount namespace (tmpfs over
/run, /var/lib redirected), with its own root, state, socket, opt path and CNI bin/conf
dirs. The pause image is an OCI tarball built here from busybox-static and imported with
ctr. The test talks CRI over gRPC with the PyPI package container-runtime-interface-api.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.netns import Netns
from tests.harness.runtimes import (
    MountJail,
    PathNetns,
    busybox_rootfs,
    stop_process,
    wait_for,
    write_conflist,
)

PAUSE_IMAGE = "docker.io/cmpt/pause:1"


def _blob(blobs: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def pause_image_tar(workdir: Path) -> Path:
    """An OCI image tarball whose entrypoint sleeps: the pod sandbox's pause container."""
    layout = workdir / "pause-oci"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    root = busybox_rootfs(workdir / "pause")
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        tar.add(root, arcname=".")
    layer_bytes = layer.getvalue()
    layer_digest, layer_size = _blob(blobs, layer_bytes)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/bin/sleep", "2147483647"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_digest, config_size = _blob(blobs, json.dumps(config).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer_size,
            }
        ],
    }
    manifest_digest, manifest_size = _blob(blobs, json.dumps(manifest).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "annotations": {
                    "io.containerd.image.name": PAUSE_IMAGE,
                    "org.opencontainers.image.ref.name": "1",
                },
                "platform": {"architecture": "amd64", "os": "linux"},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    out = workdir / "pause.tar"
    with tarfile.open(out, "w") as tar:
        tar.add(layout, arcname=".")
    return out


def config_toml(base: Path, sock: Path, bin_dirs: list[str], conf_dir: Path) -> str:
    # containerd 1.6 takes one CNI bin_dir: the test makes a dir of symlinks in search order.
    return f"""version = 2
root = "{base}/root"
state = "{base}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin_dirs[0]}"
    conf_dir = "{conf_dir}"
    max_conf_num = 1
"""


def merged_bin_dir(dest: Path, dirs: list[str]) -> Path:
    """One dir of symlinks, first dir winning: what a node's single CNI bin dir holds."""
    dest.mkdir(parents=True, exist_ok=True)
    for d in reversed(dirs):
        for entry in Path(d).iterdir():
            link = dest / entry.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(entry.resolve() if not entry.is_symlink() else entry)
    return dest


@dataclass
class Containerd:
    host: Netns
    workdir: Path
    cni_dirs: list[str]
    env: dict[str, str] = field(default_factory=dict)
    extra_plugins: tuple[dict[str, Any], ...] = ()  # appended to the conflist's chain
    # gRPC socket paths must stay under 108 bytes: keep them out of pytest's long tmp paths.
    short: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="cmpt-ctd-")))
    jail: MountJail | None = None
    proc: subprocess.Popen[bytes] | None = None
    channel: Any = None
    log: Path | None = None

    @property
    def sock(self) -> Path:
        return self.short / "c.sock"

    @property
    def conf_dir(self) -> Path:
        return self.workdir / "net.d"

    def start(self, conflist: str) -> None:
        write_conflist(conflist, self.conf_dir, self.workdir, self.extra_plugins)
        bin_dir = merged_bin_dir(self.workdir / "cni-bin", self.cni_dirs)
        cfg = self.workdir / "containerd.toml"
        cfg.write_text(config_toml(self.workdir, self.sock, [str(bin_dir)], self.conf_dir))
        self.jail = MountJail(self.host, self.workdir / "var-lib", tmpfs_run=True).start()
        self.log = self.workdir / "containerd.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.jail.argv("containerd", "--config", str(cfg), "--log-level", "info"),
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
            )  # fmt: skip
        wait_for(lambda: self.sock.exists() or self.proc_died(), 30, "containerd's socket")
        assert not self.proc_died(), self.log.read_text()[-3000:]
        tar = pause_image_tar(self.workdir)
        self.ctr("images", "import", "--snapshotter", "native", str(tar))
        import grpc  # type: ignore[import-untyped]  # heavy: only for these tests

        self.channel = grpc.insecure_channel(f"unix://{self.sock}")
        wait_for(self._cri_ready, 30, "the CRI plugin with a network ready")

    def proc_died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def ctr(self, *args: str) -> str:
        assert self.jail is not None
        argv = self.jail.argv("ctr", "--address", str(self.sock), "-n", "k8s.io", *args)
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        assert proc.returncode == 0, f"ctr {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    @property
    def runtime(self) -> Any:
        from cri_api.v1 import api_pb2_grpc

        return api_pb2_grpc.RuntimeServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def _cri_ready(self) -> bool:
        from cri_api.v1 import api_pb2

        try:
            status = self.runtime.Status(api_pb2.StatusRequest(), timeout=5)
        except Exception:  # not serving yet
            return False
        conditions = {c.type: c.status for c in status.status.conditions}
        return bool(conditions.get("NetworkReady"))

    def run_pod(
        self,
        name: str,
        ports: tuple[tuple[int, int, str], ...] = (),
        annotations: dict[str, str] | None = None,
    ) -> str:
        from cri_api.v1 import api_pb2

        protocols = {"tcp": api_pb2.TCP, "udp": api_pb2.UDP}
        config = api_pb2.PodSandboxConfig(
            metadata=api_pb2.PodSandboxMetadata(
                name=name, uid=f"uid-{name}", namespace="default", attempt=0
            ),
            hostname=name,
            log_directory=str(self.workdir / "pod-logs" / name),
            port_mappings=[
                api_pb2.PortMapping(protocol=protocols[proto], container_port=c, host_port=h)
                for h, c, proto in ports
            ],
            annotations=annotations or {},
            linux=api_pb2.LinuxPodSandboxConfig(cgroup_parent=""),
        )
        resp = self.runtime.RunPodSandbox(api_pb2.RunPodSandboxRequest(config=config), timeout=60)
        return str(resp.pod_sandbox_id)

    def pod_netns(self, pod_id: str) -> PathNetns:
        """The pod's netns through its pause process (the netns mount is jail-only)."""
        from cri_api.v1 import api_pb2

        status = self.runtime.PodSandboxStatus(
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id, verbose=True), timeout=30
        )
        info = json.loads(status.info["info"])
        pid = int(info["pid"])
        return PathNetns(name=f"pod-{pod_id[:12]}", ns_path=f"/proc/{pid}/ns/net")

    def pod_ip(self, pod_id: str) -> str:
        from cri_api.v1 import api_pb2

        status = self.runtime.PodSandboxStatus(
            api_pb2.PodSandboxStatusRequest(pod_sandbox_id=pod_id), timeout=30
        )
        return str(status.status.network.ip)

    def stop_pod(self, pod_id: str) -> None:
        from cri_api.v1 import api_pb2

        self.runtime.StopPodSandbox(
            api_pb2.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60
        )

    def remove_pod(self, pod_id: str) -> None:
        from cri_api.v1 import api_pb2

        self.runtime.RemovePodSandbox(
            api_pb2.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60
        )

    def remove_all_pods(self) -> None:
        from cri_api.v1 import api_pb2

        pods = self.runtime.ListPodSandbox(api_pb2.ListPodSandboxRequest(), timeout=30)
        for pod in pods.items:
            self.stop_pod(pod.id)
            self.remove_pod(pod.id)

    def stop(self) -> None:
        try:
            if self.channel is not None and not self.proc_died():
                self.remove_all_pods()
        finally:
            if self.channel is not None:
                self.channel.close()
            if self.proc is not None:
                stop_process(self.proc)
            if self.jail is not None:
                # Shims outlive a stopped containerd; they live in our jail, kill them by pid.
                for pid in self.jail.processes():
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.jail.stop()
            shutil.rmtree(self.short, ignore_errors=True)


@contextmanager
def containerd(
    host: Netns, workdir: Path, cni_dirs: list[str], conflist: str, env: dict[str, str]
) -> Iterator[Containerd]:
    ctd = Containerd(host, workdir, cni_dirs, env)
    try:
        ctd.start(conflist)
        yield ctd
    finally:
        ctd.stop()

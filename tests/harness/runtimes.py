"""Real container runtimes (podman, containerd, libcni's cnitool) driving our chains.

Runtimes put their containers, bridges and NAT rules in the network namespace they run in,
and their CNI caches under /var/lib/cni. So every runtime process here runs

  * inside a test-made "host" netns (nsenter --net, not `ip netns exec`: that remounts
    /sys and hides the cgroup mounts runc needs), and
  * inside a private mount namespace (a long-lived holder process per test) where
    /var/lib is a bind mount of a directory under the test's tmp dir, and every mount the
    runtime makes (netns bind mounts, container shm) stays private.

The machine's own netns, /var/lib/cni and mount table are never touched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.netns import Netns
from tests.harness.plugins import CONFLISTS, GO_BIN, OUR_BIN, REPO, PluginRun

HOST_ADDR = "198.51.100.1"  # the host's "uplink" address, inside the test's host netns
CLIENT_ADDR = "198.51.100.2"  # a client machine on that uplink (its own netns)
HOST_ADDR6 = "2001:db8:51::1"
CLIENT_ADDR6 = "2001:db8:51::2"


@dataclass
class Uplink:
    client: Netns
    host_addr: str = HOST_ADDR
    client_addr: str = CLIENT_ADDR
    host_addr6: str = HOST_ADDR6
    client_addr6: str = CLIENT_ADDR6


INSTALL_SH = REPO / "deploy" / "install.sh"
BUSYBOX = Path("/bin/busybox")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def have(binary: str) -> bool:
    return shutil.which(binary) is not None


# ------------------------------------------------------------------------- installation


def install_ours(bin_dir: Path, prefix: Path) -> Path:
    """Install our plugins with deploy/install.sh, reusing the test venv (no network)."""
    venv = Path(OUR_BIN).parent
    subprocess.run(
        [str(INSTALL_SH), "--quiet", "--venv", str(venv), "--bin-dir", str(bin_dir),
         "--prefix", str(prefix)],
        check=True, capture_output=True,
    )  # fmt: skip
    return bin_dir


def plugin_dirs(which: str, our_bin: Path | None) -> list[str]:
    """Where the runtime looks for plugins: ours first (like a real install), then Go."""
    if which == "go":
        return [str(GO_BIN)]
    assert our_bin is not None
    return [str(our_bin), str(GO_BIN)]


# ----------------------------------------------------------------------------- conflists


def write_conflist(
    name: str,
    dest_dir: Path,
    data_dir: Path,
    extra_plugins: tuple[dict[str, Any], ...] = (),
    *,
    source: Path = CONFLISTS,
    **overrides: Any,
) -> dict[str, Any]:
    """Copy <source>/<name> (conflists/ by default) to dest_dir with every on-disk state
    path inside data_dir.

    host-local keeps leases in /var/lib/cni/networks and tuning its backups in
    /run/cni/tuning by default: tests must keep both in their tmp dir.
    """
    raw: dict[str, Any] = json.loads((source / name).read_text())
    raw.update(overrides)
    raw["plugins"] = [*raw["plugins"], *extra_plugins]
    for plugin in raw["plugins"]:
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and ipam.get("type") in ("host-local", "flatnet-ipam"):
            ipam["dataDir"] = str(data_dir / "host-local")
        if plugin.get("type") == "tuning":
            plugin["dataDir"] = str(data_dir / "tuning")
    dest_dir.mkdir(parents=True, exist_ok=True)
    (dest_dir / name).write_text(json.dumps(raw, indent=2))
    return raw


# ------------------------------------------------------------------------ private mounts


@dataclass
class MountJail:
    """A private mount namespace, held open by a sleeping process, with /var/lib redirected.

    `argv(...)` wraps a command so that it runs in this mount namespace and in `host`'s
    network namespace. All commands of one test share it, so mounts that one runtime
    command makes (a container's netns) are seen by the next one (its teardown).
    """

    host: Netns
    var_lib: Path
    tmpfs_run: bool = False  # also a private /run (containerd's shim sockets, runc state)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MountJail:
        self.var_lib.mkdir(parents=True, exist_ok=True)
        run = "mount -t tmpfs tmpfs /run && " if self.tmpfs_run else ""
        script = f'mount --bind "$1" /var/lib && {run}echo ready && exec sleep infinity'
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", script, "sh",
             str(self.var_lib)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            err = self.proc.stderr.read() if self.proc.stderr else b""
            raise RuntimeError(f"cannot make a private mount namespace: {err.decode()}")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def argv(self, *command: str) -> list[str]:
        return [
            "nsenter", f"--mount=/proc/{self.pid}/ns/mnt", f"--net={self.host.path}", "--",
            *command,
        ]  # fmt: skip

    def processes(self) -> list[int]:
        """Processes living in this mount namespace (daemons' children), except the holder."""
        ns = os.readlink(f"/proc/{self.pid}/ns/mnt")
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != self.pid:
                with suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                        found.append(int(entry))
        return found

    def path(self, inside: str) -> Path:
        """A path as processes in the jail see it (its private /run, /var/lib)."""
        return Path(f"/proc/{self.pid}/root") / inside.lstrip("/")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@contextmanager
def mount_jail(host: Netns, var_lib: Path, tmpfs_run: bool = False) -> Iterator[MountJail]:
    jail = MountJail(host, var_lib, tmpfs_run).start()
    try:
        yield jail
    finally:
        jail.stop()


@dataclass
class PathNetns(Netns):
    """A netns known by path (a runtime's sandbox), usable where harness code wants Netns."""

    ns_path: str = ""

    @property
    def path(self) -> str:
        return self.ns_path


# ------------------------------------------------------------------------------- images


def busybox_rootfs(dest: Path) -> Path:
    """A minimal root filesystem from Debian's busybox-static (no registry here)."""
    root = dest / "rootfs"
    for d in ("bin", "www", "tmp", "proc", "sys", "dev", "etc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "httpd", "nc", "ip", "cat", "sleep", "ls", "wget", "echo"):
        link = root / "bin" / applet
        if not link.exists():
            link.symlink_to("busybox")
    (root / "www" / "index.html").write_text("hello from busybox\n")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    (root / "etc" / "group").write_text("root:x:0:\n")
    return root


def rootfs_tar(dest: Path) -> Path:
    root = busybox_rootfs(dest)
    out = dest / "rootfs.tar"
    with tarfile.open(out, "w") as tar:
        tar.add(root, arcname=".")
    return out


# ------------------------------------------------------------------------------- podman


@dataclass
class Podman:
    """podman 4 with the CNI backend, fully private: storage, config, networks, caches."""

    host: Netns
    workdir: Path
    plugin_dirs: list[str]
    env: dict[str, str] = field(default_factory=dict)
    jail: MountJail | None = None
    image: str = "localhost/cmpt-busybox:latest"
    # podman refuses a runroot longer than 50 characters: pytest's tmp paths are longer.
    runroot: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="cmpt-pm-")))

    @property
    def net_dir(self) -> Path:
        return self.workdir / "net.d"

    @property
    def conf(self) -> Path:
        return self.workdir / "containers.conf"

    def write_config(self) -> None:
        self.net_dir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "tmp").mkdir(exist_ok=True)
        dirs = ", ".join(json.dumps(d) for d in self.plugin_dirs)
        # crun fails on this machine's hybrid cgroups; root lacks CAP_SYS_RESOURCE so the
        # default ulimits cannot be raised; file locks keep us off /dev/shm/libpod_lock.
        self.conf.write_text(
            f"""[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[network]
network_backend = "cni"
cni_plugin_dirs = [{dirs}]
network_config_dir = "{self.net_dir}"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{self.workdir / "events.log"}"
tmp_dir = "{self.workdir / "tmp"}"
lock_type = "file"
"""
        )

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> PluginRun:
        assert self.jail is not None
        argv = self.jail.argv(
            "podman", "--root", str(self.workdir / "storage"),
            "--runroot", str(self.runroot), "--storage-driver", "vfs", *args,
        )  # fmt: skip
        env = {**os.environ, **self.env, "CONTAINERS_CONF": str(self.conf)}
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=timeout, check=False)
        out = PluginRun(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
        if check:
            assert out.returncode == 0, f"podman {' '.join(args)} failed: {out.stderr}"
        return out

    def import_image(self) -> None:
        tar = rootfs_tar(self.workdir)
        self.run("import", str(tar), self.image)

    def add_network(
        self, conflist: str, extra_plugins: tuple[dict[str, Any], ...] = (), **overrides: Any
    ) -> str:
        raw = write_conflist(conflist, self.net_dir, self.workdir, extra_plugins, **overrides)
        return str(raw["name"])

    @property
    def state_root(self) -> Path:
        """Our plugins' default state root as podman's plugins see it (jail-private /run)."""
        assert self.jail is not None
        return self.jail.path("/run/cni/meta-plugins")

    def sandbox(self, container: str) -> PathNetns:
        """The container's netns, through its process (the /run/netns mount is jail-only)."""
        pid = self.run("inspect", "-f", "{{.State.Pid}}", container).stdout.strip()
        return PathNetns(name=f"{container}-pid{pid}", ns_path=f"/proc/{pid}/ns/net")

    def remove_all(self) -> None:
        self.run("rm", "-a", "-f", "-t", "0", check=False)


@contextmanager
def podman(host: Netns, workdir: Path, dirs: list[str], env: dict[str, str]) -> Iterator[Podman]:
    pm = Podman(host, workdir, dirs, env)
    pm.write_config()
    with mount_jail(host, workdir / "var-lib", tmpfs_run=True) as jail:
        pm.jail = jail
        try:
            pm.import_image()
            yield pm
        finally:
            pm.remove_all()
            shutil.rmtree(pm.runroot, ignore_errors=True)


# ---------------------------------------------------------------------------- processes


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL: for daemons this test started itself."""
    if proc.poll() is not None:
        return
    with suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def wait_for(predicate: Any, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# ------------------------------------------------------------------------------ evidence

_COUNTERS = re.compile(r"\[\d+:\d+\]|packets \d+ bytes \d+")


def kernel_snapshot(ns: Netns) -> dict[str, str]:
    """Rules and links of a netns, without counters: equal before and after = nothing left."""

    def clean(text: str) -> str:
        lines = (_COUNTERS.sub("", line).rstrip() for line in text.splitlines())
        return "\n".join(line for line in lines if line and not line.startswith("#"))

    return {
        "nft": clean(ns.run("nft", "list", "ruleset", check=False)),
        "iptables": clean(ns.run("iptables-save", check=False)),
        "ip6tables": clean(ns.run("ip6tables-save", check=False)),
        "links": "\n".join(
            sorted(
                line.split(":")[1].strip().split("@")[0]
                for line in ns.ip("-o", "link", check=False).splitlines()
            )
        ),
    }


def files_under(path: Path) -> list[str]:
    if not path.exists():
        return []
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def leftover_state(root: Path) -> list[str]:
    """State files left in a plugins' state root; the per-plugin lock files do not count."""
    return [f for f in files_under(root) if not Path(f).name.endswith("lock")]

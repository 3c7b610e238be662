"""The resident helper: same results as the plugins alone, and never trusted blindly.

A call served by the helper must be indistinguishable from one the plugin executable runs
itself (output, exit status, kernel state); the plugin must fall back to doing the work
itself whenever the helper is absent, stopped, not root, or declines; and a worker must
die with the plugin process it serves.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from common import fastpath
from tests.conftest import Lab
from tests.harness.helper import Helper, running_helper
from tests.harness.plugins import our, run_plugin
from tests.harness.traffic import echo_server, reaches
from tests.portmap_world import HOST4, make_world

pytestmark = pytest.mark.root

CONF = {"cniVersion": "1.0.0", "name": "hnet", "type": "tuning"}


def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture
def helper() -> Iterator[Helper]:
    with running_helper() as h:
        yield h


def version_via(socket_path: str, **env: str) -> tuple[int, str, str]:
    p = subprocess.run(
        [our("portmap")], input=b'{"cniVersion": "0.4.0"}', capture_output=True, check=False,
        env={**os.environ, "CNI_COMMAND": "VERSION", "CNI_META_HELPER": socket_path, **env},
    )  # fmt: skip
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def test_served_calls_give_the_same_kernel_state_and_traffic_as_local_ones(
    lab: Lab, helper: Helper
) -> None:
    w = make_world(lab)
    outcomes = {}
    for mode in (helper.socket, "off"):
        lab.env["CNI_META_HELPER"] = mode
        served_before = len(helper.stats())
        w.attach(lab.ctr, "8080:80/tcp")
        # The same ruleset, but for the address host-local hands out this time.
        ruleset = lab.host.run("nft", "list", "ruleset").replace(w.ip(lab.ctr), "CTR")
        with echo_server(lab.ctr, 80, "tcp", "ctr"):
            assert reaches(w.ext, HOST4, 8080, "tcp") == b"ctr:ping"
        lab.chain.check(w.conflist, lab.ctr)
        w.detach(lab.ctr)
        served = [c["command"] for c in helper.stats()[served_before:] if c["plugin"] == "portmap"]
        outcomes[mode] = (ruleset, served)
        assert lab.host.run("nft", "list", "ruleset") == ""
    (rules1, served1), (rules2, served2) = outcomes.values()
    assert served1 == ["ADD", "CHECK", "DEL"] and served2 == []
    assert "CTR" in rules1 and rules1 == rules2


def test_errors_are_the_same_through_the_helper(lab: Lab, helper: Helper) -> None:
    bad = {**CONF, "sysctl": {"net.ipv4.conf.eth0/../../../../etc/passwd": "x"}}
    outs = []
    for mode in (helper.socket, "off"):
        p = run_plugin(our("tuning"), "ADD", bad, host=lab.host, netns=lab.ctr.path,
                       env={**lab.env, "CNI_META_HELPER": mode})  # fmt: skip
        outs.append((p.returncode, p.stdout))
    assert outs[0] == outs[1] and outs[0][0] != 0
    assert json.loads(outs[0][1])["code"] == 7
    assert [c["status"] for c in helper.stats()] == [1]


def test_plugins_fall_back_when_there_is_no_helper(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(str(stale))  # bound, never listening: connect is refused
    try:
        for path in (str(tmp_path / "absent.sock"), str(stale), str(tmp_path), "off", ""):
            rc, out, _ = version_via(path)
            assert rc == 0 and json.loads(out)["cniVersion"] == "0.4.0", path
    finally:
        s.close()


def test_a_stopped_helper_costs_a_bounded_wait_then_the_plugin_works_alone(
    helper: Helper,
) -> None:
    assert helper.proc is not None
    frozen = {helper.proc.pid, *helper.children()}
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        rc, out, _ = version_via(helper.socket)
        waited = time.monotonic() - start
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert rc == 0 and json.loads(out)["cniVersion"] == "0.4.0"
    assert waited >= fastpath.HANDSHAKE_SECONDS * 0.9  # it did wait for the helper...
    # ...and the worker that finally took the connection ran nothing: the plugin had
    # already done the work itself.
    time.sleep(1)
    assert helper.stats() == []


FAKE_HELPER = textwrap.dedent(
    """
    import os, socket, sys
    path, report = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    s.listen(1)
    open(report + ".ready", "w").close()
    conn, _ = s.accept()
    conn.settimeout(5)
    try:
        data, anc, _, _ = conn.recvmsg(65536, 1024)
    except OSError:
        data, anc = b"", []
    with open(report, "w") as f:
        f.write(f"{len(data)} {len(anc)}")
    """
)


def test_plugins_never_hand_anything_to_a_helper_that_is_not_root() -> None:
    nobody = pwd.getpwnam("nobody")
    d = Path(tempfile.mkdtemp(prefix="cni-meta-nobody-"))  # reachable by nobody
    os.chown(d, nobody.pw_uid, nobody.pw_gid)
    path, report = str(d / "h.sock"), str(d / "report")

    def drop() -> None:
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    fake = subprocess.Popen([sys.executable, "-c", FAKE_HELPER, path, report], preexec_fn=drop)
    try:
        wait_for(lambda: os.path.exists(report + ".ready"))
        rc, out, _ = version_via(path)
        assert rc == 0 and json.loads(out)["cniVersion"] == "0.4.0"
        fake.wait(timeout=30)
        # The plugin connected, saw a non-root peer, and sent nothing: no environment,
        # no stdin/stdout, no namespace descriptors.
        assert Path(report).read_text() == "0 0"
    finally:
        fake.kill()
        fake.wait()
        shutil.rmtree(d)


def test_the_helper_serves_no_unprivileged_peer(helper: Helper) -> None:
    nobody = pwd.getpwnam("nobody")
    probe = textwrap.dedent(
        f"""
        import os, socket
        os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid})
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(10)
        try:
            s.connect({helper.socket!r})
        except PermissionError:
            raise SystemExit("denied")
        try:
            s.sendmsg([b"CNIMETA1\\0portmap\\0x\\0022\\0CNI_COMMAND=VERSION"])
            print(repr(s.recv(16)))
        except (BrokenPipeError, ConnectionResetError):  # closed before or after we spoke
            print(repr(b""))
        """
    )

    def probe_run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=False
        )

    assert probe_run().stderr.strip() == "denied"  # the socket is 0600 root
    os.chmod(helper.socket, 0o666)  # as if someone loosened it: credentials still count
    p = probe_run()
    assert p.stdout.strip() == "b''", p.stderr  # closed without a word
    assert helper.stats() == []


def raw_request(helper: Helper, message: bytes) -> bytes:
    """Send a request the way fastpath does; the helper's first answer."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(10)
    try:
        s.connect(helper.socket)
        s.send(message)
        return s.recv(16)
    finally:
        s.close()


@pytest.mark.parametrize(
    "mangle",
    [
        lambda parts: [b"NOTCNI", *parts[1:]],
        lambda parts: [parts[0], b"flannel", *parts[2:]],
        lambda parts: [parts[0], parts[1], b"1:2", *parts[3:]],  # other installed code
    ],
    ids=["magic", "plugin", "code-id"],
)
def test_the_helper_declines_requests_it_cannot_serve_exactly(
    helper: Helper, mangle: Callable[[list[bytes]], list[bytes]]
) -> None:
    parts = fastpath.request_message("portmap", 0o22).split(b"\0")
    assert raw_request(helper, b"\0".join(mangle(parts))) == b"F"
    assert helper.stats() == []


def test_callers_in_another_pid_namespace_are_not_served(helper: Helper) -> None:
    p = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", our("portmap")],
        input=b"{}", capture_output=True, check=False,
        env={**os.environ, "CNI_COMMAND": "VERSION", "CNI_META_HELPER": helper.socket},
    )  # fmt: skip
    assert p.returncode == 0 and json.loads(p.stdout)["supportedVersions"]
    assert helper.stats() == []
    assert "another pid namespace" in helper.log()


def worker_in(helper: Helper, netns_path: str) -> int | None:
    """The helper's child that has entered this network namespace (serving a call)."""
    target = os.stat(netns_path).st_ino
    for pid in helper.children():
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino == target:
                return pid
        except FileNotFoundError:
            pass
    return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class BlockedAdd:
    """A portmap ADD served by the helper, its worker waiting for the nftables lock that
    the test holds: a call in flight, for as long as the test wants."""

    def __init__(self, lab: Lab, helper: Helper) -> None:
        self.lab, self.helper = lab, helper
        self.world = make_world(lab)
        self.world.attach(lab.ctr)  # bridge + host-local + portmap, no mappings yet
        conf = json.loads(self.world.conflist.read_text())
        self.conf = {
            "cniVersion": conf["cniVersion"], "name": conf["name"],
            **next(p for p in conf["plugins"] if p["type"] == "portmap"),
            "runtimeConfig": {"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},
            "prevResult": self.world.results[lab.ctr.name],
        }  # fmt: skip
        self.lock_dir = lab.state_root / "portmap"
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        self.state_before = sorted(os.listdir(self.lock_dir))
        self.rules_before = lab.host.run("nft", "list", "ruleset")
        self.held = open(self.lock_dir / "nftables.lock", "a+")  # noqa: SIM115
        fcntl.flock(self.held, fcntl.LOCK_EX)  # the worker will wait for this

    def start(self) -> tuple[subprocess.Popen[bytes], int]:
        """The plugin process, and the worker serving it once it is waiting."""
        env = {**os.environ, **self.lab.env, "CNI_META_HELPER": self.helper.socket,
               "CNI_META_LOCK_TIMEOUT": "120", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "late",
               "CNI_IFNAME": "eth0", "CNI_NETNS": self.lab.ctr.path,
               "CNI_PATH": "/usr/lib/cni"}  # fmt: skip
        plugin = subprocess.Popen(
            ["ip", "netns", "exec", self.lab.host.name, our("portmap")], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert plugin.stdin is not None
            plugin.stdin.write(json.dumps(self.conf).encode())
            plugin.stdin.close()
            plugin.stdin = None  # (so that communicate() only reads)
            found: list[int] = []

            def serving() -> bool:
                found.append(worker_in(self.helper, self.lab.host.path) or 0)
                return found[-1] != 0

            wait_for(serving)
        except BaseException:
            plugin.kill()
            plugin.wait()
            raise
        return plugin, found[-1]

    def release(self) -> None:
        if not self.held.closed:
            self.held.close()

    def assert_nothing_changed(self) -> None:
        lab = self.lab
        assert lab.host.run("nft", "list", "ruleset") == self.rules_before
        assert sorted(os.listdir(self.lock_dir)) == self.state_before + (
            ["nftables.lock"] if "nftables.lock" not in self.state_before else []
        )


def test_killing_the_plugin_kills_its_worker_before_it_changes_anything(
    lab: Lab, helper: Helper
) -> None:
    call = BlockedAdd(lab, helper)
    try:
        plugin, worker = call.start()
        plugin.kill()
        plugin.wait()
        wait_for(lambda: not pid_alive(worker))  # it went with the plugin, lock still held
    finally:
        call.release()
    call.assert_nothing_changed()
    assert [c for c in helper.stats() if c["command"] == "ADD"] == []
    call.world.detach(lab.ctr)


KILLED_AFTER_READY = textwrap.dedent(
    """
    import os, signal, socket, sys
    from common import fastpath
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sys.argv[1])
    s.send(fastpath.request_message("portmap", 0o22))
    assert s.recv(16) == b"R"  # a worker took the call...
    os.kill(os.getpid(), signal.SIGKILL)  # ...and the plugin is killed before it says "G"
    """
)


def test_a_plugin_killed_after_the_worker_said_ready_leaves_no_worker_and_no_gap(
    helper: Helper,
) -> None:
    spares = helper.children()
    assert len(spares) == 2
    p = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_READY, helper.socket],
        env={**os.environ, "CNI_COMMAND": "VERSION"}, cwd=str(Path(fastpath.__file__).parents[1]),
        capture_output=True, check=False,
    )  # fmt: skip
    assert p.returncode == -signal.SIGKILL, p.stderr
    # The spare that took the call ends without running anything, and is replaced.
    wait_for(lambda: not spares <= helper.children() and len(helper.children()) == 2)
    gone = spares - helper.children()
    assert len(gone) == 1 and not pid_alive(gone.pop())
    assert helper.stats() == []
    assert served_version(helper)["status"] == 0  # and the helper serves the next call


def test_spares_die_with_a_helper_killed_outright() -> None:
    with running_helper() as h:
        assert h.proc is not None
        spares = h.children()
        assert spares
        h.proc.kill()  # SIGKILL: no handler runs, the spares must go by themselves
        h.proc.wait()
        wait_for(lambda: not any(pid_alive(p) for p in spares))


def served_version(helper: Helper) -> dict[str, object]:
    before = len(helper.stats())
    rc, _, _ = version_via(helper.socket)
    assert rc == 0
    wait_for(lambda: len(helper.stats()) > before)
    return helper.stats()[-1]


def test_spares_wait_untouched_and_a_stopped_helper_leaves_nothing_behind() -> None:
    """Spares only wait (no rehearsal stage since the helper-decision figures): nothing
    of theirs in TMPDIR or the machine's nftables, and the helper's files go when it stops."""
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    with running_helper() as helper:
        assert served_version(helper)["status"] == 0
        before = sorted(p.name for p in helper.workdir.iterdir())  # socket, log, stats
        for _ in range(3):
            assert served_version(helper)["status"] == 0
        assert sorted(p.name for p in helper.workdir.iterdir()) == before
        helper.stop()
        assert not Path(helper.socket).exists()
    assert (
        subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout == tables
    )


# --- the caller's privileges, not the helper's ---------------------------------------------

BAD_TUNING = {**CONF, "sysctl": {"net.ipv4.conf.eth0/../../../../etc/passwd": "x"}}


def tuning_as(lab: Lab, mode: str, log_file: Path, restrict: tuple[str, ...]) -> tuple[int, str]:
    """A tuning ADD that fails (and logs the failure to CNI_META_LOG_FILE), run by a root
    process restricted by `setpriv restrict...` (nothing: a full-capability root)."""
    env = {**os.environ, **lab.env, "CNI_META_HELPER": mode, "CNI_META_LOG_FILE": str(log_file),
           "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "caps", "CNI_IFNAME": "eth0",
           "CNI_NETNS": lab.ctr.path, "CNI_PATH": "/usr/lib/cni"}  # fmt: skip
    setpriv = ["setpriv", *restrict, "--"] if restrict else []
    p = subprocess.run(
        ["ip", "netns", "exec", lab.host.name, *setpriv, our("tuning")],
        input=json.dumps(BAD_TUNING).encode(), env=env, capture_output=True, check=False,
    )  # fmt: skip
    return p.returncode, p.stdout.decode()


@pytest.mark.parametrize(
    ("restrict", "why"),
    [
        (("--inh-caps=-all", "--bounding-set=-all"), "lacks capabilities"),
        (("--bounding-set=-dac_override,-dac_read_search",), "lacks capabilities"),
        (("--no-new-privs",), "runs under no_new_privs"),
    ],
    ids=["no-capabilities", "no-dac-override", "no-new-privs"],
)
def test_a_root_caller_with_fewer_privileges_than_the_helper_is_not_served(
    lab: Lab, helper: Helper, restrict: tuple[str, ...], why: str
) -> None:
    nobody = pwd.getpwnam("nobody")
    log_file = lab.workdir / "nobodys.log"  # someone else's file: only DAC_OVERRIDE writes it
    log_file.write_text("")
    os.chown(log_file, nobody.pw_uid, nobody.pw_gid)
    log_file.chmod(0o600)
    outcomes = {}
    for mode in (helper.socket, "off"):
        rc, out = tuning_as(lab, mode, log_file, restrict)
        logged = [line.split(" ", 2)[2] for line in log_file.read_text().splitlines()]
        outcomes[mode] = (rc, out, logged)  # (without time and pid)
        log_file.write_text("")
    assert outcomes[helper.socket] == outcomes["off"]  # exactly what the plugin does alone
    assert json.loads(outcomes["off"][1])["code"] == 7
    assert helper.stats() == []
    assert f"declined a call: the caller {why}" in helper.log()
    if "--no-new-privs" not in restrict:
        assert outcomes["off"][2] == []  # the plugin alone may not append to it...
    # ...and a root caller with every capability is served, and may.
    rc, out = tuning_as(lab, helper.socket, log_file, ())
    assert (rc, out) == outcomes["off"][:2]
    assert [c["status"] for c in helper.stats()] == [1]
    assert "ERROR" in log_file.read_text()


def test_the_privileges_compared_are_read_from_the_caller_itself() -> None:
    from cnihelper import server as h

    with subprocess.Popen(["setpriv", "--no-new-privs", "--bounding-set=-net_admin", "--",
                           "sleep", "30"]) as p:  # fmt: skip
        try:
            pidfd = os.pidfd_open(p.pid)
            # setpriv's own command line names sleep too: wait for the exec (argv[0]), after
            # which the privileges it set are in force
            cmdline = Path(f"/proc/{p.pid}/cmdline")
            wait_for(lambda: cmdline.read_bytes().split(b"\0")[0] == b"sleep")
            caller = h.caller_privileges(pidfd)
            own = h._privileges("/proc/self")
            assert caller["NoNewPrivs"] == "1" and own["NoNewPrivs"] == "0"
            assert int(own["CapBnd"], 16) & ~int(caller["CapBnd"], 16) == 1 << 12  # NET_ADMIN
            assert "lacks capabilities" in h.lacks(caller, own)
            assert h.lacks(own, own) == ""
        finally:
            p.kill()
            p.wait()
        with pytest.raises(h.Declined, match="exited"):
            h.caller_privileges(pidfd)  # the process is gone: nothing read by its old pid
        os.close(pidfd)


# --- stopping, limits, frozen helpers ------------------------------------------------------


def test_stopping_the_helper_lets_a_call_in_flight_finish(lab: Lab) -> None:
    with running_helper() as helper:
        assert helper.proc is not None
        call = BlockedAdd(lab, helper)
        try:
            plugin, worker = call.start()
            # As systemd stops a unit: SIGTERM to the helper and every process of it.
            # A spare worker may exit on its own once the helper is gone: that is fine, the
            # in-flight worker's survival is asserted below.
            children = helper.children()
            os.kill(helper.proc.pid, signal.SIGTERM)
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            wait_for(lambda: not os.path.exists(helper.socket))  # it takes no new call
            rc, version, _ = version_via(helper.socket)  # a new call does its own work
            assert rc == 0 and json.loads(version)["cniVersion"] == "0.4.0"
            assert helper.proc.poll() is None and pid_alive(worker)  # the call goes on
        finally:
            call.release()
        out, err = plugin.communicate(timeout=60)
        assert plugin.returncode == 0, (out, err)
        assert json.loads(out)["cniVersion"] == call.conf["cniVersion"]
        assert helper.proc.wait(timeout=60) == 0  # then it exits
        assert "8080" in lab.host.run("nft", "list", "ruleset")
        assert [(c["command"], c["status"]) for c in helper.stats()] == [("ADD", 0)]
    call.world.detach(lab.ctr)


def test_a_worker_that_dies_mid_call_gives_error_11_in_the_requests_version(
    lab: Lab, helper: Helper
) -> None:
    call = BlockedAdd(lab, helper)
    try:
        plugin, worker = call.start()
        os.kill(worker, signal.SIGKILL)  # out of memory, say
        out, _ = plugin.communicate(timeout=60)
    finally:
        call.release()
    assert plugin.returncode == 1
    error = json.loads(out)
    assert error["code"] == 11 and error["cniVersion"] == call.conf["cniVersion"]
    call.assert_nothing_changed()
    call.world.detach(lab.ctr)


def test_a_call_past_the_call_limit_is_killed_and_reported_as_error_11(lab: Lab) -> None:
    with running_helper("--call-limit", "2") as helper:
        call = BlockedAdd(lab, helper)
        try:
            plugin, worker = call.start()  # it waits for the lock for up to 120 s
            out, _ = plugin.communicate(timeout=60)
        finally:
            call.release()
        assert plugin.returncode == 1
        error = json.loads(out)
        assert error["code"] == 11 and error["cniVersion"] == call.conf["cniVersion"]
        # Dead before the plugin could answer; gone once the helper reaped it (a zombie
        # still takes signal 0, and the plugin may well exit first).
        wait_for(lambda: not pid_alive(worker), timeout=5)
        assert f"killed worker {worker}" in helper.log()
        call.assert_nothing_changed()
        call.world.detach(lab.ctr)


def test_beyond_max_workers_callers_are_told_at_once_to_work_alone(lab: Lab) -> None:
    with running_helper("--max-workers", "1", "--spares", "1") as helper:
        call = BlockedAdd(lab, helper)
        try:
            plugin, worker = call.start()  # the only worker there may be
            wait_for(lambda: helper.children() == {worker})  # no spare is forked
            request = fastpath.request_message("portmap", 0o22)
            assert raw_request(helper, request) == b"F"  # no wait in the queue
            rc, version, _ = version_via(helper.socket)
            assert rc == 0 and json.loads(version)["cniVersion"] == "0.4.0"
            assert helper.children() == {worker}
        finally:
            call.release()
        out, _ = plugin.communicate(timeout=60)
        assert plugin.returncode == 0, out
        assert [(c["command"], c["status"]) for c in helper.stats()] == [("ADD", 0)]
        wait_for(lambda: len(helper.children()) == 1 and worker not in helper.children())
        assert served_version(helper)["status"] == 0  # a spare again, serving
        call.world.detach(lab.ctr)


def test_an_unresponsive_helper_costs_one_short_wait_then_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "h.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(str(path))
    s.listen(16)  # a root listener that never accepts: a frozen helper
    try:
        for _ in range(3):
            rc, out, _ = version_via(str(path))
            assert rc == 0 and json.loads(out)["cniVersion"] == "0.4.0"
        s.setblocking(False)
        connections = 0
        while True:
            try:
                s.accept()[0].close()
            except BlockingIOError:
                break
            connections += 1
        assert connections == 1  # the first call waited; the others did not even connect
        assert (tmp_path / ("h.sock" + fastpath.STALLED)).exists()
    finally:
        s.close()


def test_a_live_helper_removes_the_unresponsive_marker(helper: Helper) -> None:
    marker = Path(helper.socket + fastpath.STALLED)
    marker.touch()
    assert version_via(helper.socket)[0] == 0
    wait_for(lambda: not marker.exists())
    assert served_version(helper)["status"] == 0


ENV_EXEC = textwrap.dedent(
    """
    import ctypes, sys
    exe, env = sys.argv[1].encode(), [e.encode() for e in sys.argv[2:]]
    argv = (ctypes.c_char_p * 2)(exe, None)
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    ctypes.CDLL(None).execve(exe, argv, envp)
    raise SystemExit("execve failed")
    """
)


def test_an_environment_entry_without_a_name_runs_as_it_would_alone(helper: Helper) -> None:
    outs = []
    for mode in (helper.socket, "off"):
        p = subprocess.run(
            [sys.executable, "-c", ENV_EXEC, our("portmap"), "=x=y", "CNI_COMMAND=VERSION",
             f"CNI_META_HELPER={mode}"],
            input=b'{"cniVersion": "0.4.0"}', capture_output=True, check=False,
        )  # fmt: skip
        outs.append((p.returncode, p.stdout))
    assert outs[0] == outs[1] and outs[0][0] == 0
    assert helper.stats() == []
    # A request carrying such an entry anyway is declined before anything is handed over.
    request = fastpath.request_message("portmap", 0o22) + b"\0=x=y"
    assert raw_request(helper, request) == b"F"

"""The README's own commands, run exactly as printed, as a newcomer runs them after
`make demo` (the venv's bin on PATH, no CNI_PATH), and proof that our plugins answered.

README.md is read when the test runs, not copied: every ```sh block is sorted by the
programs it runs, and a block running a program this file does not know fails the test
(so a new command in the README gets a way to run here, or a stated reason why not).

Network commands (`ip`, `cni-chain`) run in a throwaway world: a fresh network namespace
as the host and a private mount namespace with its own /run (so `ip netns add ctr1`
makes a namespace only this test sees) and /var/lib (an overlay: cni-chain's cache and
host-local's leases land in the test's dir). Nothing of it outlives the block. Which
implementation answered is proved by our plugins' log (the Go ones write none) and by the
ruleset: our nftables table, none of the Go portmap's iptables chains.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.harness.plugins import OUR_BIN, REPO

pytestmark = pytest.mark.root

README = REPO / "README.md"
# Not run here: the two set-up commands (what CI runs anyway, and heavy), and what needs a
# built image or a cluster. Each with the reason.
NOT_HERE = {
    "make demo": "the set-up command itself (CI runs it; tests/kernel/test_demo.py)",
    "make test": "the set-up command itself (what CI runs)",
    "make image": "builds the DaemonSet image (tests/runtimes/test_image.py)",
    "podman": "runs the DaemonSet image (tests/runtimes/test_image.py)",
    "kubectl": "needs a Kubernetes cluster",
}
NETWORK = ("ip", "cni-chain")
OURS = {p.name for p in OUR_BIN.iterdir()} & {"portmap", "bandwidth", "tuning"}


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(" ".join(words))
    return out


def kind(command: str) -> str:
    for prefix in NOT_HERE:
        if command == prefix or command.startswith(prefix + " "):
            return prefix
    if command.split()[0] in NETWORK:
        return "network"
    if command == "make dist":
        return "dist"
    if command.split()[:2] in (["make", "install"], ["make", "uninstall"]):
        return "install"
    return "unknown"


def test_every_readme_command_is_run_here_or_says_why_not() -> None:
    unknown = [
        c for b in sh_blocks(README.read_text()) for c in commands(b) if kind(c) == "unknown"
    ]
    assert not unknown, f"README commands this test cannot run yet: {unknown}"
    # The README still has the blocks the tests below run.
    kinds = {kind(c) for b in sh_blocks(README.read_text()) for c in commands(b)}
    assert "network" in kinds


def network_blocks() -> list[str]:
    blocks = sh_blocks(README.read_text())
    return [b for b in blocks if commands(b) and all(kind(c) == "network" for c in commands(b))]


# Run as root inside `unshare --mount` (and `--net` with $OWN_NETNS: then also a private
# /run and loopback up); an overlay over each of $OVERLAYS whose writes go to
# $WORLD/upper/DIR (the machine's files stay as they are); then the README's commands
# verbatim ($WORLD/block.sh); then what the proof needs ($WORLD/after.sh), also after a
# failure of the block.
WORLD = """set -eu
if [ -n "$OWN_NETNS" ]; then
    mount -t tmpfs tmpfs /run
    ip link set lo up
fi
for dir in $OVERLAYS; do
    mkdir -p "$WORLD/upper$dir" "$WORLD/work$dir"
    mount -t overlay overlay \\
        -o "lowerdir=$dir,upperdir=$WORLD/upper$dir,workdir=$WORLD/work$dir" "$dir"
done
status=0
sh -eu "$WORLD/block.sh" || status=$?
sh "$WORLD/after.sh" >&2
exit $status
"""


def in_a_world(
    tmp_path: Path, script: str, after: str, overlays: tuple[str, ...], *, own_netns: bool
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run `script` (README lines, verbatim) and then `after` in a throwaway world, as a
    newcomer after `make demo`: in the checkout, the venv's bin first on PATH, no CNI_*
    variables. The process and where the world's writes went (DIR below it for each
    overlaid DIR). Without `own_netns` the world shares the machine's network (pip
    needs its index), so the script must not touch it."""
    world = tmp_path / "world"
    world.mkdir()
    (world / "block.sh").write_text(script)
    (world / "after.sh").write_text(after)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "NETCONFPATH"))}
    env.update(
        PATH=f"{OUR_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        WORLD=str(world),
        OVERLAYS=" ".join(overlays),
        OWN_NETNS="1" if own_netns else "",
        CNI_META_LOG_FILE=str(tmp_path / "plugins.log"),
    )
    proc = subprocess.run(
        ["unshare", "--mount", *(["--net"] if own_netns else []), "--propagation", "private",
         "sh", "-c", WORLD],
        cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    return proc, world / "upper"


@pytest.mark.parametrize("index", range(len(network_blocks())))
def test_readme_network_commands_run_as_printed_on_our_plugins(tmp_path: Path, index: int) -> None:
    block = network_blocks()[index]
    after = "echo '=== nft'; nft list ruleset; echo '=== iptables'; iptables-save -t nat\n"
    proc, _ = in_a_world(tmp_path, block, after, ("/var/lib",), own_netns=True)
    assert proc.returncode == 0, f"README block failed:\n{block}\n{proc.stdout}\n{proc.stderr}"
    log = tmp_path / "plugins.log"

    # ADD printed the chain's result.
    if "cni-chain add" in block:
        result = json.loads(proc.stdout[proc.stdout.index("{") :])
        assert result["ips"], result
    # Our plugins ran every verb the block ran and logged it: the Go ones log nothing.
    lines = log.read_text().splitlines() if log.exists() else []
    for command in commands(block):
        words = command.split()
        if words[0] != "cni-chain" or words[1] not in ("add", "check", "del"):
            continue
        verb = words[1].upper()
        conflist = json.loads((REPO / words[2]).read_text())
        for plugin in {p["type"] for p in conflist["plugins"]} & OURS:
            done = [ln for ln in lines if f" {plugin} {verb} " in ln and ln.endswith("succeeded")]
            assert done, f"{plugin} did not answer {command!r}; the log:\n" + "\n".join(lines)
    # None of the Go portmap's iptables chains: its ADD makes CNI-HOSTPORT-* chains that
    # its DEL leaves behind.
    rules = proc.stderr[proc.stderr.index("=== nft") :]
    assert "CNI-DN-" not in rules and "CNI-HOSTPORT" not in rules, rules


def readme_commands(kind_: str) -> list[str]:
    return [c for b in sh_blocks(README.read_text()) for c in commands(b) if kind(c) == kind_]


def launcher_tree(launcher: Path) -> str:
    """The tree an installed launcher runs (its shebang's interpreter)."""
    return launcher.read_text().splitlines()[0].removeprefix("#!").split()[0]


# podman 4's search list when containers.conf sets none (containers/common).
PODMAN_DEFAULT = [
    "/usr/local/libexec/cni", "/usr/libexec/cni", "/usr/local/lib/cni", "/usr/lib/cni",
    "/opt/cni/bin",
]  # fmt: skip


def podman_uses_its_defaults() -> bool:
    confs = [Path("/usr/share/containers/containers.conf"),
             Path("/etc/containers/containers.conf"),
             *Path("/etc/containers").glob("containers.conf.d/*.conf")]  # fmt: skip
    setting = re.compile(r"^\s*cni_plugin_dirs\s*=", re.MULTILINE)
    return Path("/usr/bin/podman").exists() and not any(
        c.is_file() and setting.search(c.read_text()) for c in confs
    )


# After each `make install ...` of the README: our launchers in the bin dir it names, each
# answering VERSION; then the README's `make uninstall`: none left, in either bin dir.
INSTALL_PROBE = """
for dir in /opt/cni/bin /usr/libexec/cni; do
    for p in portmap bandwidth tuning; do
        if [ -f "$dir/$p" ] && grep -q "cni-meta-plugins launcher" "$dir/$p"; then
            echo "ours $dir/$p $(echo '{"cniVersion":"1.0.0"}' | CNI_COMMAND=VERSION "$dir/$p")"
        fi
    done
done
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "install", [c for c in readme_commands("install") if c.startswith("make install")]
)
def test_readme_install_commands_run_as_printed_in_a_scratch_world(
    tmp_path: Path, install: str
) -> None:
    uninstall = [c for c in readme_commands("install") if c.startswith("make uninstall")]
    assert install.startswith("make install") and uninstall, readme_commands("install")
    bin_dir = install.partition("CNI_BIN_DIR=")[2].split(" ")[0] or "/opt/cni/bin"
    script = f"{install}\necho '=== installed'\n{INSTALL_PROBE}\n{uninstall[0]}\n"
    overlays = ("/opt", "/usr/libexec", "/etc")  # /etc: a helper unit would be removed there
    proc, upper = in_a_world(tmp_path, script, INSTALL_PROBE, overlays, own_netns=False)
    assert proc.returncode == 0, f"{script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    installed = proc.stdout.partition("=== installed")[2]
    for plugin in ("portmap", "bandwidth", "tuning"):
        assert f"ours {bin_dir}/{plugin} " in installed, installed
    assert installed.count('"supportedVersions"') == installed.count("ours "), installed
    # The uninstall left none of ours anywhere (the probe after the block saw nothing).
    assert "ours " not in proc.stderr, proc.stderr
    # Where this machine's podman (its default search list) would run the Go portmap of
    # /usr/lib/cni instead, the install said the line to change; else it said nothing.
    if podman_uses_its_defaults():
        shadowed = PODMAN_DEFAULT.index(bin_dir) > PODMAN_DEFAULT.index("/usr/lib/cni")
        said = f'cni_plugin_dirs = ["{bin_dir}", ' in proc.stderr
        assert said == (shadowed and Path("/usr/lib/cni/portmap").exists()), proc.stderr
    assert (upper / "opt").is_dir()  # the writes went to the world, not to the machine


@pytest.mark.slow
def test_readme_make_dist_runs_as_printed_in_a_copy_of_the_checkout(tmp_path: Path) -> None:
    (command,) = readme_commands("dist")
    copy = tmp_path / "clone"
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = REPO / os.fsdecode(name)
        if source.is_file():
            (copy / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            (copy / os.fsdecode(name)).write_bytes(source.read_bytes())
    (copy / ".venv").symlink_to(OUR_BIN.parent)  # the venv `make demo` made
    # Older than the venv's stamp, so that make does not reinstall the shared venv from
    # this copy; checked before anything runs.
    os.utime(copy / "pyproject.toml", (0, 0))
    dry = subprocess.run(["make", "-n", *command.split()[1:]], cwd=copy, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert "pip install" not in dry.stdout, dry.stdout
    proc = subprocess.run(["sh", "-c", command], cwd=copy, capture_output=True, text=True,
                          check=False, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    built = sorted(p.name for p in (copy / "dist").iterdir())
    # What the README's comment promises.
    assert [re.sub(r"-\d+\.\d+\.\d+", "-VERSION", n) for n in built] == [
        "cni_meta_plugins-VERSION-py3-none-any.whl",
        "cni_meta_plugins-VERSION.tar.gz",
    ], built

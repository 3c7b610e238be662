#!/bin/sh
# Install (or remove) the cni-meta-plugins executables `portmap`, `bandwidth` and `tuning`
# into a CNI bin dir, where any runtime (podman, containerd, CRI-O, cnitool) can exec them.
#
#   deploy/install.sh                         # venv in /opt/cni-meta-plugins, plugins in /opt/cni/bin
#   deploy/install.sh --bin-dir /usr/libexec/cni --prefix /usr/local/lib/cni-meta-plugins
#   deploy/install.sh --uninstall             # remove them again (restores what we displaced)
#
# Each installed plugin is a small launcher that execs the interpreter of *our own*
# environment in isolated mode (python -IS): no dependence on the caller's PATH, PYTHON*
# variables, user site-packages or working directory. The runtime under the launcher is one of:
#   (default)     a fresh venv in PREFIX/venv with the project pip-installed into it;
#   --venv DIR    an existing environment that already has cni-meta-plugins (tests, dev);
#   --bundle DIR  a relocatable bundle made by deploy/build-bundle.sh (interpreter, stdlib,
#                 site-packages and every shared library, including the dynamic loader):
#                 what the Kubernetes DaemonSet copies onto nodes, independent of the node's OS.
# --root DIR writes everything below DIR (a scratch root in tests, the node's / mounted at
# /host in the DaemonSet) while the launchers name the paths as seen from DIR's inside.
#
# PREFIX/cni-meta-helper is the same kind of launcher for the optional resident helper
# (docs/helper.md): deploy/cni-meta-helper.service and the DaemonSet's helper-patch.yaml
# run it. It is only written, never started here.
#
# Executables of the same name that are not ours (e.g. the Go portmap) are moved aside to
# PREFIX/displaced and put back by --uninstall; every other file in the bin dir (bridge,
# host-local, ...) is left alone. Each file is written under a temporary name and renamed,
# so a runtime never execs a half-written plugin.
set -eu

MARKER="cni-meta-plugins launcher"
SYSTEM_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

bin_dir=${CNI_BIN_DIR:-/opt/cni/bin}
prefix=${CNI_META_PREFIX:-/opt/cni-meta-plugins}
root=""
python=${PYTHON:-python3}
venv=""
bundle=""
source_dir=$(cd "$(dirname "$0")/.." && pwd)
plugins="portmap bandwidth tuning"
action=install
quiet=""
bin_dir_given=""

usage() {
    sed -n '2,25s/^# \{0,1\}//p' "$0"
    cat <<EOF
options:
  --bin-dir DIR    CNI bin dir to install into (default /opt/cni/bin, env CNI_BIN_DIR)
  --prefix DIR     where our runtime lives (default /opt/cni-meta-plugins, env CNI_META_PREFIX)
  --root DIR       write below DIR; launchers refer to paths inside it (default: /)
  --python PY      interpreter used to build the venv (default python3, env PYTHON)
  --venv DIR       use this existing environment instead of building a venv
  --bundle DIR     copy this relocatable bundle (deploy/build-bundle.sh) instead
  --source DIR     project source to pip-install (default: this script's repository)
  --plugins LIST   which plugins (default "portmap bandwidth tuning")
  --uninstall      remove our plugins and runtime, restore displaced executables
  --quiet          print nothing but errors
EOF
}

die() { echo "install.sh: $*" >&2; exit 1; }
say() { [ -n "$quiet" ] || echo "$*"; }

while [ $# -gt 0 ]; do
    case $1 in
        --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; bin_dir_given=1; shift 2 ;;
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --root) root=${2:?--root needs a directory}; shift 2 ;;
        --python) python=${2:?--python needs an interpreter}; shift 2 ;;
        --venv) venv=${2:?--venv needs a directory}; shift 2 ;;
        --bundle) bundle=${2:?--bundle needs a directory}; shift 2 ;;
        --source) source_dir=${2:?--source needs a directory}; shift 2 ;;
        --plugins) plugins=${2:?--plugins needs a list}; shift 2 ;;
        --uninstall) action=uninstall; shift ;;
        --quiet|-q) quiet=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done

case $bin_dir in /*) ;; *) die "--bin-dir must be absolute: $bin_dir" ;; esac
case $prefix in /*) ;; *) die "--prefix must be absolute: $prefix" ;; esac
[ -z "$venv" ] || [ -z "$bundle" ] || die "--venv and --bundle exclude each other"
for p in $plugins; do
    case $p in portmap|bandwidth|tuning) ;; *) die "unknown plugin: $p" ;; esac
done
root=${root%/}
if [ -n "$root" ]; then
    [ -d "$root" ] || die "--root $root does not exist"
    root=$(cd "$root" && pwd)
fi
R_BIN="$root$bin_dir"
R_PREFIX="$root$prefix"

is_ours() { [ -f "$1" ] && grep -q "$MARKER" "$1" 2>/dev/null; }

# Write stdin to $1 atomically with mode 0755.
put_executable() {
    tmp="$1.cni-meta-tmp.$$"
    cat >"$tmp"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$1"
}

uninstall() {
    # Without --bin-dir, remove from where the last install put the plugins.
    if [ -z "$bin_dir_given" ] && [ -f "$R_PREFIX/.cni-meta-plugins" ]; then
        recorded=$(sed -n 's/^bin_dir=//p' "$R_PREFIX/.cni-meta-plugins")
        if [ -n "$recorded" ]; then
            bin_dir=$recorded
            R_BIN="$root$bin_dir"
        fi
    fi
    for p in $plugins; do
        target="$R_BIN/$p"
        if is_ours "$target"; then
            rm -f "$target"
            say "removed $target"
        fi
        if [ -f "$R_PREFIX/displaced/$p" ] && [ ! -e "$target" ]; then
            mv "$R_PREFIX/displaced/$p" "$target"
            say "restored $target"
        fi
    done
    # Remove only what install.sh made (the prefix may be shared, e.g. --prefix /opt).
    if [ -f "$R_PREFIX/.cni-meta-plugins" ]; then
        if is_ours "$R_PREFIX/cni-meta-helper"; then rm -f "$R_PREFIX/cni-meta-helper"; fi
        for made in "$R_PREFIX"/venv "$R_PREFIX"/venv.* "$R_PREFIX"/bundle "$R_PREFIX"/bundle.*; do
            if [ -L "$made" ] || [ -e "$made" ]; then rm -rf "$made"; fi
        done
        rmdir "$R_PREFIX/displaced" 2>/dev/null || true
        [ ! -d "$R_PREFIX/displaced" ] || say "kept $R_PREFIX/displaced (not restored: a file is in the way)"
        rm -f "$R_PREFIX/.cni-meta-plugins"
        rmdir "$R_PREFIX" 2>/dev/null && say "removed $R_PREFIX" || true
    fi
}

# The module whose main() a launcher runs: a plugin's table of contents, or the helper.
module_of() { if [ "$1" = cni-meta-helper ]; then echo cnihelper.server; else echo "$1.__main__"; fi; }

python_launcher() { # plugin interpreter paths -> launcher text on stdout
    cat <<EOF
#!$2 -IS
# $MARKER: $1 (deploy/install.sh). -I: the caller's PYTHON* variables, user site and cwd
# are ignored, so the plugin behaves the same under every runtime. -S: site.py is not run
# (it costs a few ms on every container start); the environment's own import paths were
# resolved when this file was written. The plugins exec no programs: PATH does not matter.
import sys
sys.path += $3
from $(module_of "$1") import main
main()
EOF
}

shell_launcher() { # plugin interpreter paths -> launcher text (when the shebang would be too long)
    cat <<EOF
#!/bin/sh
# $MARKER: $1 (deploy/install.sh)
exec "$2" -I -S -c 'import sys; sys.path += $3; from $(module_of "$1") import main; main()' "\$@"
EOF
}

# The import paths site.py would add for the interpreter $1 (as seen from inside $root):
# its site-packages and whatever their .pth files name (an editable install's source tree).
# The directory holding our packages goes first: each plugin start then finds common/ and
# its own package there without listing a big site-packages first (~0.5 ms a start).
site_paths() {
    "$root$1" -I - "$root" <<'EOF'
import ast, json, os, subprocess, sys
bare = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; print(sys.path)"],
                      capture_output=True, text=True, check=True).stdout
seen = set(ast.literal_eval(bare))
root = sys.argv[1]
added = [p for p in sys.path if p and p not in seen]
added.sort(key=lambda p: not os.path.isfile(os.path.join(p, "common", "fastpath.py")))
extra = [p[len(root):] if root and p.startswith(root + "/") else p for p in added]
print(json.dumps(extra))
EOF
}

bundle_launcher() { # plugin bundle-dir -> launcher text; the bundle brings its own loader and libc
    cat <<EOF
#!/bin/sh
# $MARKER: $1 (deploy/install.sh, bundle)
B="$2"
PATH="$SYSTEM_PATH\${PATH:+:\$PATH}"
export PATH
exec "\$B/lib/ld-linux.so" --library-path "\$B/lib" "\$B/bin/python3" -I -S \\
    -c 'import sys; sys.path.insert(0, "'"\$B"'/site"); from $(module_of "$1") import main; main()' "\$@"
EOF
}

# Point the symlink $2 at $1 (a sibling dir) in one rename, then drop the older siblings:
# a runtime exec'ing a plugin meanwhile sees either the old tree or the new one.
swap_link() {
    ln -s "$1" "$2.link.$$"
    mv -T "$2.link.$$" "$2"
    for old in "$2".*; do
        case ${old##*/} in "$1" | *.link.*) ;; *) [ -d "$old" ] && rm -rf "$old" ;; esac
    done
    return 0
}

prepare_runtime() { # sets $interp (path as seen from inside root)
    mkdir -p "$R_PREFIX"
    : >"$R_PREFIX/.cni-meta-plugins"
    if [ -n "$bundle" ]; then
        [ -x "$bundle/bin/python3" ] && [ -e "$bundle/lib/ld-linux.so" ] \
            || die "$bundle is not a bundle made by deploy/build-bundle.sh"
        fresh="bundle.$(date +%s).$$"
        cp -a "$bundle" "$R_PREFIX/$fresh"
        swap_link "$fresh" "$R_PREFIX/bundle"
        interp="$prefix/bundle"
        return
    fi
    if [ -n "$venv" ]; then
        [ -x "$root$venv/bin/python" ] || die "--venv $venv has no bin/python"
        "$root$venv/bin/python" -I -c 'import portmap.__main__, bandwidth.__main__, tuning.__main__' \
            || die "--venv $venv does not have cni-meta-plugins installed"
        interp="$venv/bin/python"
        return
    fi
    [ -f "$source_dir/pyproject.toml" ] || die "no project source in $source_dir (use --source)"
    command -v "$python" >/dev/null || die "no interpreter $python (use --python)"
    say "building a venv in $R_PREFIX from $source_dir"
    fresh="venv.$(date +%s).$$"
    "$python" -m venv "$R_PREFIX/$fresh"
    # Build from a copy: pip must not drop build/ or *.egg-info into the source tree.
    src_copy=$(mktemp -d)
    trap 'rm -rf "$src_copy"' EXIT
    (cd "$source_dir" && tar --exclude=./.venv --exclude=./.git --exclude='*/__pycache__' \
        --exclude=./build --exclude='*.egg-info' -cf - .) | tar -C "$src_copy" -xf -
    "$R_PREFIX/$fresh/bin/python" -m pip install -q --disable-pip-version-check "$src_copy" \
        || { rm -rf "${R_PREFIX:?}/$fresh"; die "pip install failed"; }
    # python finds the venv through the path it was started by (pyvenv.cfg beside bin/),
    # so the stable name can be a symlink.
    swap_link "$fresh" "$R_PREFIX/venv"
    interp="$prefix/venv/bin/python"
}

install() {
    prepare_runtime
    paths=""
    [ -n "$bundle" ] || paths=$(site_paths "$interp") || die "cannot ask $interp for its import paths"
    mkdir -p "$R_BIN" "$R_PREFIX/displaced"
    for p in $plugins cni-meta-helper; do
        target="$R_BIN/$p"
        [ "$p" != cni-meta-helper ] || target="$R_PREFIX/$p"
        if [ -e "$target" ] && ! is_ours "$target"; then
            mv -f "$target" "$R_PREFIX/displaced/$p"
            say "moved the existing $target aside to $R_PREFIX/displaced/$p"
        fi
        if [ -n "$bundle" ]; then
            bundle_launcher "$p" "$interp"
        elif [ "$(printf '#!%s -IS' "$interp" | wc -c)" -lt 127 ]; then
            python_launcher "$p" "$interp" "$paths"
        else
            shell_launcher "$p" "$interp" "$paths"
        fi | put_executable "$target"
        say "installed $target"
    done
    rmdir "$R_PREFIX/displaced" 2>/dev/null || true
    printf 'bin_dir=%s\nplugins=%s\n' "$bin_dir" "$plugins" >"$R_PREFIX/.cni-meta-plugins"
    # A resident helper started from the old tree declines calls from the new one (it
    # checks which installed code calls it); restart it if systemd runs one here.
    if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        systemctl try-restart cni-meta-helper.service 2>/dev/null || true
    fi
}

if [ "$action" = uninstall ]; then
    uninstall
else
    install
fi

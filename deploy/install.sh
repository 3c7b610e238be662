#!/bin/sh
# Install (or remove) the cni-meta-plugins executables `flatnet`, `flatnet-ipam`, `portmap`,
# `bandwidth` and `tuning` into a CNI bin dir, where any runtime (podman, containerd, CRI-O,
# cnitool) can exec them.
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
# Every install copies the runtime into a new versioned directory (PREFIX/venv.STAMP or
# PREFIX/bundle.STAMP) and the launchers name that directory itself, not the PREFIX/venv or
# PREFIX/bundle symlink (which only shows which one is current): a call keeps importing from
# the tree it started on, however late its lazy imports, even if an upgrade lands meanwhile.
# An upgrade keeps the previous tree (for calls still running on it) and removes the older
# ones, so a call may span one upgrade, not two.
#
# install.sh removes only names it recorded in PREFIX/.cni-meta-plugins as made by itself,
# and refuses to take over a name it did not make: the prefix may be shared (--prefix /opt).
# Executables of the same name that are not ours (e.g. the Go portmap) are moved aside to
# PREFIX/displaced and put back by --uninstall; every other file in the bin dir (bridge,
# host-local, ...) is left alone. Each file is written under a temporary name and renamed,
# so a runtime never execs a half-written plugin.
#
# An install or uninstall over one that had the retired resident helper stops and removes
# its systemd unit (on the running system only: not below --root) and its launcher.
#
# The venv is built by the system's interpreter, /usr/bin/python3 (--python to choose
# another), never by whichever python3 comes first on PATH (pyenv, a conda base): the
# plugins kubelet runs must not depend on a user's interpreter. Every Python this script
# runs is in isolated mode (-I): a venv.py or pip/ in the working directory is not
# imported. An install that stops half-way (pip fails, a signal) removes what it made
# (the new tree, the prefix and the record when it created them) before it exits.
set -eu

MARKER="cni-meta-plugins launcher"
SYSTEM_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

bin_dir=${CNI_BIN_DIR:-/opt/cni/bin}
prefix=${CNI_META_PREFIX:-/opt/cni-meta-plugins}
root=""
python=/usr/bin/python3
venv=""
bundle=""
source_dir=$(cd "$(dirname "$0")/.." && pwd)
plugins="flatnet flatnet-ipam portmap bandwidth tuning"
action=install
quiet=""
bin_dir_given=""

usage() {
    sed -n '2,42s/^# \{0,1\}//p' "$0"
    cat <<EOF
options:
  --bin-dir DIR    CNI bin dir to install into (default /opt/cni/bin, env CNI_BIN_DIR)
  --prefix DIR     where our runtime lives (default /opt/cni-meta-plugins, env CNI_META_PREFIX)
  --root DIR       write below DIR; launchers refer to paths inside it (default: /)
  --python PATH    interpreter used to build the venv (default /usr/bin/python3)
  --venv DIR       use this existing environment instead of building a venv
  --bundle DIR     copy this relocatable bundle (deploy/build-bundle.sh) instead
  --source DIR     project source to pip-install (default: this script's repository)
  --plugins LIST   which plugins (default "flatnet flatnet-ipam portmap bandwidth tuning")
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
        *) echo "install.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

case $bin_dir in /*) ;; *) die "--bin-dir must be absolute: $bin_dir" ;; esac
case $prefix in /*) ;; *) die "--prefix must be absolute: $prefix" ;; esac
[ -z "$venv" ] || [ -z "$bundle" ] || die "--venv and --bundle exclude each other"
for p in $plugins; do
    case $p in flatnet|flatnet-ipam|portmap|bandwidth|tuning) ;; *) die "unknown plugin: $p" ;; esac
done
root=${root%/}
if [ -n "$root" ]; then
    [ -d "$root" ] || die "--root $root does not exist"
    root=$(cd "$root" && pwd)
fi
R_BIN="$root$bin_dir"
R_PREFIX="$root$prefix"

RECORD="$R_PREFIX/.cni-meta-plugins"
HELPER_UNIT="/etc/systemd/system/cni-meta-helper.service"

is_ours() { [ -f "$1" ] && grep -q "$MARKER" "$1" 2>/dev/null; }
exists() { [ -e "$1" ] || [ -L "$1" ]; }

# Write stdin to $1 atomically with mode 0755.
put_executable() {
    tmp="$1.cni-meta-tmp.$$"
    cat >"$tmp"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$1"
}

# The install record: `format=2`, `bin_dir=`, `plugins=`, and one `made=NAME` line for each
# name below PREFIX that install.sh created (`.` for PREFIX itself). A name is recorded
# before it is created, so an interrupted install leaves nothing unrecorded behind.
made() { [ -f "$RECORD" ] && grep -qxF "made=$1" "$RECORD"; }
note_made() { echo "made=$1" >>"$RECORD"; }
forget() {
    grep -vxF "made=$1" "$RECORD" >"$RECORD.tmp.$$" || true
    mv -f "$RECORD.tmp.$$" "$RECORD"
}
made_names() { [ ! -f "$RECORD" ] || sed -n 's/^made=//p' "$RECORD"; }
set_field() { # key value: replace or add the line key=value of the record
    { grep -v "^$1=" "$RECORD" || true; echo "$1=$2"; } >"$RECORD.tmp.$$"
    mv -f "$RECORD.tmp.$$" "$RECORD"
}

# A record of an older install.sh names nothing: adopt what that version made (its links,
# the tree each points to, displaced/, the prefix), as it could only have made those.
adopt_old_record() {
    if [ ! -f "$RECORD" ] || grep -qx 'format=2' "$RECORD"; then return 0; fi
    { echo format=2; grep '^bin_dir=\|^plugins=' "$RECORD" || true; echo "made=."; } \
        >"$RECORD.tmp.$$"
    mv -f "$RECORD.tmp.$$" "$RECORD"
    for link in venv bundle; do
        [ -L "$R_PREFIX/$link" ] || continue
        note_made "$link"
        tree=$(readlink "$R_PREFIX/$link")
        case $tree in */*) ;; "$link".*) [ ! -d "$R_PREFIX/$tree" ] || note_made "$tree" ;; esac
    done
    [ ! -d "$R_PREFIX/displaced" ] || note_made displaced
}

# A name install.sh is about to create: refused when something it did not make is there.
claim() {
    if made "$1"; then return 0; fi
    ! exists "$R_PREFIX/$1" \
        || die "$R_PREFIX/$1 exists and was not made by install.sh: choose another --prefix"
    note_made "$1"
    run_made="$run_made $1"
}

# What this run made, undone when it stops before a launcher names its new tree: an
# aborted install leaves the prefix as it found it. From the first launcher on, the new
# tree is in use and stays (a later run or --uninstall finds it recorded).
run_made=""      # names below PREFIX this run created (and recorded)
record_made=""   # this run wrote the first record (and made the prefix when prefix_made)
prefix_made=""
in_use=""        # set once a launcher may name the new tree
src_copy=""      # the copy of the source pip builds from
cleanup() {
    status=$?
    trap - EXIT
    if [ -n "$src_copy" ]; then rm -rf "$src_copy"; fi
    if [ "$status" -ne 0 ] && [ -z "$in_use" ]; then
        for name in $run_made; do
            rm -rf "${R_PREFIX:?}/$name"
            if [ -z "$record_made" ]; then forget "$name" || true; fi
        done
        if [ -n "$record_made" ]; then rm -f "$RECORD"; fi
        if [ -n "$prefix_made" ]; then rmdir "$R_PREFIX" 2>/dev/null || true; fi
        if [ -n "$run_made$record_made" ]; then
            echo "install.sh: stopped; removed what this run had made below $R_PREFIX" >&2
        fi
    fi
    exit "$status"
}

# The retired resident helper: its unit (the one `make install-helper` wrote, running our
# launcher) is stopped and removed, systemd told only when it manages the system we write
# to (never below --root); then its launcher.
retire_helper() {
    unit="$root$HELPER_UNIT"
    if [ -f "$unit" ] && grep -qF "$prefix/cni-meta-helper" "$unit"; then
        live=""
        if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
            live=1
            systemctl disable --now cni-meta-helper.service >/dev/null 2>&1 \
                || say "could not stop cni-meta-helper.service; removing its unit anyway"
        fi
        wants="$root/etc/systemd/system/multi-user.target.wants/cni-meta-helper.service"
        if [ -L "$wants" ]; then rm -f "$wants"; fi
        rm -f "$unit"
        if [ -n "$live" ]; then systemctl daemon-reload || true; fi
        say "removed the retired helper's unit $unit"
    fi
    if is_ours "$R_PREFIX/cni-meta-helper"; then
        rm -f "$R_PREFIX/cni-meta-helper"
        say "removed the retired helper's launcher $R_PREFIX/cni-meta-helper"
    fi
}

uninstall() {
    # Without --bin-dir, remove from where the last install put the plugins.
    if [ -z "$bin_dir_given" ] && [ -f "$RECORD" ]; then
        recorded=$(sed -n 's/^bin_dir=//p' "$RECORD")
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
    retire_helper
    [ -f "$RECORD" ] || return 0
    adopt_old_record
    # Only the recorded names: the prefix may be shared (e.g. --prefix /opt).
    for name in $(made_names); do
        case $name in
            . | displaced) ;;
            *) if exists "$R_PREFIX/$name"; then rm -rf "${R_PREFIX:?}/$name"; fi ;;
        esac
    done
    if made displaced; then
        rmdir "$R_PREFIX/displaced" 2>/dev/null || true
        [ ! -d "$R_PREFIX/displaced" ] || say "kept $R_PREFIX/displaced (not restored: a file is in the way)"
    fi
    prefix_made=""
    if made .; then prefix_made=1; fi
    rm -f "$RECORD"
    if [ -n "$prefix_made" ] && rmdir "$R_PREFIX" 2>/dev/null; then say "removed $R_PREFIX"; fi
}

# The package a plugin's executable runs: its name with "_" for "-" (flatnet-ipam).
module_of() { echo "$1" | tr - _; }

python_launcher() { # plugin interpreter paths -> launcher text on stdout
    cat <<EOF
#!$2 -IS
# $MARKER: $1 (deploy/install.sh). -I: the caller's PYTHON* variables, user site and cwd
# are ignored, so the plugin behaves the same under every runtime. -S: site.py is not run
# (it costs a few ms on every container start); the environment's own import paths were
# resolved when this file was written, in the versioned tree that an upgrade leaves in
# place for calls still running on it. The only programs a plugin execs are looked up in
# the system's own directories: PATH does not matter.
import sys
sys.path += $3
from $(module_of "$1").__main__ import main
main()
EOF
}

shell_launcher() { # plugin interpreter paths -> launcher text (when the shebang would be too long)
    cat <<EOF
#!/bin/sh
# $MARKER: $1 (deploy/install.sh)
exec "$2" -I -S -c 'import sys; sys.path += $3; from $(module_of "$1").__main__ import main; main()' "\$@"
EOF
}

# The import paths site.py would add for the interpreter $1 (as seen from inside $root):
# its site-packages and whatever their .pth files name (an editable install's source tree).
# The directory holding our packages goes first: each plugin start then finds common/ and
# its own package there without listing a big site-packages first, on every start.
site_paths() {
    "$root$1" -I - "$root" <<'EOF'
import ast, json, os, subprocess, sys
bare = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; print(sys.path)"],
                      capture_output=True, text=True, check=True).stdout
seen = set(ast.literal_eval(bare))
root = sys.argv[1]
added = [p for p in sys.path if p and p not in seen]
added.sort(key=lambda p: not os.path.isfile(os.path.join(p, "common", "skel.py")))
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
    -c 'import sys; sys.path.insert(0, "'"\$B"'/site"); from $(module_of "$1").__main__ import main; main()' "\$@"
EOF
}

# The tree the symlink PREFIX/$1 names now (nothing if none): calls may still run on it.
current_tree() {
    if made "$1" && [ -L "$R_PREFIX/$1" ]; then readlink "$R_PREFIX/$1"; fi
    return 0
}

# Point the symlink PREFIX/$2 at the tree $1 in one rename (it shows which tree is current).
swap_link() {
    claim "$2"
    ln -s "$1" "$R_PREFIX/$2.link.$$"
    mv -T "$R_PREFIX/$2.link.$$" "$R_PREFIX/$2"
}

# A fresh versioned tree of kind $1 (venv or bundle): $fresh, recorded and created empty.
new_tree() {
    fresh="$1.$(date +%s).$$"
    claim "$fresh"
    mkdir "$R_PREFIX/$fresh"
}

prepare_runtime() { # sets $interp (as seen from inside root) and $tree (the new tree's name)
    tree=""
    if [ -n "$bundle" ]; then
        [ -x "$bundle/bin/python3" ] && [ -e "$bundle/lib/ld-linux.so" ] \
            || die "$bundle is not a bundle made by deploy/build-bundle.sh"
        new_tree bundle
        cp -a "$bundle/." "$R_PREFIX/$fresh/"
        tree=$fresh
        interp="$prefix/$fresh"
        return
    fi
    if [ -n "$venv" ]; then
        [ -x "$root$venv/bin/python" ] || die "--venv $venv has no bin/python"
        "$root$venv/bin/python" -I -c 'import portmap.__main__, bandwidth.__main__, tuning.__main__, flatnet.__main__, flatnet_ipam.__main__' \
            || die "--venv $venv does not have cni-meta-plugins installed"
        interp="$venv/bin/python"
        return
    fi
    [ -f "$source_dir/pyproject.toml" ] || die "no project source in $source_dir (use --source)"
    command -v "$python" >/dev/null || die "no interpreter $python (use --python)"
    new_tree venv
    say "building a venv in $R_PREFIX/$fresh from $source_dir with $python"
    # -I: the working directory is not on sys.path (a planted venv.py or pip/ would run as
    # root otherwise), and PYTHON* variables are ignored.
    "$python" -I -m venv "$R_PREFIX/$fresh" || die "$python -m venv failed"
    # Build from a copy: pip must not drop build/ or *.egg-info into the source tree.
    src_copy=$(mktemp -d)
    (cd "$source_dir" && tar --exclude=./.venv --exclude=./.git --exclude='*/__pycache__' \
        --exclude=./build --exclude='*.egg-info' -cf - .) | tar -C "$src_copy" -xf -
    "$R_PREFIX/$fresh/bin/python" -I -m pip install -q --disable-pip-version-check "$src_copy" \
        || die "pip install failed"
    tree=$fresh
    interp="$prefix/$fresh/bin/python"
}

# After an install: keep the new tree and the ones current before it (calls that started
# on them may still import from them); remove the older trees this script made.
prune_trees() {
    for name in $(made_names); do
        case $name in venv.* | bundle.*) ;; *) continue ;; esac
        case " $tree $previous " in *" $name "*) continue ;; esac
        rm -rf "${R_PREFIX:?}/$name"
        forget "$name"
    done
}

# Before anything is written: every name this install will create must be free or ours.
preflight() {
    needed=""
    if [ -n "$bundle" ]; then needed=bundle; elif [ -z "$venv" ]; then needed=venv; fi
    for p in $plugins; do
        if [ -e "$R_BIN/$p" ] && ! is_ours "$R_BIN/$p"; then needed="$needed displaced"; fi
    done
    for name in $needed; do
        if exists "$R_PREFIX/$name" && ! made "$name"; then
            die "$R_PREFIX/$name exists and was not made by install.sh: choose another --prefix"
        fi
    done
}

install() {
    adopt_old_record
    preflight
    if [ ! -d "$R_PREFIX" ]; then
        record_made=1
        mkdir -p "$R_PREFIX"
        prefix_made=1
        printf 'format=2\nmade=.\n' >"$RECORD"
    elif [ ! -f "$RECORD" ]; then
        record_made=1
        echo format=2 >"$RECORD"
    fi
    retire_helper
    previous="$(current_tree venv) $(current_tree bundle)"
    prepare_runtime
    paths=""
    [ -n "$bundle" ] || paths=$(site_paths "$interp") || die "cannot ask $interp for its import paths"
    # Launchers of ours already in the bin dir are rewritten too: each names the new tree,
    # so none is left naming a tree that a later upgrade removes.
    for p in flatnet flatnet-ipam portmap bandwidth tuning; do
        case " $plugins " in *" $p "*) continue ;; esac
        if is_ours "$R_BIN/$p"; then plugins="$plugins $p"; fi
    done
    mkdir -p "$R_BIN"
    in_use=1
    for p in $plugins; do
        target="$R_BIN/$p"
        if [ -e "$target" ] && ! is_ours "$target"; then
            if ! made displaced; then
                claim displaced
                mkdir -p "$R_PREFIX/displaced"
            fi
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
    # PREFIX/venv or PREFIX/bundle names the current tree; the other kind's link would name
    # one that is no longer current.
    for kind in venv bundle; do
        case $tree in
            "$kind".*) swap_link "$tree" "$kind" ;;
            *) if made "$kind"; then
                   rm -f "$R_PREFIX/$kind"
                   forget "$kind"
               fi ;;
        esac
    done
    prune_trees
    set_field bin_dir "$bin_dir"
    set_field plugins "$plugins"
}

# podman's default cni_plugin_dirs (containers/common, podman 4) search /usr/lib/cni, where
# Debian's containernetworking-plugins puts the Go plugins, before /opt/cni/bin. The
# effective list is the last `cni_plugin_dirs` of the [network] tables of the files podman
# reads, in its order; without one, that default.
PODMAN_DEFAULT_DIRS="/usr/local/libexec/cni /usr/libexec/cni /usr/local/lib/cni /usr/lib/cni /opt/cni/bin"
podman_plugin_dirs() { # -> line 1: the file to change, line 2: the dirs podman searches
    dirs=$PODMAN_DEFAULT_DIRS
    # A setting in /usr/share or /etc is overridden by one in /etc; one in containers.conf.d
    # only by itself (or a later file there).
    setter=/etc/containers/containers.conf
    for f in "$root/usr/share/containers/containers.conf" "$root/etc/containers/containers.conf" \
        "$root"/etc/containers/containers.conf.d/*.conf; do
        [ -f "$f" ] || continue
        # "set" and the dirs when the file sets the key (a later setting replaces an earlier
        # one, also with an empty list); nothing when it does not.
        found=$(awk '
            /^[ \t]*\[/ { table = $0; gsub(/[ \t]|\[|\]/, "", table); grab = 0; next }
            table == "network" && /^[ \t]*cni_plugin_dirs[ \t]*=/ { grab = 1; out = "set" }
            grab {
                line = $0; sub(/#.*/, "", line)
                while (match(line, /"[^"]*"/)) {
                    out = out " " substr(line, RSTART + 1, RLENGTH - 2)
                    line = substr(line, RSTART + RLENGTH)
                }
                if (line ~ /\]/) grab = 0
            }
            END { print out }' "$f")
        case $found in set*)
            dirs=${found#set}
            case $f in */containers.conf.d/*) setter=${f#"$root"} ;; esac
            ;;
        esac
    done
    printf '%s\n%s\n' "$setter" "$dirs"
}

# After an install, where podman is on the node: the plugins it would run must be ours.
# Its configuration is the operator's, so this says the one line that makes it so rather
# than editing it.
check_podman() {
    [ -e "$root/usr/bin/podman" ] || [ -e "$root/usr/local/bin/podman" ] \
        || [ -e "$root/usr/share/containers/containers.conf" ] \
        || [ -e "$root/etc/containers/containers.conf" ] || return 0
    found=$(podman_plugin_dirs)
    conf=$(printf '%s\n' "$found" | sed -n 1p)
    dirs=$(printf '%s\n' "$found" | sed -n 2p)
    shadowed=""
    case " $dirs " in
        *" ${bin_dir%/} "* | *" ${bin_dir%/}/ "*) ;;
        *) shadowed=" nothing in $bin_dir (it is not searched)" ;;
    esac
    for p in $plugins; do
        for d in $dirs; do
            d=${d%/}
            [ "$d" = "${bin_dir%/}" ] && break
            if [ -f "$root$d/$p" ] && [ -x "$root$d/$p" ] && ! is_ours "$root$d/$p"; then
                shadowed="$shadowed $d/$p"
                break
            fi
        done
    done
    [ -n "$shadowed" ] || return 0
    list="\"${bin_dir%/}\""
    for d in $dirs; do
        [ "${d%/}" = "${bin_dir%/}" ] || list="$list, \"$d\""
    done
    {
        echo "install.sh: podman would not run the plugins installed in $bin_dir:" \
            "its cni_plugin_dirs find$shadowed first."
        echo "install.sh: to make it run them, put this line in the [network] table of" \
            "$conf (begin the file with [network] if it has none):"
        echo "cni_plugin_dirs = [$list]"
    } >&2
}

if [ "$action" = uninstall ]; then
    uninstall
else
    trap cleanup EXIT
    # A signal ends the run through the EXIT trap, with the shell's usual status.
    trap 'exit 129' HUP
    trap 'exit 130' INT
    trap 'exit 143' TERM
    install
    check_podman
fi

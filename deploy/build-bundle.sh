#!/bin/sh
# Build a relocatable bundle of the plugins: a Python interpreter, its standard library,
# our packages and their dependencies, and every shared library all of that loads
# (including the dynamic loader and libc, and libnftables).
# The bundle runs on any x86-64/arm64 Linux node whatever its distribution or Python:
# deploy/install.sh --bundle DIR copies it into place and writes the launchers.
#
#   deploy/build-bundle.sh OUT                      # pip-installs the project into OUT/site
#   deploy/build-bundle.sh OUT --deps-from SITEDIR  # copies the dependencies from a venv
#                                                   # (offline; what the tests use)
# Layout: OUT/bin/python3, OUT/lib/pythonX.Y (stdlib), OUT/site (packages),
#         OUT/lib/*.so* (libraries), OUT/lib/ld-linux.so (the loader).
set -eu

out=${1:?usage: build-bundle.sh OUT [--python PY] [--deps-from SITE_PACKAGES] [--source DIR]}
shift
python=${PYTHON:-python3}
deps_from=""
source_dir=$(cd "$(dirname "$0")/.." && pwd)
while [ $# -gt 0 ]; do
    case $1 in
        --python) python=$2; shift 2 ;;
        --deps-from) deps_from=$2; shift 2 ;;
        --source) source_dir=$2; shift 2 ;;
        *) echo "build-bundle.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

die() { echo "build-bundle.sh: $*" >&2; exit 1; }
command -v "$python" >/dev/null || die "no interpreter $python"
# The real binary, not a shim (pyenv) or a venv symlink.
py=$("$python" -c 'import sys; print(sys.executable)')
py=$(readlink -f "$py")
[ "$(head -c 4 "$py" | od -An -c | tr -d ' ')" = "177ELF" ] || die "$py is not an ELF binary"
ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
dynload=$("$py" -c 'import sysconfig, os; print(os.path.join(sysconfig.get_paths()["platstdlib"], "lib-dynload"))')
[ -d "$dynload" ] || dynload=""

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/python$ver" "$out/site"
out=$(cd "$out" && pwd)
cp "$py" "$out/bin/python3"

# The standard library, without what a plugin never imports.
(cd "$stdlib" && tar --exclude=./test --exclude=./idlelib --exclude=./tkinter \
    --exclude=./turtledemo --exclude=./ensurepip --exclude=./lib2to3 --exclude=./site-packages \
    --exclude=./dist-packages --exclude=./config-"$ver"-* -cf - .) | tar -C "$out/lib/python$ver" -xf -
if [ -n "$dynload" ] && [ ! -d "$out/lib/python$ver/lib-dynload" ]; then
    cp -a "$dynload" "$out/lib/python$ver/lib-dynload"
fi
rm -f "$out/lib/python$ver/lib-dynload"/_tkinter*  # would drag in X11 and Tcl/Tk

# Our packages and their dependencies.
if [ -n "$deps_from" ]; then
    for dep in pyroute2; do
        [ -e "$deps_from/$dep" ] || die "$deps_from has no $dep"
        cp -a "$deps_from/$dep" "$out/site/"
    done
    for pkg in common portmap bandwidth tuning flatnet flatnet_ipam; do
        cp -a "$source_dir/$pkg" "$out/site/"
    done
else
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir "$work/src"
    (cd "$source_dir" && tar --exclude=./.venv --exclude=./.git --exclude='*/__pycache__' \
        --exclude=./build --exclude='*.egg-info' -cf - .) | tar -C "$work/src" -xf -
    # pip from a throwaway venv: a distribution's own pip may refuse (PEP 668).
    "$py" -m venv "$work/venv"
    "$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile \
        --target "$out/site" "$work/src"
    rm -rf "$out/site/bin"
fi
find "$out/site" -name __pycache__ -type d -prune -exec rm -rf {} +

# Libraries loaded with dlopen by name (ctypes). The iptables backend runs the host's own
# iptables-restore, so that its rules land where the host's iptables looks.
libdir_of() { ldconfig -p | awk -v n="$1" '$1 == n { print $NF; exit }'; }
for soname in libnftables.so.1; do
    path=$(libdir_of "$soname")
    [ -n "$path" ] || die "$soname not found (install libnftables1)"
    cp -L "$path" "$out/lib/$soname"
done

# The shared-library closure of every ELF file in the bundle, and the loader.
find "$out" -type f \( -name '*.so*' -o -path "$out/bin/*" \) | while read -r elf; do
    ldd "$elf" 2>/dev/null | awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }'
done | sort -u | while read -r lib; do
    base=$(basename "$lib")
    case $base in
        ld-linux*) cp -L "$lib" "$out/lib/ld-linux.so" ;;
        *) [ -e "$out/lib/$base" ] || cp -L "$lib" "$out/lib/$base" ;;
    esac
done
[ -e "$out/lib/ld-linux.so" ] || die "no dynamic loader found for $py"

# A compiled stdlib and site: every plugin start then skips compiling. The bytecode is
# checked against nothing (unchecked-hash): the bundle is never edited in place, and the
# sources' times do not survive every copy (an image layer keeps whole seconds), which
# would make timestamp-checked bytecode stale and every start compile from source. The
# paths recorded in it are relative to the bundle (-s), so the bytecode does not depend on
# where the bundle was built (the import system names the real file at run time anyway).
"$py" -I -m compileall -q -f --invalidation-mode unchecked-hash -s "$out" \
    "$out/lib/python$ver" "$out/site" >/dev/null 2>&1 || true
echo "$out"

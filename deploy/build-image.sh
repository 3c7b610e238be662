#!/bin/sh
# Build the image of the Kubernetes DaemonSet (deploy/kubernetes/daemonset.yaml) offline:
# nothing is pulled from a registry. The image is FROM scratch and holds
#   /bundle      the relocatable bundle of deploy/build-bundle.sh (interpreter, stdlib,
#                our packages, pyroute2, libnftables, libc and the loader),
#   /install.sh  deploy/install.sh, the image's entrypoint,
#   /bin         a static busybox (Debian's busybox-static) and its applets: the shell and
#                the tools install.sh and the keepalive container use.
#
#   deploy/build-image.sh                          # tag localhost/cni-meta-plugins:VERSION
#   deploy/build-image.sh --tag registry.example/cni-meta-plugins:0.1.0
#   deploy/build-image.sh --deps-from SITE_PACKAGES   # pyroute2 from this environment
#                                                     # (no PyPI either; what make image does)
# Other options: --context DIR (the build context, default build/image of this checkout),
# --python PY (the bundle's interpreter, default /usr/bin/python3), --busybox PATH.
# PODMAN may name the podman command with global options, e.g.
#   PODMAN="podman --root /tmp/s --runroot /tmp/r --storage-driver vfs"
# The build runs no command in a container (COPY only), so it needs no container runtime
# and no network. Prints the tag and the image's digest (sha256:...) on its last two lines.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -n 1)
tag="localhost/cni-meta-plugins:$version"
python=/usr/bin/python3
busybox=/bin/busybox
deps_from=""
context="$repo/build/image"
podman=${PODMAN:-podman}

die() { echo "build-image.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --tag) tag=${2:?--tag needs a name}; shift 2 ;;
        --python) python=${2:?--python needs an interpreter}; shift 2 ;;
        --busybox) busybox=${2:?--busybox needs a path}; shift 2 ;;
        --deps-from) deps_from=${2:?--deps-from needs a site-packages dir}; shift 2 ;;
        --context) context=${2:?--context needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) die "unknown argument: $1" ;;
    esac
done

[ -x "$busybox" ] || die "no $busybox (apt-get install busybox-static)"
# A dynamically linked busybox would need a libc in the image that nothing puts there.
if ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is dynamically linked: install Debian's busybox-static (or use --busybox)"
fi

# Only the rootfs below the context is ours to replace (--context may name any directory).
rootfs="$context/rootfs"
rm -rf "$rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/host" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
set -- --python "$python" --source "$repo"
[ -z "$deps_from" ] || set -- "$@" --deps-from "$deps_from"
"$repo/deploy/build-bundle.sh" "$rootfs/bundle" "$@" >/dev/null
cp "$busybox" "$rootfs/bin/busybox"
for applet in $("$busybox" --list); do
    case $applet in busybox | */*) continue ;; esac
    ln -s busybox "$rootfs/bin/$applet"
done
cp "$repo/deploy/install.sh" "$rootfs/install.sh"
chmod 0755 "$rootfs/install.sh"
printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"

# Every file of the layer and the image's creation time get the time of the checkout's
# last commit, not the clock's: a rebuild of the same commit yields the same digest.
timestamp=""
if stamp=$(git -C "$repo" log -1 --format=%ct 2>/dev/null) && [ -n "$stamp" ]; then
    timestamp="--timestamp $stamp"
fi
# shellcheck disable=SC2086  # PODMAN may carry global options
$podman build --pull=never --no-cache --network none $timestamp -f "$repo/deploy/Containerfile" \
    -t "$tag" "$context" >&2
digest=$($podman image inspect --format '{{.Digest}}' "$tag")
echo "image:  $tag"
echo "digest: $digest"

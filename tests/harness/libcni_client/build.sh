#!/usr/bin/env bash
# Builds the tests' libcni client (main.go) offline, against the Go toolchain and the CNI
# library sources Debian packages (golang-go, golang-github-appc-cni-dev; `make deps`
# installs both). GOPATH mode: the sources under /usr/share/gocode are the only
# dependencies, so the build needs no module proxy and no network.
#   tests/harness/libcni_client/build.sh OUT   -> OUT (the executable)
set -euo pipefail
out=${1:?usage: build.sh OUTPUT_FILE}
here=$(cd "$(dirname "$0")" && pwd)
gopath=${LIBCNI_GOPATH:-/usr/share/gocode}
if ! command -v go >/dev/null; then
  echo "build.sh: no 'go' on PATH; apt-get install golang-go (make deps does)" >&2
  exit 1
fi
if [ ! -d "$gopath/src/github.com/containernetworking/cni/libcni" ]; then
  echo "build.sh: libcni sources not in $gopath; apt-get install golang-github-appc-cni-dev" \
    "(make deps does)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy outside the checkout: GOPATH mode builds a directory as a package of its own.
cp "$here/main.go" "$work/"
cd "$work"
GO111MODULE=off GOPATH="$gopath" GOCACHE="$work/cache" GOPROXY=off GOFLAGS= CGO_ENABLED=0 \
  go build -trimpath -o "$work/libcni-client" .
mkdir -p "$(dirname "$out")"
mv "$work/libcni-client" "$out"

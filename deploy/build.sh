#!/usr/bin/env bash
# Builds the three tinkerfleet programs as static binaries (no cgo), exactly as the Dockerfile
# does: the image's builder stage runs this script, and CI runs it outside Docker.
#
#   deploy/build.sh [OUT_DIR]        # default OUT_DIR: bin/
#
# Environment: GOOS/GOARCH to cross-compile (the Dockerfile passes TARGETOS/TARGETARCH).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bin}"
mkdir -p "$out"
export CGO_ENABLED=0
for cmd in worker submit tinkersim; do
	# -trimpath: no build paths in the binary; -s -w: no symbol tables (smaller image).
	go build -trimpath -ldflags "-s -w" -o "$out/$cmd" "./cmd/$cmd"
done
# A static binary has no dynamic section; fail loudly if cgo slipped in.
if command -v file >/dev/null; then
	for cmd in worker submit tinkersim; do
		if ! file "$out/$cmd" | grep -q 'statically linked'; then
			echo "build.sh: $out/$cmd is not statically linked" >&2
			exit 1
		fi
	done
fi
echo "built $out/worker $out/submit $out/tinkersim (${GOOS:-$(go env GOOS)}/${GOARCH:-$(go env GOARCH)})"

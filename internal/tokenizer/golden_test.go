package tokenizer

import (
	"slices"
	"testing"
)

func checkGolden(t *testing.T, tok *Tokenizer, file string) {
	lines := readGolden(t, file)
	matched := 0
	for i, g := range lines {
		ids := tok.Encode(g.Text)
		if !slices.Equal(ids, g.IDs) {
			t.Errorf("%s line %d %q:\n got %v\nwant %v", file, i+1, g.Text, ids, g.IDs)
			continue
		}
		if got := tok.Decode(g.IDs); got != g.Decoded {
			t.Errorf("%s line %d: Decode = %q, want %q", file, i+1, got, g.Decoded)
			continue
		}
		matched++
	}
	t.Logf("%s: %d/%d lines match in ids and decoded text", file, matched, len(lines))
}

func TestGoldenQwen3(t *testing.T) { checkGolden(t, qwen3(t), "qwen3-golden.jsonl") }

func TestGoldenLlama3(t *testing.T) { checkGolden(t, llama3(t), "llama3-golden.jsonl") }

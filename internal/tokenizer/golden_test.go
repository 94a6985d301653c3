package tokenizer

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/text/unicode/norm"
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

// Qwen3 normalizes with NFC, which HF does with Unicode 9.0's tables and without the
// Stream-Safe Text Format's limit of 30 non-starters in a row (see normalizeAsHF). The golden
// lines ask about every character that Unicode 15.0 gave a combining class or a
// decomposition and HF does not know, a seventh of those it does, and runs of up to 70
// combining marks, among them Zalgo text.
func TestGoldenQwen3NFC(t *testing.T) { checkGolden(t, qwen3(t), "qwen3-nfc-golden.jsonl.zst") }

// The same about compatibility decompositions, with Qwen3's tokenizer.json given an NFKC
// normalizer.
func TestGoldenQwen3NFKC(t *testing.T) {
	checkGolden(t, qwen3With(t, "normalizer", map[string]any{"type": "NFKC"}), "qwen3-nfkc-golden.jsonl.zst")
}

// DeepSeek V3 pre-tokenizes with a Sequence of three Splits (digits, CJK runs, words),
// which exercises the chained splitters: the hand-written ones, and regexp2, the fallback for
// patterns no scanner knows.
func TestGoldenDeepSeekV3(t *testing.T) {
	tok := deepseekV3(t)
	if want := (chained{deepSeekDigits{}, deepSeekCJK{}, deepSeekWords{}}); !reflect.DeepEqual(tok.split, want) {
		t.Fatalf("the file's patterns split with %#v, want the scanners %#v", tok.split, want)
	}
	checkGolden(t, tok, "deepseek_v3-golden.jsonl")
	viaRegexp2 := withRegexSplitters(t, tok, PatternDeepSeekDigits, PatternDeepSeekCJK, PatternDeepSeekWords)
	checkGolden(t, viaRegexp2, "deepseek_v3-golden.jsonl")
}

// gpt-oss pre-tokenizes with o200k's pattern (case-aware words, digit runs of up to
// three), which its hand-written scanner cuts.
func TestGoldenGptOss(t *testing.T) { checkGolden(t, gptOss(t), "gpt-oss-golden.jsonl") }

// TestCommittedQwen3Checksum checks that the committed .zst decompresses to
// the tokenizer.json named in testdata/tokenizer/README.md.
func TestCommittedQwen3Checksum(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("builtin", "qwen3", "tokenizer.json.zst"))
	if err != nil {
		t.Fatal(err)
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	raw, err := dec.DecodeAll(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	const want = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
	if got := fmt.Sprintf("%x", sha256.Sum256(raw)); got != want || len(raw) != 11422654 {
		t.Fatalf("tokenizer.json sha256 %s (%d bytes), want %s (11422654 bytes)", got, len(raw), want)
	}
}

// TestNormalizationTablesAreTheOnesCompared: unknownToHFRanges lists the characters Unicode
// 15.0 gave a class or a decomposition and HF's 9.0 tables lack. x/text picks its tables by Go
// release (17.0 from Go 1.27); with others, characters of 16.0 and 17.0 would be composed and
// reordered where HF leaves them, and no golden line asks about them. Derive the list again
// (its comment says how) when this fails.
func TestNormalizationTablesAreTheOnesCompared(t *testing.T) {
	if norm.Version != "15.0.0" {
		t.Fatalf("x/text normalizes with Unicode %s, and unknownToHFRanges was derived against 15.0.0", norm.Version)
	}
}

package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// FuzzQwen3RoundTrip: whatever text a prompt holds, encoding it never panics (a panic would end
// the job's worker), and decoding the ids gives the text back as the tokenizer's NFC
// normalizer leaves it: byte-level BPE loses nothing. (Ids against the Rust library's are
// golden_test.go's; this finds the inputs no golden file thought of.)
func FuzzQwen3RoundTrip(f *testing.F) {
	tok := qwen3(f)
	for _, s := range []string{"Hello, world!", "  leading\tand\r\ntrailing  ", "日本語のテキスト, 中文, 한국어",
		"emoji 👩‍👩‍👧 and e\u0301", "<|im_start|>user\nhi<|im_end|>", "it's 12345 they've !!!", "\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s)
		if !utf8.ValidString(s) {
			return // invalid bytes come back as U+FFFD
		}
		if want := normalizeAsHF(norm.NFC, s); tok.Decode(ids) != want {
			t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, tok.Decode(ids), want)
		}
	})
}

// FuzzOwnNormalizationMatchesXText: the normalization done for HF's sake (long runs of
// non-starters, characters HF's tables lack) is UAX #15's, as x/text's is: on text that has
// neither, the two agree in all four forms. And each is stable: normalizing twice changes
// nothing more.
func FuzzOwnNormalizationMatchesXText(f *testing.F) {
	for _, s := range []string{"e\u0301", "a\u0323\u0301\u0302", "\u1100\u1161\u11a8", "\uac00\u11a8", "\u212b\u0301",
		"\ufb01 \u2460 \u00bd", "\u0b47\u0b3e\u0b57", "x\u0334\u0301\u0345\u0323", "\u0f73\u0f75\u0f81", "\u0344\u0301"} {
		f.Add(s)
	}
	forms := []norm.Form{norm.NFC, norm.NFD, norm.NFKC, norm.NFKD}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) || holdsUnknownToHF(s) {
			return
		}
		for _, form := range forms {
			x := form.String(s)
			if strings.Count(x, graphemeJoiner) != strings.Count(s, graphemeJoiner) || holdsUnknownToHF(x) {
				continue // a run x/text cuts, or a character HF lacks
			}
			if own := ownNormalization(form, s); own != x {
				t.Fatalf("form %v of %+q: own %+q, x/text %+q", form, s, own, x)
			}
			if hf := normalizeAsHF(form, s); normalizeAsHF(form, hf) != hf {
				t.Fatalf("form %v of %+q is not stable: %+q", form, s, hf)
			}
		}
	})
}

package tokenizer

import (
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
		if want := norm.NFC.String(s); tok.Decode(ids) != want {
			t.Fatalf("Decode(Encode(%q)) = %q, want %q", s, tok.Decode(ids), want)
		}
	})
}

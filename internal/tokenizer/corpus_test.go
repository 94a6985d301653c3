package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/corpus"
)

// buildCorpus returns the shared benchmark corpus of at least size bytes (internal/corpus).
func buildCorpus(t testing.TB, size int) string {
	t.Helper()
	s, err := corpus.Build(size)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// randomText makes adversarial strings out of characters that sit on the
// pattern's edges: every class, \r\n runs, apostrophes, invalid bytes.
func randomText(r *rand.Rand, n int) string {
	alphabet := []string{" ", " ", "  ", "\t", "\n", "\r", "\r\n", "'", "'s", "'LL", "'re", "'x", "a", "Z", "é",
		"e\u0301", "日", "한", "7", "42", "١", "½", ".", "!", "?!", "(", "\"", "-", "_", "\u00a0", "\u3000", "\u2003",
		"\u200b", "🚀", "👍🏽", "\xff", "\xe2\x82", "\v", "\f", "\u0085", "\u2028", "x", "y1", "<", "<|", "|>",
		// for o200k's case-aware words: capitals, title case, modifier letters, lone marks
		// (a mark is in both word classes but not a letter), a slash after punctuation.
		"A", "AB", "aB", "Ab", "'S", "ǅ", "ʰ", "\u0301", "\u0903", "\u20dd", "ß", "Ω", "ω", "/", "-/",
		// for DeepSeek V3's patterns: kana, the ends of its CJK range, punctuation against
		// symbols, digit runs, controls, and characters of Unicode 16.0 (a Garay digit and
		// letter, U+1171E, a symbol, a punctuation mark and a mark).
		"あ", "カ", "ー", "・", "\u9fa5", "\u9fa6", "\u4e00", "\u4dff", "$", "^", "`", "+", "€", "©", "12345", "\x00",
		"\u200d", "\ufeff", "\U00010D40", "\U00010D4A", "\U0001171E", "\u2427", "\u1b4e", "a\u0897", " -", "_a", "(a", "é.", " €", ".\n", "!\r\n"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

func collect(sp splitter, s string) []string {
	var out []string
	sp.split(s, func(p string) { out = append(out, p) })
	return out
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestScannerMatchesRegexp2 is the oracle for the hand-written scanner: on a
// large mixed corpus and on random adversarial text it must cut exactly the
// pieces that the regex (with look-ahead, via regexp2) cuts.
func TestScannerMatchesRegexp2(t *testing.T) {
	corpus := buildCorpus(t, 300_000)
	if testing.Short() {
		corpus = corpus[:60_000]
	}
	r := rand.New(rand.NewPCG(1, 2))
	var fuzz []string
	for range 3000 {
		fuzz = append(fuzz, randomText(r, 1+r.IntN(80)))
	}
	for _, tc := range []struct {
		name    string
		pattern string
		fast    splitter
	}{{"qwen2", PatternQwen2, scanner{maxDigits: 1}}, {"llama3", PatternLlama3, scanner{maxDigits: 3}}, {"o200k", PatternO200k, o200kScanner{}},
		{"deepseek-digits", PatternDeepSeekDigits, deepSeekDigits{}}, {"deepseek-cjk", PatternDeepSeekCJK, deepSeekCJK{}},
		{"deepseek-words", PatternDeepSeekWords, deepSeekWords{}}} {
		t.Run(tc.name, func(t *testing.T) {
			re, err := newRegexSplitter(tc.pattern)
			if err != nil {
				t.Fatal(err)
			}
			want, got := collect(re, corpus), collect(tc.fast, corpus)
			if i := firstDiff(want, got); i < len(want) || len(want) != len(got) {
				lo := max(0, i-3)
				t.Fatalf("corpus: piece %d differs:\nregexp2 %q\nscanner %q", i, want[lo:min(len(want), i+3)], got[lo:min(len(got), i+3)])
			}
			t.Logf("corpus: %d pieces identical", len(got))
			for _, s := range fuzz {
				want, got := collect(re, s), collect(tc.fast, s)
				if !slices.Equal(want, got) {
					t.Fatalf("text %q:\nregexp2 %q\nscanner %q", s, want, got)
				}
			}
		})
	}
}

// TestContractionOfLongS: HF's regex engine (Oniguruma) matches (?i:'s|...) by Unicode case
// folding, so "'ſ" (U+017F, which folds to s) is a contraction, where regexp2 sees none. The
// pieces are HF's (pre_tokenize_str of the Qwen3, Llama 3 and gpt-oss tokenizers). For gpt-oss
// the ids differ too: "a'ſ'SV" is [64 6 70067 6 22636] in HF (gpt-oss-golden.jsonl).
func TestContractionOfLongS(t *testing.T) {
	for _, tc := range []struct {
		name string
		sp   splitter
		text string
		want []string
	}{
		{"qwen2", scanner{maxDigits: 1}, "'ſſ", []string{"'ſ", "ſ"}},
		{"qwen2", scanner{maxDigits: 1}, "The King'ſ Crown", []string{"The", " King", "'ſ", " Crown"}},
		{"llama3", scanner{maxDigits: 3}, "'ſtand", []string{"'ſ", "tand"}},
		{"llama3", scanner{maxDigits: 3}, "a'ſ'SV", []string{"a", "'ſ", "'S", "V"}},
		{"o200k", o200kScanner{}, "a'ſ'SV", []string{"a'ſ", "'SV"}},
		{"o200k", o200kScanner{}, "Let'ſ 'SEE", []string{"Let'ſ", " '", "SEE"}},
		{"o200k", o200kScanner{}, "'ſtand", []string{"'ſtand"}},
	} {
		if got := collect(tc.sp, tc.text); !slices.Equal(got, tc.want) {
			t.Errorf("%s %q: pieces %q, HF's %q", tc.name, tc.text, got, tc.want)
		}
	}
}

// withRegexSplitter returns a copy of tok that splits with regexp2.
func withRegexSplitter(t testing.TB, tok *Tokenizer, pattern string) *Tokenizer {
	return withRegexSplitters(t, tok, pattern)
}

// withRegexSplitters returns a copy of tok that splits with regexp2, by each pattern in
// turn, as a Sequence of Splits does.
func withRegexSplitters(t testing.TB, tok *Tokenizer, patterns ...string) *Tokenizer {
	t.Helper()
	var sp splitter
	for _, p := range patterns {
		re, err := newRegexSplitter(p)
		if err != nil {
			t.Fatal(err)
		}
		sp = chain(sp, re)
	}
	c := *tok
	c.split = sp
	return &c
}

// TestEncodeCorpusRoundTrip encodes the corpus with the scanner and with the
// regex, expects the same ids, and expects Decode to give the text back.
func TestEncodeCorpusRoundTrip(t *testing.T) {
	corpus := buildCorpus(t, 200_000)
	check := func(t *testing.T, tok *Tokenizer, patterns ...string) {
		ids := tok.Encode(corpus)
		slow := withRegexSplitters(t, tok, patterns...).Encode(corpus)
		if !slices.Equal(ids, slow) {
			t.Fatalf("scanner and regexp2 give different ids (%d vs %d tokens)", len(ids), len(slow))
		}
		// The corpus is NFC except the deliberately decomposed marks, which
		// the Qwen3 normalizer composes.
		if got, want := tok.Decode(ids), tok.normalize(corpus); got != want {
			t.Fatalf("round trip differs at byte %d", firstDiff(strings.Split(got, ""), strings.Split(want, "")))
		}
		t.Logf("%d bytes -> %d tokens", len(corpus), len(ids))
	}
	t.Run("qwen3", func(t *testing.T) { check(t, qwen3(t), PatternQwen2) })
	t.Run("llama3", func(t *testing.T) { check(t, llama3(t), PatternLlama3) })
	t.Run("gpt-oss", func(t *testing.T) { check(t, gptOss(t), PatternO200k) })
	t.Run("deepseek-v3", func(t *testing.T) {
		check(t, deepseekV3(t), PatternDeepSeekDigits, PatternDeepSeekCJK, PatternDeepSeekWords)
	})
}

// TestMergeLinearEqualsHeap checks the short-piece merge loop against HF's
// heap algorithm on random byte strings and corpus pieces.
func TestMergeLinearEqualsHeap(t *testing.T) {
	m := qwen3(t).model
	r := rand.New(rand.NewPCG(3, 4))
	var pieces []string
	scanner{maxDigits: 1}.split(buildCorpus(t, 50_000), func(p string) {
		if len(p) > 1 && len(p) <= 64 {
			pieces = append(pieces, p)
		}
	})
	for range 2000 {
		if p := randomText(r, 2+r.IntN(40)); len(p) <= 64 {
			pieces = append(pieces, p)
		}
		pieces = append(pieces, strings.Repeat(" ", 2+r.IntN(62)))
	}
	for _, p := range pieces {
		lin := m.mergeLinear(nil, p)
		hp := m.mergeHeap(p)
		if !slices.Equal(lin, hp) {
			t.Fatalf("piece %q: linear %v, heap %v", p, lin, hp)
		}
	}
}

package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// The two Split patterns of the byte-level BPE models Tinker serves. They
// differ only in how many digits one piece may hold.
const (
	// PatternQwen2 is the pre-tokenizer pattern of Qwen2, Qwen2.5 and Qwen3.
	PatternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternLlama3 is the pre-tokenizer pattern of Llama 3.x.
	PatternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternO200k is the pre-tokenizer pattern of gpt-oss (o200k_harmony, as OpenAI's
	// o200k_base): words keep a run of capitals before their lower-case letters, and a
	// contraction, and digits come in runs of up to three.
	PatternO200k = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// PatternGPT2 is the pattern the ByteLevel pre-tokenizer uses when use_regex is true.
	PatternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// splitter cuts normalized text into pre-tokens. next returns the end of the
// piece that starts at i (i < len(s)); pieces cover the text with no gaps.
type splitter interface {
	split(s string, emit func(piece string))
}

// Character classes of the scanner.
const (
	clsOther   = iota // [^\s\p{L}\p{N}]
	clsLetter         // \p{L}
	clsNumber         // \p{N}
	clsSpace          // \s other than \r and \n
	clsNewline        // \r or \n
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			t[c] = clsLetter
		case c >= '0' && c <= '9':
			t[c] = clsNumber
		case c == '\r' || c == '\n':
			t[c] = clsNewline
		case c == ' ' || c == '\t' || c == '\v' || c == '\f':
			t[c] = clsSpace
		default:
			t[c] = clsOther
		}
	}
	return t
}()

// classAt returns the class and the byte width of the character at s[i].
// Invalid UTF-8 bytes count as one-byte clsOther characters.
func classAt(s string, i int) (uint8, int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		return clsLetter, n
	case unicode.IsNumber(r):
		return clsNumber, n
	case unicode.IsSpace(r):
		return clsSpace, n
	}
	if cat := newerCategory(r); cat != "" {
		switch cat[0] {
		case 'L':
			return clsLetter, n
		case 'N':
			return clsNumber, n
		}
	}
	return clsOther, n
}

// scanner implements PatternQwen2 (maxDigits 1) and PatternLlama3
// (maxDigits 3) by hand, with the exact leftmost-first, greedy, backtracking
// semantics of the regex engines (Oniguruma in HF tokenizers). It is about
// twenty times faster than regexp2; TestScannerMatchesRegexp2 proves the two
// agree on a large mixed corpus. Where regexp2 is not Oniguruma, the scanner follows
// Oniguruma: "'ſ" is a contraction (see contraction).
type scanner struct {
	maxDigits int
}

func (sc scanner) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		j := sc.next(s, i)
		emit(s[i:j])
		i = j
	}
}

// contraction returns the length of (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i:], or 0. HF's regex
// engine (Oniguruma) matches case-insensitively by Unicode case folding, under which U+017F
// LATIN SMALL LETTER LONG S is an s: "'ſ" is a contraction too. It is the only character
// beyond ASCII that folds to one of these letters.
func contraction(s string, i int) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return 0
	}
	if strings.HasPrefix(s[i+1:], "\u017f") {
		return 1 + len("\u017f")
	}
	switch s[i+1] | 0x20 {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && s[i+2]|0x20 == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && s[i+2]|0x20 == 'l' {
			return 3
		}
	}
	return 0
}

func (sc scanner) next(s string, i int) int {
	// Alternative 1: contractions.
	if n := contraction(s, i); n > 0 {
		return i + n
	}
	c, w := classAt(s, i)
	switch c {
	case clsLetter:
		// Alternative 2 without its optional prefix: \p{L}+.
		return scanClass(s, i+w, clsLetter)
	case clsNumber:
		// Alternative 3: \p{N} or \p{N}{1,3}.
		j := i + w
		for k := 1; k < sc.maxDigits && j < len(s); k++ {
			c2, w2 := classAt(s, j)
			if c2 != clsNumber {
				break
			}
			j += w2
		}
		return j
	case clsOther, clsSpace:
		// Alternative 2: [^\r\n\p{L}\p{N}]\p{L}+.
		j := i + w
		if j < len(s) {
			c2, w2 := classAt(s, j)
			if c2 == clsLetter {
				return scanClass(s, j+w2, clsLetter)
			}
			// Alternative 4: ` ?[^\s\p{L}\p{N}]+[\r\n]*`.
			if c == clsOther || (s[i] == ' ' && c2 == clsOther) {
				if c == clsSpace {
					j += w2
				}
				j = scanClass(s, j, clsOther)
				for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
					j++
				}
				return j
			}
		} else if c == clsOther {
			return j
		}
	}
	return scanSpace(s, i)
}

// scanSpace returns the end of the piece of \s*[\r\n]+|\s+(?!\S)|\s+ that starts at s[i],
// a space or line end: the alternatives that end both scanners' patterns.
func scanSpace(s string, i int) int {
	j, lastNL, lastStart, count := i, -1, i, 0
	for j < len(s) {
		c2, w2 := classAt(s, j)
		if c2 != clsSpace && c2 != clsNewline {
			break
		}
		if c2 == clsNewline {
			lastNL = j + w2
		}
		lastStart = j
		j += w2
		count++
	}
	switch {
	case lastNL >= 0: // \s*[\r\n]+
		return lastNL
	case j == len(s) || count == 1: // \s+(?!\S) at the end, or \s+
		return j
	default: // \s+(?!\S): all but the last space
		return lastStart
	}
}

// scanClass advances over characters of class cls from j.
func scanClass(s string, j int, cls uint8) int {
	for j < len(s) {
		c, w := classAt(s, j)
		if c != cls {
			break
		}
		j += w
	}
	return j
}

// chained applies splitters in turn, each to every piece of the one before, as a
// Sequence of Split pre-tokenizers does (DeepSeek V3: digits, then CJK runs, then
// its word pattern).
type chained []splitter

// chain appends next to first (which may be nil or a chain already).
func chain(first, next splitter) splitter {
	switch f := first.(type) {
	case nil:
		return next
	case chained:
		return append(f[:len(f):len(f)], next)
	default:
		return chained{first, next}
	}
}

func (c chained) split(s string, emit func(string)) {
	if len(c) == 1 {
		c[0].split(s, emit)
		return
	}
	rest := c[1:]
	c[0].split(s, func(piece string) { rest.split(piece, emit) })
}

// regexSplitter is the fallback for any other Split pattern (behavior
// Isolated): every match and every gap between matches is a piece.
type regexSplitter struct {
	re *regexp2.Regexp
}

func newRegexSplitter(pattern string) (*regexSplitter, error) {
	re, err := regexp2.Compile(widenCategories(pattern), regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("compile split pattern %q: %w", pattern, err)
	}
	return &regexSplitter{re: re}, nil
}

func (rs *regexSplitter) split(s string, emit func(string)) {
	runes := []rune(s)
	// byteAt[k] is the byte offset of rune k; invalid bytes become U+FFFD
	// runes of width 1, so the offsets come from decoding, not from len.
	byteAt := make([]int, len(runes)+1)
	off := 0
	for k := range runes {
		byteAt[k] = off
		_, w := utf8.DecodeRuneInString(s[off:])
		off += w
	}
	byteAt[len(runes)] = len(s)
	prev := 0
	m, err := rs.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		start, end := byteAt[m.Index], byteAt[m.Index+m.Length]
		if start > prev {
			emit(s[prev:start])
		}
		if end > start {
			emit(s[start:end])
		}
		prev = end
		m, err = rs.re.FindNextMatch(m)
	}
	if prev < len(s) {
		emit(s[prev:])
	}
}

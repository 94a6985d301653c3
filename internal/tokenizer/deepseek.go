package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The three Split patterns of DeepSeek V3 and V3.1, which a Sequence pre-tokenizer applies in
// turn, each to every piece of the one before (chained): runs of up to three digits, then runs
// of CJK ideographs and kana, then words. Each is Isolated: a match and the text between two
// matches are pieces.
const (
	// PatternDeepSeekDigits cuts digits into runs of up to three.
	PatternDeepSeekDigits = `\p{N}{1,3}`
	// PatternDeepSeekCJK cuts out runs of CJK ideographs (U+4E00-U+9FA5), hiragana and katakana.
	PatternDeepSeekCJK = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
	// PatternDeepSeekWords is the word pattern: a word after ASCII punctuation, letters and marks
	// with the character before them, punctuation and symbols, and spaces as GPT-2's are.
	PatternDeepSeekWords = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
)

// isolateRuns is an Isolated Split of in+ (most 0) or in{1,most}: it emits each run of the
// characters in reports true for, cut after most of them, and each stretch of text between
// two runs. in returns the character's byte width, 1 for an invalid byte.
func isolateRuns(s string, emit func(string), most int, in func(s string, i int) (bool, int)) {
	for i := 0; i < len(s); {
		ok, w := in(s, i)
		j := i + w
		for n := 1; j < len(s) && !(ok && n == most); n++ {
			ok2, w2 := in(s, j)
			if ok2 != ok {
				break
			}
			j += w2
		}
		emit(s[i:j])
		i = j
	}
}

// deepSeekDigits implements PatternDeepSeekDigits by hand; TestScannerMatchesRegexp2 proves it
// cuts the pieces regexp2 cuts, as for the other scanners.
type deepSeekDigits struct{}

func (deepSeekDigits) split(s string, emit func(string)) { isolateRuns(s, emit, 3, numberAt) }

// numberAt reports whether s[i] begins a \p{N}, as HF's regex engine classes it.
func numberAt(s string, i int) (bool, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return c >= '0' && c <= '9', 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if unicode.IsNumber(r) {
		return true, n
	}
	cat := newerCategory(r)
	return cat != "" && cat[0] == 'N', n
}

// deepSeekCJK implements PatternDeepSeekCJK by hand.
type deepSeekCJK struct{}

func (deepSeekCJK) split(s string, emit func(string)) { isolateRuns(s, emit, 0, cjkAt) }

// cjkAt reports whether s[i] begins a character of PatternDeepSeekCJK's class.
func cjkAt(s string, i int) (bool, int) {
	if s[i] < utf8.RuneSelf {
		return false, 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return r >= 0x4e00 && r <= 0x9fa5 || r >= 0x3040 && r <= 0x30ff, n
}

// Character classes of PatternDeepSeekWords.
const (
	wordOther   = iota // none of the others: digits, controls, format characters, ...
	wordLetter         // \p{L}
	wordMark           // \p{M}
	wordPunct          // \p{P} or \p{S}
	wordSpace          // \s other than \r and \n
	wordNewline        // \r or \n
)

var asciiWordClass = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			t[c] = wordLetter
		case c == '\r' || c == '\n':
			t[c] = wordNewline
		case c == ' ' || c == '\t' || c == '\v' || c == '\f':
			t[c] = wordSpace
		case isASCIIPunct(byte(c)):
			t[c] = wordPunct
		default:
			t[c] = wordOther
		}
	}
	return t
}()

// isASCIIPunct reports whether c is in [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]: every printable
// ASCII character other than letters, digits and the space, each \p{P} or \p{S}.
func isASCIIPunct(c byte) bool {
	return c > ' ' && c < 0x7f && !(c >= '0' && c <= '9') && !(c|0x20 >= 'a' && c|0x20 <= 'z')
}

func isASCIILetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// wordClassAt returns the class and the byte width of the character at s[i]. An invalid UTF-8
// byte is one U+FFFD, a symbol, as the regex engines read it.
func wordClassAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiWordClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		return wordLetter, n
	case unicode.IsMark(r):
		return wordMark, n
	case unicode.IsPunct(r) || unicode.IsSymbol(r):
		return wordPunct, n
	case unicode.IsSpace(r):
		return wordSpace, n
	}
	switch cat := newerCategory(r); {
	case cat == "":
	case cat[0] == 'L':
		return wordLetter, n
	case cat[0] == 'M':
		return wordMark, n
	case cat[0] == 'P' || cat[0] == 'S':
		return wordPunct, n
	}
	return wordOther, n
}

// deepSeekWords implements PatternDeepSeekWords by hand, with the leftmost-first, greedy,
// backtracking semantics of the regex engines. A character no alternative matches from (a
// digit or a control before no letter) falls between matches, with its neighbours of that
// kind: they make one piece.
type deepSeekWords struct{}

func (deepSeekWords) split(s string, emit func(string)) {
	gap := -1 // where the text between matches began, or -1
	for i := 0; i < len(s); {
		j, w := deepSeekWordNext(s, i)
		if j < 0 {
			if gap < 0 {
				gap = i
			}
			i += w
			continue
		}
		if gap >= 0 {
			emit(s[gap:i])
			gap = -1
		}
		emit(s[i:j])
		i = j
	}
	if gap >= 0 {
		emit(s[gap:])
	}
}

// deepSeekWordNext returns the end of the match of PatternDeepSeekWords that starts at s[i],
// or -1 when none does, and the width of the character at s[i].
func deepSeekWordNext(s string, i int) (end, width int) {
	// Alternative 1: [ASCII punctuation][A-Za-z]+.
	if i+1 < len(s) && isASCIIPunct(s[i]) && isASCIILetter(s[i+1]) {
		j := i + 2
		for j < len(s) && isASCIILetter(s[j]) {
			j++
		}
		return j, 1
	}
	c, w := wordClassAt(s, i)
	switch c {
	case wordLetter, wordMark:
		// Alternative 2, [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+: a mark may be the optional
		// character too, but the match ends where the letters and marks do either way.
		return wordRun(s, i+w), w
	case wordPunct:
		// Alternative 3 without its space: [\p{P}\p{S}]+[\r\n]*.
		return punctRun(s, i+w), w
	case wordOther, wordSpace:
		if j := i + w; j < len(s) {
			c2, w2 := wordClassAt(s, j)
			if c2 == wordLetter || c2 == wordMark { // alternative 2 with its optional character
				return wordRun(s, j+w2), w
			}
			if s[i] == ' ' && c2 == wordPunct { // alternative 3 with its space
				return punctRun(s, j+w2), w
			}
		}
		if c == wordOther {
			return -1, w
		}
	}
	return scanSpace(s, i), w
}

// wordRun advances over [\p{L}\p{M}] from j.
func wordRun(s string, j int) int {
	for j < len(s) {
		c, w := wordClassAt(s, j)
		if c != wordLetter && c != wordMark {
			break
		}
		j += w
	}
	return j
}

// punctRun advances over [\p{P}\p{S}]*[\r\n]* from j.
func punctRun(s string, j int) int {
	for j < len(s) {
		c, w := wordClassAt(s, j)
		if c != wordPunct {
			break
		}
		j += w
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
		j++
	}
	return j
}

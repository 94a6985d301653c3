package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Character kinds of PatternO200k, whose word alternatives tell letters apart by case and
// count combining marks as letters of either case.
const (
	kindOther    = iota // [^\s\p{L}\p{N}] but not a mark
	kindUpper           // \p{Lu}, \p{Lt}
	kindLower           // \p{Ll}
	kindCaseless        // \p{Lm}, \p{Lo}: letters of either word class
	kindMark            // \p{M}: in either word class, yet not \p{L}
	kindNumber          // \p{N}
	kindSpace           // \s other than \r and \n
	kindNewline         // \r or \n
)

var asciiKind = func() (t [utf8.RuneSelf]uint8) {
	for c := 0; c < utf8.RuneSelf; c++ {
		switch {
		case c >= 'a' && c <= 'z':
			t[c] = kindLower
		case c >= 'A' && c <= 'Z':
			t[c] = kindUpper
		case c >= '0' && c <= '9':
			t[c] = kindNumber
		case c == '\r' || c == '\n':
			t[c] = kindNewline
		case c == ' ' || c == '\t' || c == '\v' || c == '\f':
			t[c] = kindSpace
		default:
			t[c] = kindOther
		}
	}
	return t
}()

// kindAt returns the kind and the byte width of the character at s[i]. Invalid UTF-8 bytes
// count as one-byte kindOther characters, as classAt counts them.
func kindAt(s string, i int) (uint8, int) {
	c := s[i]
	if c < utf8.RuneSelf {
		return asciiKind[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		switch {
		case unicode.IsLower(r):
			return kindLower, n
		case unicode.IsUpper(r) || unicode.IsTitle(r):
			return kindUpper, n
		}
		return kindCaseless, n
	case unicode.IsMark(r):
		return kindMark, n
	case unicode.IsNumber(r):
		return kindNumber, n
	case unicode.IsSpace(r):
		return kindSpace, n
	}
	switch cat := newerCategory(r); {
	case cat == "":
	case cat == "Ll":
		return kindLower, n
	case cat == "Lu" || cat == "Lt":
		return kindUpper, n
	case cat[0] == 'L':
		return kindCaseless, n
	case cat[0] == 'M':
		return kindMark, n
	case cat[0] == 'N':
		return kindNumber, n
	}
	return kindOther, n
}

// inUpperWord is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], inLowerWord [\p{Ll}\p{Lm}\p{Lo}\p{M}], and
// canPrefix [^\r\n\p{L}\p{N}].
func inUpperWord(k uint8) bool { return k == kindUpper || k == kindCaseless || k == kindMark }
func inLowerWord(k uint8) bool { return k == kindLower || k == kindCaseless || k == kindMark }
func canPrefix(k uint8) bool   { return k == kindOther || k == kindMark || k == kindSpace }

// o200kScanner implements PatternO200k by hand, with the leftmost-first, greedy,
// backtracking semantics of the regex engines, as scanner does for the Qwen2 and Llama 3
// patterns. TestScannerMatchesRegexp2 proves it cuts the pieces regexp2 cuts.
type o200kScanner struct{}

func (o200kScanner) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		j := o200kNext(s, i)
		emit(s[i:j])
		i = j
	}
}

func o200kNext(s string, i int) int {
	k, w := kindAt(s, i)
	// The two word alternatives, each tried with its optional prefix character first.
	prefixed := canPrefix(k) && i+w < len(s)
	if prefixed {
		if j := lowerWord(s, i+w); j >= 0 {
			return j
		}
	}
	if j := lowerWord(s, i); j >= 0 {
		return j
	}
	if prefixed {
		if j := upperWord(s, i+w); j >= 0 {
			return j
		}
	}
	if j := upperWord(s, i); j >= 0 {
		return j
	}
	switch k {
	case kindNumber: // \p{N}{1,3}
		j := i + w
		for n := 1; n < 3 && j < len(s); n++ {
			k2, w2 := kindAt(s, j)
			if k2 != kindNumber {
				break
			}
			j += w2
		}
		return j
	case kindOther, kindMark: // [^\s\p{L}\p{N}]+[\r\n/]*
		return otherRun(s, i)
	}
	if s[i] == ' ' && i+1 < len(s) { // the same after one space
		if k2, _ := kindAt(s, i+1); k2 == kindOther || k2 == kindMark {
			return otherRun(s, i+1)
		}
	}
	return scanSpace(s, i)
}

// lowerWord matches [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ and an
// optional contraction at s[p:], returning its end, or -1. The upper-word run is greedy; when
// no lower-case letter follows it, the regex gives characters back until the lower-word part
// can begin: the match then ends after the run's last character of either class.
func lowerWord(s string, p int) int {
	q, lastEither := p, -1
	for q < len(s) {
		k, w := kindAt(s, q)
		if !inUpperWord(k) {
			break
		}
		q += w
		if inLowerWord(k) {
			lastEither = q
		}
	}
	end := lastEither
	if q < len(s) {
		if k, _ := kindAt(s, q); k == kindLower {
			end = q
			for end < len(s) {
				k2, w2 := kindAt(s, end)
				if !inLowerWord(k2) {
					break
				}
				end += w2
			}
		}
	}
	if end < 0 {
		return -1
	}
	return withContraction(s, end)
}

// upperWord matches [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* and an
// optional contraction at s[p:], returning its end, or -1.
func upperWord(s string, p int) int {
	q := p
	for q < len(s) {
		k, w := kindAt(s, q)
		if !inUpperWord(k) {
			break
		}
		q += w
	}
	if q == p {
		return -1
	}
	for q < len(s) {
		k, w := kindAt(s, q)
		if !inLowerWord(k) {
			break
		}
		q += w
	}
	return withContraction(s, q)
}

// withContraction returns the end of (?i:'s|'t|'re|'ve|'m|'ll|'d)? at s[i:].
func withContraction(s string, i int) int {
	if i < len(s) {
		i += contraction(s, i)
	}
	return i
}

// otherRun matches [^\s\p{L}\p{N}]+[\r\n/]* at s[i:], which starts with such a character.
func otherRun(s string, i int) int {
	j := i
	for j < len(s) {
		k, w := kindAt(s, j)
		if k != kindOther && k != kindMark {
			break
		}
		j += w
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || s[j] == '/') {
		j++
	}
	return j
}

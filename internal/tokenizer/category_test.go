package tokenizer

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/dlclark/regexp2"
)

// categoryNames are the two-letter general categories; a category table holds one's index
// (0: none) for every code point. Tables, not maps: the tests look at all 1.1M code points,
// under -race beside other packages' tests.
var categoryNames = []string{"", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No",
	"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co"}

// categoryIndex returns name's index in categoryNames.
func categoryIndex(t *testing.T, name string) uint8 {
	t.Helper()
	i := slices.Index(categoryNames, name)
	if i < 0 {
		t.Fatalf("no category %q", name)
	}
	return uint8(i)
}

// eachRange calls f with each line of testdata/tokenizer/name: "FIRST..LAST" in hex, and what
// follows on the line (a category, or nothing).
func eachRange(t *testing.T, name string, f func(lo, hi rune, rest string)) {
	t.Helper()
	file, err := os.Open(filepath.Join(testdataDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for line := 1; sc.Scan(); line++ {
		span, rest, _ := strings.Cut(sc.Text(), " ")
		var lo, hi rune
		if _, err := fmt.Sscanf(strings.Replace(span, "..", " ", 1), "%x %x", &lo, &hi); err != nil {
			t.Fatalf("%s line %d: %v", name, line, err)
		}
		f(lo, hi, rest)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// hfCategories reads testdata/tokenizer/hf-unicode-categories.txt: the general category HF's
// regex engine gives each code point.
func hfCategories(t *testing.T) []uint8 {
	t.Helper()
	cats := make([]uint8, unicode.MaxRune+1)
	eachRange(t, "hf-unicode-categories.txt", func(lo, hi rune, cat string) {
		i := categoryIndex(t, cat)
		for r := lo; r <= hi; r++ {
			cats[r] = i
		}
	})
	return cats
}

// goCategories is the two-letter category Go's unicode tables give each code point.
func goCategories(t *testing.T) []uint8 {
	t.Helper()
	cats := make([]uint8, unicode.MaxRune+1)
	for i, name := range categoryNames[1:] {
		table := unicode.Categories[name]
		for _, r := range table.R16 {
			for c := int(r.Lo); c <= int(r.Hi); c += int(r.Stride) {
				cats[c] = uint8(i + 1)
			}
		}
		for _, r := range table.R32 {
			for c := int(r.Lo); c <= int(r.Hi); c += int(r.Stride) {
				cats[c] = uint8(i + 1)
			}
		}
	}
	return cats
}

// eachCodePoint calls f with every code point but the surrogates.
func eachCodePoint(f func(r rune)) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if r < 0xD800 || r > 0xDFFF {
			f(r)
		}
	}
}

// TestCategoriesAreHFs: with newerCategories over Go's tables, every code point has the general
// category HF's regex engine gives it, and the scanners' character classes follow.
func TestCategoriesAreHFs(t *testing.T) {
	t.Parallel()
	if unicode.Version != "15.0.0" {
		t.Fatalf("Go's unicode tables are %s, and newerCategories was derived against 15.0.0", unicode.Version)
	}
	hf, goCats := hfCategories(t), goCategories(t)
	var wrong []string
	eachCodePoint(func(r rune) {
		want := categoryNames[hf[r]]
		got := newerCategory(r)
		if got == "" {
			got = categoryNames[goCats[r]]
		}
		s := string(r)
		cls, _ := classAt(s, 0)
		kind, _ := kindAt(s, 0)
		wantCls, wantKind := expectedClass(r, want)
		if got != want || cls != wantCls || kind != wantKind {
			wrong = append(wrong, fmt.Sprintf("U+%04X: category %q class %d kind %d, HF's %q class %d kind %d",
				r, got, cls, kind, want, wantCls, wantKind))
		}
	})
	if len(wrong) > 0 {
		t.Errorf("%d code points differ from HF's categories, first %s", len(wrong), strings.Join(wrong[:min(len(wrong), 10)], "\n"))
	}
}

// expectedClass returns the scanner class and the o200k kind of a character of category cat.
func expectedClass(r rune, cat string) (cls, kind uint8) {
	switch {
	case r == '\r' || r == '\n':
		return clsNewline, kindNewline
	case unicode.IsSpace(r):
		return clsSpace, kindSpace
	case cat == "":
		return clsOther, kindOther
	case cat == "Ll":
		return clsLetter, kindLower
	case cat == "Lu" || cat == "Lt":
		return clsLetter, kindUpper
	case cat[0] == 'L':
		return clsLetter, kindCaseless
	case cat[0] == 'M':
		return clsOther, kindMark
	case cat[0] == 'N':
		return clsNumber, kindNumber
	}
	return clsOther, kindOther
}

// TestWidenedCategoriesAreHFs: a Split pattern's \p{X} and \P{X}, which regexp2 reads from Go's
// tables, hold what HF's hold; in a character class, as much as a class can (see
// widenCategories).
func TestWidenedCategoriesAreHFs(t *testing.T) {
	t.Parallel()
	hf := hfCategories(t)
	// Every character newerCategories names and its neighbours, and a sample of the rest.
	var probe []rune
	for _, c := range newerCategories {
		for r := c.lo - 1; r <= c.hi+1; r++ {
			probe = append(probe, r)
		}
	}
	eachCodePoint(func(r rune) {
		if r%499 == 0 {
			probe = append(probe, r)
		}
	})
	names := []string{"L", "Lu", "Ll", "Lt", "Lm", "Lo", "LC", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
		"P", "Pd", "Po", "Ps", "S", "Sm", "So", "Sk", "Z", "Zs", "C", "Cc", "Cf", "Co", "Cn"}
	for _, name := range names {
		inHF := func(r rune) bool {
			if cat := categoryNames[hf[r]]; cat != "" {
				return inCategory(cat, name)
			}
			return name == "C" || name == "Cn" // HF's \p{C} holds the unassigned, as Go's does
		}
		inGo := func(r rune) bool { return unicode.Is(unicode.Categories[name], r) }
		for _, form := range []struct {
			pattern string
			want    func(r rune) bool
		}{
			{`\p{` + name + `}`, inHF},
			{`\P{` + name + `}`, func(r rune) bool { return !inHF(r) }},
			// In a class, what HF's tables take out of a category stays in it (U+1171E in
			// [\p{Mn}], the new characters in [\p{C}]), and HF's new characters stay in [\P{X}].
			{`[\p{` + name + `}]`, func(r rune) bool { return inHF(r) || inGo(r) }},
			{`[^\P{` + name + `}]`, func(r rune) bool { return inHF(r) && inGo(r) }},
		} {
			re := regexp2.MustCompile(`^`+widenCategories(form.pattern)+`$`, regexp2.None)
			bad := 0
			for _, r := range probe {
				if r < 0 || r > unicode.MaxRune || r >= 0xD800 && r <= 0xDFFF {
					continue
				}
				got, err := re.MatchString(string(r))
				if err != nil {
					t.Fatal(err)
				}
				if want := form.want(r); got != want {
					if bad++; bad <= 3 {
						t.Errorf("%s matches U+%04X (HF's %q): %v, want %v", form.pattern, r, categoryNames[hf[r]], got, want)
					}
				}
			}
		}
	}
}

// TestWidenCategoriesReadsThePattern: the rewrite tells escapes, classes, a ']' first in a
// class and a subtraction apart, so each category is widened where it stands and nothing else
// changes. U+10D4A is a letter HF knows and Go's tables do not.
func TestWidenCategoriesReadsThePattern(t *testing.T) {
	t.Parallel()
	const garay = "\U00010D4A"
	for _, c := range []struct {
		pattern string
		text    string
		want    bool
	}{
		{`^\p{L}$`, garay, true},
		{`^\P{L}$`, garay, false},
		{`^\\p{L}$`, `\p{L}`, true}, // an escaped backslash, then text
		{`^\\p{L}$`, garay, false},
		{`^[]\p{L}]$`, garay, true}, // ']' first in a class is a character
		{`^[]\p{L}]$`, "]", true},
		{`^[^]\p{L}]$`, garay, false},
		{`^[^]\p{L}]$`, "x", false},
		{`^[^]\p{L}]$`, "1", true},
		{`^[\]\p{L}]$`, garay, true},
		{`^[\d-[\p{L}]]$`, "1", true}, // a subtraction: digits but not letters
		{`^[\p{N}\p{L}-[\p{L}]]$`, garay, false},
		{`^[a\-[\p{L}]\p{L}$`, "[" + garay, true}, // an escaped '-' is no subtraction: '[' is a character
		{`^[a\-[\p{L}]\p{L}$`, garay + garay, true},
		{`^\p{Greek}$`, "α", true}, // scripts stay as they are
		// What a class gains goes first in it, so no '-' beside the escape makes a range of it.
		{`^[\p{P}-z]+$`, "-z!\U0001E5FF", true},
		{`^[\p{P}-z]+$`, "y", false},
		{`^[\p{M}-.]+$`, ".-\u0897", true},
		{`^[\p{P}-\p{S}]+$`, "-!+\U0001CC00\U0001E5FF", true},
		{`^[]-a]$`, "_", true}, // a ']' first, written \], still begins a range
		{"(?x) ^ a # a comment's [ opens nothing\n \\P{Mn} $", "ab", true},
		{`^\c[\p{L}$`, "\x1b" + garay, true}, // \c[ is ESC, no class
		// Only an option group turns (?x) on: not a look-ahead, a name or a comment holding x.
		{`^(?!\x7f)#\p{L}+$`, "#a" + garay, true},
		{`^(?<ax>0x)|^#\p{L}+$`, "#a" + garay, true},
		{`^(?#[x)#\p{L}+$`, "#a" + garay, true},
		{"(?x) ^ # a comment\n (?-x)#\\p{L}+$", "#a" + garay, true},
		{`^[^\r\n\p{L}\p{N}]?\p{L}+$`, " " + garay + garay, true},
	} {
		re, err := regexp2.Compile(widenCategories(c.pattern), regexp2.None)
		if err != nil {
			t.Errorf("%s: %v", c.pattern, err)
			continue
		}
		if got, _ := re.MatchString(c.text); got != c.want {
			t.Errorf("%s matches %q: %v, want %v", c.pattern, c.text, got, c.want)
		}
	}
	if got := widenCategories(`\p{Zs}\s+(?!\S)`); got != `\p{Zs}\s+(?!\S)` {
		t.Errorf("a pattern with no category HF's tables change was rewritten to %q", got)
	}
}

// TestSingleWordBoundaryIsHFs: isWordRune, which decides where a single_word added token may
// match, takes for a word character what HF does, on every code point
// (testdata/tokenizer/hf-word-chars.txt, HF's answers).
func TestSingleWordBoundaryIsHFs(t *testing.T) {
	t.Parallel()
	hf := make([]bool, unicode.MaxRune+1)
	eachRange(t, "hf-word-chars.txt", func(lo, hi rune, _ string) {
		for r := lo; r <= hi; r++ {
			hf[r] = true
		}
	})
	var wrong []string
	eachCodePoint(func(r rune) {
		if isWordRune(r) != hf[r] {
			wrong = append(wrong, fmt.Sprintf("U+%04X: %v, HF's %v", r, isWordRune(r), hf[r]))
		}
	})
	if len(wrong) > 0 {
		t.Errorf("%d code points are word characters where HF's are not, or the other way round; first %s", len(wrong), strings.Join(wrong[:min(len(wrong), 10)], "\n"))
	}
	// As the tokenizer uses it: a single_word token after a combining mark is inside a word.
	tok, err := Parse(qwen3JSONWith(t, nil, addedTok(151669, "kqz", "single_word")))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		text string
		want []int
	}{ // HF's ids
		{"e\u0301kqz", []int{74373, 80, 89}},
		{"\u093Fkqz", []int{38851, 74, 80, 89}},
		{"\U00010D4Akqz", []int{123934, 113, 232, 74, 80, 89}},
		{"kqz\U0002EBF0", []int{74, 80, 89, 172, 106, 107, 108}},
		{"x kqz", []int{87, 220, 151669}},
	} {
		if got := tok.Encode(c.text); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%+q) = %v, HF's %v", c.text, got, c.want)
		}
	}
}

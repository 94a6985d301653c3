package tokenizer

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Go's unicode package has Unicode 15.0.0's tables; the regex engine under HF tokenizers' Split
// patterns (Oniguruma, in tokenizers 0.22) has 16.0's. The two disagree on the general category
// of 5,813 characters: those 15.1 and 16.0 assigned (CJK Extension I, Egyptian Hieroglyphs
// Extended-A, Garay, Kirat Rai, Sunuwar, Tulu-Tigalari, Symbols for Legacy Computing
// Supplement, ...), which Go takes for unassigned, and U+1171E, which 16.0 moved from Mn to
// Mc. Without them a word in Garay or a CJK Extension I ideograph was cut where HF does not
// cut it, and gave other ids.

// newerCategories are those characters, in code point order, each with the category HF gives
// it. They were read from HF itself: testdata/tokenizer/hf-unicode-categories.txt holds HF's
// category of every code point (written by hf-unicode-categories.js beside it, through the
// oracle of testdata/tokenizer/README.md), and TestCategoriesAreHFs checks every code point
// against it. Go 1.27 moves the unicode package to 17.0, whose new characters HF lacks: the
// test then fails, and the list must be made again against the new tables.
var newerCategories = []categorized{
	{0x0897, 0x0897, "Mn"}, {0x1B4E, 0x1B4F, "Po"}, {0x1B7F, 0x1B7F, "Po"},
	{0x1C89, 0x1C89, "Lu"}, {0x1C8A, 0x1C8A, "Ll"}, {0x2427, 0x2429, "So"},
	{0x2FFC, 0x2FFF, "So"}, {0x31E4, 0x31E5, "So"}, {0x31EF, 0x31EF, "So"},
	{0xA7CB, 0xA7CC, "Lu"}, {0xA7CD, 0xA7CD, "Ll"}, {0xA7DA, 0xA7DA, "Lu"},
	{0xA7DB, 0xA7DB, "Ll"}, {0xA7DC, 0xA7DC, "Lu"}, {0x105C0, 0x105F3, "Lo"},
	{0x10D40, 0x10D49, "Nd"}, {0x10D4A, 0x10D4D, "Lo"}, {0x10D4E, 0x10D4E, "Lm"},
	{0x10D4F, 0x10D4F, "Lo"}, {0x10D50, 0x10D65, "Lu"}, {0x10D69, 0x10D6D, "Mn"},
	{0x10D6E, 0x10D6E, "Pd"}, {0x10D6F, 0x10D6F, "Lm"}, {0x10D70, 0x10D85, "Ll"},
	{0x10D8E, 0x10D8F, "Sm"}, {0x10EC2, 0x10EC4, "Lo"}, {0x10EFC, 0x10EFC, "Mn"},
	{0x11380, 0x11389, "Lo"}, {0x1138B, 0x1138B, "Lo"}, {0x1138E, 0x1138E, "Lo"},
	{0x11390, 0x113B5, "Lo"}, {0x113B7, 0x113B7, "Lo"}, {0x113B8, 0x113BA, "Mc"},
	{0x113BB, 0x113C0, "Mn"}, {0x113C2, 0x113C2, "Mc"}, {0x113C5, 0x113C5, "Mc"},
	{0x113C7, 0x113CA, "Mc"}, {0x113CC, 0x113CD, "Mc"}, {0x113CE, 0x113CE, "Mn"},
	{0x113CF, 0x113CF, "Mc"}, {0x113D0, 0x113D0, "Mn"}, {0x113D1, 0x113D1, "Lo"},
	{0x113D2, 0x113D2, "Mn"}, {0x113D3, 0x113D3, "Lo"}, {0x113D4, 0x113D5, "Po"},
	{0x113D7, 0x113D8, "Po"}, {0x113E1, 0x113E2, "Mn"}, {0x116D0, 0x116E3, "Nd"},
	{0x1171E, 0x1171E, "Mc"}, {0x11BC0, 0x11BE0, "Lo"}, {0x11BE1, 0x11BE1, "Po"},
	{0x11BF0, 0x11BF9, "Nd"}, {0x11F5A, 0x11F5A, "Mn"}, {0x13460, 0x143FA, "Lo"},
	{0x16100, 0x1611D, "Lo"}, {0x1611E, 0x16129, "Mn"}, {0x1612A, 0x1612C, "Mc"},
	{0x1612D, 0x1612F, "Mn"}, {0x16130, 0x16139, "Nd"}, {0x16D40, 0x16D42, "Lm"},
	{0x16D43, 0x16D6A, "Lo"}, {0x16D6B, 0x16D6C, "Lm"}, {0x16D6D, 0x16D6F, "Po"},
	{0x16D70, 0x16D79, "Nd"}, {0x18CFF, 0x18CFF, "Lo"}, {0x1CC00, 0x1CCEF, "So"},
	{0x1CCF0, 0x1CCF9, "Nd"}, {0x1CD00, 0x1CEB3, "So"}, {0x1E5D0, 0x1E5ED, "Lo"},
	{0x1E5EE, 0x1E5EF, "Mn"}, {0x1E5F0, 0x1E5F0, "Lo"}, {0x1E5F1, 0x1E5FA, "Nd"},
	{0x1E5FF, 0x1E5FF, "Po"}, {0x1F8B2, 0x1F8BB, "So"}, {0x1F8C0, 0x1F8C1, "So"},
	{0x1FA89, 0x1FA89, "So"}, {0x1FA8F, 0x1FA8F, "So"}, {0x1FABE, 0x1FABE, "So"},
	{0x1FAC6, 0x1FAC6, "So"}, {0x1FADC, 0x1FADC, "So"}, {0x1FADF, 0x1FADF, "So"},
	{0x1FAE9, 0x1FAE9, "So"}, {0x1FBCB, 0x1FBEF, "So"}, {0x2EBF0, 0x2EE5D, "Lo"},
}

// newerPages marks the pages of 256 code points that hold a character of newerCategories: the
// scanners ask newerCategory about every character Go's tables call other (punctuation,
// symbols, emoji), and the search made text full of them a third slower.
var newerPages = func() (pages [(unicode.MaxRune + 1) >> 8 >> 6]uint64) {
	for _, c := range newerCategories {
		for page := c.lo >> 8; page <= c.hi>>8; page++ {
			pages[page>>6] |= 1 << (page & 63)
		}
	}
	return pages
}()

// categorized is the code points lo to hi, both included, of the general category cat.
type categorized struct {
	lo, hi rune
	cat    string
}

// newerCategory returns the category HF's regex engine gives r when it is not the one Go's
// unicode tables give (see newerCategories), or "" when the two agree.
func newerCategory(r rune) string {
	if r < newerCategories[0].lo || r > newerCategories[len(newerCategories)-1].hi {
		return ""
	}
	if page := r >> 8; newerPages[page>>6]&(1<<(page&63)) == 0 {
		return "" // most characters: CJK punctuation, most emoji, ...
	}
	i, found := slices.BinarySearchFunc(newerCategories, r, func(c categorized, r rune) int {
		return compareRange(c.lo, c.hi, r)
	})
	if !found {
		return ""
	}
	return newerCategories[i].cat
}

// inCategory reports whether the two-letter category cat is in the category name of a
// regex's \p{name}: cat itself, its one-letter major class, or LC (Lu, Ll and Lt).
func inCategory(cat, name string) bool {
	switch len(name) {
	case 1:
		return cat[0] == name[0]
	case 2:
		return cat == name || name == "LC" && (cat == "Lu" || cat == "Ll" || cat == "Lt")
	}
	return false
}

// widenCategories rewrites the general categories in a regexp2 pattern (\p{L}, \P{Lu}, ...) so
// that each holds what HF's does, since regexp2 reads Go's tables: the characters
// newerCategories puts in the category are added to it, and those it moves out are taken out.
// Outside a character class, \p{X} becomes [\p{X}added-[removed]] and \P{X} becomes
// [\P{X}removed-[added]]. Inside one, a subtraction could only end the whole class, so \p{X}
// gains its added characters and \P{X} its removed ones, and no more: [\p{Mn}] still holds
// U+1171E, and [\P{Lu}] the new capitals. What a class gains goes first in it, ended by
// \p{Cs} (surrogates, which no text holds), so that no '-' written before or after the escape
// makes a range of it: [\p{P}-z] stays punctuation, '-' or 'z'. A ']' first in a class is
// written \] for that. Scripts, blocks and every other escape are left as they are, and so are
// comments: (?#...), and those of (?x), which is taken to last until a (?-x) (not only to the
// end of the group it opens).
func widenCategories(pattern string) string {
	out := make([]byte, 0, len(pattern))
	type class struct {
		at    int    // where in out the class's items begin: what it gains goes there
		gains string // the items its categories gain
	}
	var classes []class // the classes open, innermost last: [a-[b]] nests one in another
	dash := false       // the last character was a '-' in a class, not escaped
	comments := false   // (?x) was seen: '#' outside a class begins a comment
	for i := 0; i < len(pattern); {
		c := pattern[i]
		subtracted := dash
		dash = false
		inClass := len(classes) > 0
		switch {
		case c == '\\' && i+1 < len(pattern):
			if name, n := categoryEscape(pattern[i:]); n > 0 {
				negated := pattern[i+1] == 'P'
				if inClass {
					out = append(out, pattern[i:i+n]...)
					keep, _ := categoryChanges(name, negated)
					classes[len(classes)-1].gains += keep
				} else {
					out = append(out, widenedCategory(name, negated)...)
				}
				i += n
				continue
			}
			_, w := utf8.DecodeRuneInString(pattern[i+1:])
			n := 1 + w
			if pattern[i+1] == 'c' && i+2 < len(pattern) {
				n++ // \cX: X names a control character, and is no class or group
			}
			out = append(out, pattern[i:min(i+n, len(pattern))]...)
			i += n
			continue
		case c == '[' && (!inClass || subtracted):
			out = append(out, '[')
			i++
			if i < len(pattern) && pattern[i] == '^' {
				out = append(out, '^')
				i++
			}
			classes = append(classes, class{at: len(out)})
			if i < len(pattern) && pattern[i] == ']' { // a ']' first in a class is a character
				out = append(out, `\]`...)
				i++
			}
			continue
		case c == ']' && inClass:
			top := classes[len(classes)-1]
			classes = classes[:len(classes)-1]
			if top.gains != "" {
				out = slices.Insert(out, top.at, []byte(top.gains+`\p{Cs}`)...)
			}
		case c == '-' && inClass:
			dash = true
		case c == '(' && !inClass && strings.HasPrefix(pattern[i:], "(?#"):
			end := strings.IndexByte(pattern[i:], ')') // an inline comment: nothing in it counts
			if end < 0 {
				end = len(pattern) - i - 1
			}
			out = append(out, pattern[i:i+end+1]...)
			i += end + 1
			continue
		case c == '(' && !inClass && strings.HasPrefix(pattern[i:], "(?"):
			// Only a group of option letters, (?x) or (?i-x:, sets or clears x: not (?!, (?<name>.
			if n := strings.IndexAny(pattern[i+2:], ":)"); n >= 0 {
				flags := pattern[i+2 : i+2+n]
				if strings.Trim(flags, "imnsx-") == "" {
					on, off, _ := strings.Cut(flags, "-")
					comments = (comments || strings.Contains(on, "x")) && !strings.Contains(off, "x")
				}
			}
		case c == '#' && !inClass && comments:
			end := strings.IndexByte(pattern[i:], '\n')
			if end < 0 {
				end = len(pattern) - i - 1
			}
			out = append(out, pattern[i:i+end+1]...)
			i += end + 1
			continue
		}
		out = append(out, c)
		i++
	}
	return string(out)
}

// categoryEscape returns the category name of a \p{name} or \P{name} that s begins with and
// the escape's length, or n 0 when s begins with no such escape of a general category.
func categoryEscape(s string) (name string, n int) {
	if len(s) < 4 || s[0] != '\\' || (s[1] != 'p' && s[1] != 'P') || s[2] != '{' {
		return "", 0
	}
	end := strings.IndexByte(s, '}')
	if end < 0 {
		return "", 0
	}
	name = s[3:end]
	if unicode.Categories[name] == nil {
		return "", 0
	}
	return name, end + 1
}

// widenedCategory writes \p{name} (\P{name} when negated), standing outside a class, with
// the characters newerCategories adds to or takes from it; see widenCategories.
func widenedCategory(name string, negated bool) string {
	escape := `\p{` + name + `}`
	if negated {
		escape = `\P{` + name + `}`
	}
	keep, drop := categoryChanges(name, negated)
	switch {
	case keep == "" && drop == "":
		return escape
	case drop == "":
		return "[" + escape + keep + "]"
	}
	return "[" + escape + keep + "-[" + drop + "]]"
}

// categoryChanges returns, as class items, the characters newerCategories adds to \p{name}
// (keep) and those it takes from it (drop); negated, the other way round, for \P{name}.
func categoryChanges(name string, negated bool) (keep, drop string) {
	table := unicode.Categories[name]
	var added, removed classItems
	for _, c := range newerCategories {
		inHF := inCategory(c.cat, name)
		for r := c.lo; r <= c.hi; r++ {
			switch inGo := unicode.Is(table, r); {
			case inHF && !inGo:
				added.add(r)
			case inGo && !inHF:
				removed.add(r)
			}
		}
	}
	if negated {
		return removed.String(), added.String()
	}
	return added.String(), removed.String()
}

// classItems writes code points, added in increasing order, as the items of a character
// class: a run of three or more as first-last.
type classItems struct {
	b      strings.Builder
	lo, hi rune
	open   bool
}

func (c *classItems) add(r rune) {
	if c.open && r == c.hi+1 {
		c.hi = r
		return
	}
	c.flush()
	c.lo, c.hi, c.open = r, r, true
}

func (c *classItems) flush() {
	if !c.open {
		return
	}
	c.b.WriteRune(c.lo)
	if c.hi > c.lo+1 {
		c.b.WriteByte('-')
	}
	if c.hi > c.lo {
		c.b.WriteRune(c.hi)
	}
	c.open = false
}

// String returns the items written.
func (c *classItems) String() string {
	c.flush()
	return c.b.String()
}

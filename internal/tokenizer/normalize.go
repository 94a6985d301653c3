package tokenizer

import (
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// normalizeAsHF applies the Unicode normalization form f as HF tokenizers does, whose
// normalizers (unicode-normalization-alignments 0.1.12) differ from golang.org/x/text's in two
// ways:
//
//   - x/text writes the Stream-Safe Text Format: after 30 non-starters in a row it inserts
//     U+034F COMBINING GRAPHEME JOINER, and reorders only within each run of 30. HF sorts a
//     run of any length and inserts nothing, so Zalgo text or 41 Thai tone marks in a row
//     were encoded with extra tokens.
//   - HF's tables are Unicode 9.0's: the characters that later versions gave a combining
//     class or a decomposition (unknownToHF) are, for HF, starters without one.
//
// Most text needs neither: x/text's result is taken unless it changed the text and the text
// holds such a run, or either holds such a character. Then ownNormalization does it as HF
// does.
func normalizeAsHF(f norm.Form, s string) string {
	out := f.String(s)
	if out == s { // x/text found it normal (and so would HF: see holdsUnknownToHF)
		return out
	}
	// A character HF does not know may be in the text, or be what x/text composed it to.
	if strings.Count(out, graphemeJoiner) == strings.Count(s, graphemeJoiner) && !holdsUnknownToHF(s) && !holdsUnknownToHF(out) {
		return out
	}
	return ownNormalization(f, s)
}

// graphemeJoiner is U+034F, which x/text inserts into a long run of non-starters.
const graphemeJoiner = "\u034f"

// holdsUnknownToHF reports whether s holds a character of unknownToHF. Text that x/text leaves
// unchanged needs no check: treating such a character as a starter without a decomposition
// only blocks reordering and composition, so HF leaves that text unchanged too.
func holdsUnknownToHF(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0xdf { // ASCII, a continuation byte, or the lead byte of a character below U+07C0
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if unknownToHF(r) {
			return true
		}
		i += size - 1
	}
	return false
}

// unknownToHF reports whether HF's Unicode 9.0 normalization tables lack r's combining class
// or decomposition (see unknownToHFRanges).
func unknownToHF(r rune) bool {
	_, found := slices.BinarySearchFunc(unknownToHFRanges, r, func(rg runeRange, r rune) int {
		return compareRange(rg.lo, rg.hi, r)
	})
	return found
}

// compareRange orders the range lo..hi against r for a binary search over sorted ranges: -1
// when the range lies below r, 1 above it, 0 when it holds r.
func compareRange(lo, hi, r rune) int {
	switch {
	case hi < r:
		return -1
	case lo > r:
		return 1
	}
	return 0
}

// runeRange is the code points lo to hi, both included.
type runeRange struct{ lo, hi rune }

// unknownToHFRanges are the characters that have a combining class, a canonical or a
// compatibility decomposition in Unicode 15.0 (golang.org/x/text's tables), but none in HF
// tokenizers' Unicode 9.0 tables: characters assigned after 9.0. Normalization's stability
// policy means these are the only differences. The list was made by asking HF itself (the
// oracle of testdata/tokenizer/README.md) about every such character of 15.0: for a
// combining class, whether "x" + it + U+0334 and "x" + U+0334 + it give the same ids (U+0301
// on the other side for class 1); for a decomposition, whether it and its decomposition do.
// testdata/tokenizer/qwen3-nfc-golden.jsonl.zst and qwen3-nfkc-golden.jsonl.zst hold those
// questions, with HF's answers. x/text picks its tables by Go release (17.0 from Go 1.27): the
// list holds only against 15.0's, which TestNormalizationTablesAreTheOnesCompared checks.
var unknownToHFRanges = []runeRange{
	{0x07FD, 0x07FD}, {0x0898, 0x089F}, {0x08CA, 0x08D3}, {0x09FE, 0x09FE}, {0x0C3C, 0x0C3C},
	{0x0D3B, 0x0D3C}, {0x0EBA, 0x0EBA}, {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA},
	{0x32FF, 0x32FF}, {0xA7F2, 0xA7F4}, {0xA82C, 0xA82C}, {0xAB69, 0xAB69}, {0x10781, 0x10785},
	{0x10787, 0x107B0}, {0x107B2, 0x107BA}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC},
	{0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070},
	{0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x11938, 0x11938},
	{0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34},
	{0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45},
	{0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E030, 0x1E06D},
	{0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
	{0x1E4EC, 0x1E4EF}, {0x1F16C, 0x1F16C}, {0x1FBF0, 0x1FBF9},
}

// classified is a character with its canonical combining class, as HF's tables give it.
type classified struct {
	r   rune
	ccc uint8
}

// ownNormalization is the normalization form f as Unicode defines it (UAX #15), with HF's
// Unicode 9.0 view of the characters in unknownToHFRanges: full decomposition, canonical
// ordering of every run of non-starters however long (a stable sort, as HF does), then, for
// the composed forms, canonical composition. x/text serves for each character's decomposition
// and class and for each pair's composition, where no run of non-starters arises.
func ownNormalization(f norm.Form, s string) string {
	decompose := norm.NFD
	if f == norm.NFKC || f == norm.NFKD {
		decompose = norm.NFKD
	}
	cs := make([]classified, 0, len(s))
	for _, r := range s {
		if unknownToHF(r) {
			cs = append(cs, classified{r, 0})
			continue
		}
		for _, d := range decompose.String(string(r)) {
			cs = append(cs, classified{d, norm.NFD.PropertiesString(string(d)).CCC()})
		}
	}
	for i := 0; i < len(cs); {
		if cs[i].ccc == 0 {
			i++
			continue
		}
		j := i + 1
		for j < len(cs) && cs[j].ccc != 0 {
			j++
		}
		slices.SortStableFunc(cs[i:j], func(a, b classified) int { return int(a.ccc) - int(b.ccc) })
		i = j
	}
	if f == norm.NFC || f == norm.NFKC {
		cs = compose(cs)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, c := range cs {
		b.WriteRune(c.r)
	}
	return b.String()
}

// compose is canonical composition (UAX #15 D117) of decomposed, canonically ordered cs, in
// place: each character that is not blocked from the last starter and forms a primary
// composite with it replaces it.
func compose(cs []classified) []classified {
	out := cs[:0]
	starter := -1 // index in out of the last starter, -1 before the first
	lastCCC := -1 // class of the last character after that starter, -1 for none
	for _, c := range cs {
		// In canonical order the last character after the starter has the highest class of
		// those after it, so it alone tells whether c is blocked.
		if starter >= 0 && (lastCCC == -1 || (lastCCC != 0 && lastCCC < int(c.ccc))) {
			if p, ok := primaryComposite(out[starter].r, c.r); ok {
				out[starter].r = p
				continue
			}
		}
		if c.ccc == 0 {
			starter, lastCCC = len(out), -1
		} else {
			lastCCC = int(c.ccc)
		}
		out = append(out, c)
	}
	return out
}

// primaryComposite returns the character that a and b compose to, if HF's tables have it.
func primaryComposite(a, b rune) (rune, bool) {
	s := norm.NFC.String(string(a) + string(b))
	r, size := utf8.DecodeRuneInString(s)
	if size != len(s) || unknownToHF(r) {
		return 0, false
	}
	return r, true
}

package tokenizer

import (
	"sort"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens in text the way HF's AddedVocabulary does:
// leftmost-longest, non-overlapping matches (Aho-Corasick LeftmostLongest),
// then the single_word, lstrip and rstrip rules.
type addedMatcher struct {
	tokens  map[string]*addedToken
	lengths [256][]int // per first byte: token lengths, longest first
	first   [256]bool
}

func newAddedMatcher(toks []*addedToken) *addedMatcher {
	if len(toks) == 0 {
		return nil
	}
	m := &addedMatcher{tokens: make(map[string]*addedToken, len(toks))}
	for _, t := range toks {
		if t.Content == "" {
			continue
		}
		if _, dup := m.tokens[t.Content]; dup {
			continue
		}
		m.tokens[t.Content] = t
		b := t.Content[0]
		m.first[b] = true
		m.lengths[b] = append(m.lengths[b], len(t.Content))
	}
	for b := range m.lengths {
		l := m.lengths[b]
		sort.Sort(sort.Reverse(sort.IntSlice(l)))
		// dedupe
		out := l[:0]
		for i, v := range l {
			if i == 0 || v != l[i-1] {
				out = append(out, v)
			}
		}
		m.lengths[b] = out
	}
	return m
}

// segment is a piece of input: either an added token (tok != nil) or text
// that still goes through normalization and BPE.
type segment struct {
	text string
	tok  *addedToken
}

// split cuts s into text and added-token segments. skipSpecial leaves special
// tokens as text (HF's encode_special_tokens / split_special_tokens).
func (m *addedMatcher) split(s string, skipSpecial bool, emit func(segment)) {
	if m == nil {
		if s != "" {
			emit(segment{text: s})
		}
		return
	}
	start := 0 // end of the previous match
	for i := 0; i < len(s); {
		if !m.first[s[i]] {
			i++
			continue
		}
		var tok *addedToken
		for _, l := range m.lengths[s[i]] {
			if i+l <= len(s) {
				if t, ok := m.tokens[s[i:i+l]]; ok {
					tok = t
					break
				}
			}
		}
		if tok == nil {
			i++
			continue
		}
		mStart, mEnd := i, i+len(tok.Content)
		if skipSpecial && tok.Special {
			i = mEnd
			continue
		}
		if tok.SingleWord {
			startOK := mStart == 0 || !endsWithWord(s[:mStart])
			endOK := mEnd == len(s) || !startsWithWord(s[mEnd:])
			if !startOK || !endOK {
				i = mEnd
				continue
			}
		}
		if tok.LStrip {
			for mStart > start {
				r, w := utf8.DecodeLastRuneInString(s[:mStart])
				if !unicode.IsSpace(r) {
					break
				}
				mStart -= w
			}
		}
		next := mEnd // HF's scan goes on from the token's own end, not after what rstrip takes
		if tok.RStrip {
			for mEnd < len(s) {
				r, w := utf8.DecodeRuneInString(s[mEnd:])
				if !unicode.IsSpace(r) {
					break
				}
				mEnd += w
			}
		}
		if mStart > start {
			emit(segment{text: s[start:mStart]})
		}
		emit(segment{text: s[mStart:mEnd], tok: tok})
		// A token found in the whitespace rstrip took (" <sp>" after "<r>" and a space) is
		// still emitted, as HF's Aho-Corasick scan finds it.
		start, i = mEnd, next
	}
	if start < len(s) {
		emit(segment{text: s[start:]})
	}
}

// isWordRune reports whether r is a word character where HF looks for a single_word token's
// boundaries: the Rust regex crate's \w (Alphabetic, marks, decimal digits, connector
// punctuation, the joiners), with HF's Unicode 16.0 categories (newerCategories). Go's letters
// and digits alone left out 7,882 of them: combining marks (the accent of an NFD "é"),
// letter numbers, "‿", and what 16.0 added.
func isWordRune(r rune) bool {
	if cat := newerCategory(r); cat != "" {
		return cat[0] == 'L' || cat[0] == 'M' || cat == "Nd" || cat == "Nl" || cat == "Pc"
	}
	return unicode.In(r, unicode.L, unicode.M, unicode.Nd, unicode.Nl, unicode.Pc, unicode.Other_Alphabetic, unicode.Join_Control)
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return isWordRune(r)
}

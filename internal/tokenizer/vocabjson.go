package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// The model's vocab and merges are nine tenths of a tokenizer.json (Qwen3: 151,643 tokens and
// 151,387 merges). Decoded by encoding/json into a map[string]int32 and a [][2]string, they
// were 450,000 strings and two maps, all garbage once the tables of vocab.go were built:
// loading Qwen3 allocated 80 MB, and a process that only loaded it peaked at 65 MB resident
// (a worker's peak for its whole life), where the tokenizer then holds 11. So encoding/json checks the whole file and decodes the small
// parts, and hands these two over as spans of the input, which the readers below go through
// once, straight into the tables.

// jsonSpan is a JSON value kept as a slice of the input it was decoded from, not a copy (as
// json.RawMessage would be). Parse owns its input and reads spans only while it runs.
type jsonSpan []byte

// UnmarshalJSON keeps b, a slice of the input of json.Unmarshal.
func (s *jsonSpan) UnmarshalJSON(b []byte) error {
	*s = b
	return nil
}

// jsonReader reads the values of a span that encoding/json has already found to be valid
// JSON; it still checks every byte it relies on, so that no input can make it panic.
type jsonReader struct {
	b []byte
	i int
}

// skipSpace moves past white space and reports whether anything is left.
func (r *jsonReader) skipSpace() bool {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\r', '\n':
			r.i++
		default:
			return true
		}
	}
	return false
}

// peek returns the next byte that is not white space, or 0 at the end.
func (r *jsonReader) peek() byte {
	if !r.skipSpace() {
		return 0
	}
	return r.b[r.i]
}

// accept moves past c if it is the next byte that is not white space.
func (r *jsonReader) accept(c byte) bool {
	if r.peek() != c {
		return false
	}
	r.i++
	return true
}

// isNull reports whether the value is null, and moves past it if so.
func (r *jsonReader) isNull() bool {
	if r.peek() != 'n' || len(r.b)-r.i < 4 || string(r.b[r.i:r.i+4]) != "null" {
		return false
	}
	r.i += 4
	return true
}

// endList moves past the ',' between elements or members, or the closing c; more is false
// at the closing c.
func (r *jsonReader) endList(c byte) (more bool, err error) {
	switch {
	case r.accept(','):
		return true, nil
	case r.accept(c):
		return false, nil
	}
	return false, fmt.Errorf("want ',' or '%c' at offset %d", c, r.i)
}

// appendString reads a JSON string and appends its value to dst. It decodes the one-letter
// escapes itself; a string with a \u escape or invalid UTF-8 (a few in a tokenizer.json) is
// decoded by encoding/json, so that surrogates and bad bytes come out exactly as it decodes them.
func (r *jsonReader) appendString(dst []byte) ([]byte, error) {
	if !r.accept('"') {
		return dst, fmt.Errorf("not a string at offset %d", r.i)
	}
	quote, mark := r.i-1, len(dst)
	for r.i < len(r.b) {
		c := r.b[r.i]
		switch {
		case c == '"':
			r.i++
			if !utf8.Valid(dst[mark:]) {
				return r.decodeString(dst[:mark], quote)
			}
			return dst, nil
		case c == '\\':
			if r.i+1 >= len(r.b) || oneLetterEscape[r.b[r.i+1]] == 0 {
				return r.decodeString(dst[:mark], quote)
			}
			dst = append(dst, oneLetterEscape[r.b[r.i+1]])
			r.i += 2
		case c < ' ':
			return dst, fmt.Errorf("control character in a string at offset %d", r.i)
		default:
			dst = append(dst, c)
			r.i++
		}
	}
	return dst, errors.New("unterminated string")
}

// oneLetterEscape is the byte each one-letter escape stands for (0: not one).
var oneLetterEscape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// decodeString decodes the string that starts at quote with encoding/json, appends it to dst
// and moves past it.
func (r *jsonReader) decodeString(dst []byte, quote int) ([]byte, error) {
	end := quote + 1
	for end < len(r.b) && r.b[end] != '"' {
		if r.b[end] == '\\' {
			end++
		}
		end++
	}
	if end >= len(r.b) {
		return dst, errors.New("unterminated string")
	}
	var v string
	if err := json.Unmarshal(r.b[quote:end+1], &v); err != nil {
		return dst, fmt.Errorf("bad string at offset %d: %w", quote, err)
	}
	r.i = end + 1
	return append(dst, v...), nil
}

// id reads a token id: a JSON integer from 0 to maxTokenID, which is what encoding/json
// accepted into an int32 and the range check let through before (no fraction, no exponent).
// Its errors complete a sentence that names the token.
func (r *jsonReader) id() (int32, error) {
	if !r.skipSpace() {
		return 0, errors.New("has no id")
	}
	start, neg := r.i, r.b[r.i] == '-'
	if neg {
		r.i++
	}
	n, digits := int64(0), 0
	for ; r.i < len(r.b) && '0' <= r.b[r.i] && r.b[r.i] <= '9'; r.i++ {
		if n <= maxTokenID { // past it the value is out of range anyway; stop growing
			n = n*10 + int64(r.b[r.i]-'0')
		}
		digits++
	}
	if digits == 0 || (r.i < len(r.b) && (r.b[r.i] == '.' || r.b[r.i] == 'e' || r.b[r.i] == 'E')) {
		end := r.i
		for end < len(r.b) && r.b[end] != ',' && r.b[end] != '}' && r.b[end] != ']' && end-start < 24 {
			end++
		}
		return 0, fmt.Errorf("has id %s, not an integer", r.b[start:end])
	}
	if (neg && n != 0) || n > maxTokenID {
		return 0, fmt.Errorf("has id %s, outside 0..%d", r.b[start:r.i], maxTokenID)
	}
	return int32(n), nil
}

// readVocab reads the model's vocab, an object of byte-level token strings and ids, into a
// list of each token's raw bytes and id, in the file's order. null is an empty vocab.
func readVocab(span []byte) (tokenList, error) {
	var list tokenList
	r := jsonReader{b: span}
	if r.isNull() {
		return list, nil
	}
	if !r.accept('{') {
		return list, errors.New("parse tokenizer.json: vocab is not an object")
	}
	// Raw bytes are no longer than the byte-level strings, and an entry is about 20 bytes.
	list.buf = make([]byte, 0, len(span)/2)
	list.ends = make([]uint32, 0, len(span)/20)
	list.ids = make([]int32, 0, len(span)/20)
	if r.accept('}') {
		return list, nil
	}
	var key, raw []byte
	for {
		var err error
		if key, err = r.appendString(key[:0]); err != nil {
			return list, fmt.Errorf("parse tokenizer.json vocab: %w", err)
		}
		if !r.accept(':') {
			return list, fmt.Errorf("parse tokenizer.json vocab: want ':' at offset %d", r.i)
		}
		id, err := r.id()
		if err != nil {
			return list, fmt.Errorf("parse tokenizer.json: vocab token %q %w", key, err)
		}
		raw, _ = appendByteLevelDecoded(raw[:0], key)
		list.add(raw, id)
		if more, err := r.endList('}'); err != nil || !more {
			if err != nil {
				err = fmt.Errorf("parse tokenizer.json vocab: %w", err)
			}
			return list, err
		}
	}
}

// readMerges reads the model's merges and calls merge for each, with the two byte-level
// token strings it joins (valid only during the call). It accepts both formats: "a b"
// strings (older files) and ["a", "b"] pairs (newer ones, e.g. Qwen3's), as the first merge
// has it. null is no merges.
func readMerges(span []byte, merge func(rank int, a, b []byte) error) error {
	r := jsonReader{b: span}
	if r.isNull() {
		return nil
	}
	if !r.accept('[') {
		return errors.New("parse tokenizer.json: merges is not an array")
	}
	if r.accept(']') {
		return nil
	}
	pairs := r.peek() == '['
	var a, b []byte
	for rank := 0; ; rank++ {
		var err error
		if pairs {
			a, b, err = r.pair(a[:0], b[:0])
		} else {
			a, b, err = r.spaced(a[:0], b[:0])
		}
		if err == nil {
			err = merge(rank, a, b)
		}
		if err != nil {
			return fmt.Errorf("parse tokenizer.json: merge %d %w", rank, err)
		}
		if more, err := r.endList(']'); err != nil || !more {
			if err != nil {
				err = fmt.Errorf("parse tokenizer.json merges: %w", err)
			}
			return err
		}
	}
}

// pair reads a merge written ["a", "b"] into a and b. Its errors complete a sentence that
// names the merge.
func (r *jsonReader) pair(a, b []byte) ([]byte, []byte, error) {
	if !r.accept('[') {
		return a, b, errors.New("is not a pair of strings, as the first merge is")
	}
	var err error
	if a, err = r.appendString(a); err != nil {
		return a, b, fmt.Errorf("is not a pair of strings: %w", err)
	}
	if !r.accept(',') {
		return a, b, fmt.Errorf("is not a pair of strings: want ',' at offset %d", r.i)
	}
	if b, err = r.appendString(b); err != nil {
		return a, b, fmt.Errorf("is not a pair of strings: %w", err)
	}
	if !r.accept(']') {
		return a, b, fmt.Errorf("is not a pair of strings: want ']' at offset %d", r.i)
	}
	return a, b, nil
}

// spaced reads a merge written "a b" into a and b. Its errors complete a sentence that names
// the merge.
func (r *jsonReader) spaced(a, b []byte) ([]byte, []byte, error) {
	if r.peek() != '"' {
		return a, b, errors.New("is not a string, as the first merge is")
	}
	s, err := r.appendString(a)
	if err != nil {
		return a, b, fmt.Errorf("is not a string: %w", err)
	}
	left, right, ok := bytes.Cut(s, []byte{' '})
	if !ok {
		return a, b, fmt.Errorf("%q has no space", s)
	}
	return left, append(b, right...), nil
}

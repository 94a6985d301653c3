package jobs

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file walks JSON that validJSON (json.Valid) has already accepted. Walking the bytes ourselves (rather
// than decoding into structs) lets the parser report unknown and duplicate keys in line order and
// name every field by its exact path, without allocating a map per line.

// skipWS returns the index of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index just past the string literal that starts at b[i] == '"'.
func stringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		if j = plainEnd(b, j); j >= len(b) {
			return len(b)
		}
		switch b[j] {
		case '"':
			return j + 1
		case '\\':
			j += 2
		default: // a control character: only in data that is not valid JSON
			j++
		}
	}
}

// valueEnd returns the index just past the JSON value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	default:
		for j := i; j < len(b); j++ {
			switch b[j] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return j
			}
		}
		return len(b)
	}
}

// objIter iterates over the members of a valid JSON object.
type objIter struct {
	b []byte
	i int
}

// newObjIter starts iterating over obj, which must be a valid JSON object (see isObject).
func newObjIter(obj []byte) objIter {
	i := skipWS(obj, skipWS(obj, 0)+1)
	if i < len(obj) && obj[i] == '}' {
		i = len(obj)
	}
	return objIter{b: obj, i: i}
}

// next returns the next key (unescaped) and its raw value, or ok == false at the end.
func (it *objIter) next() (key, val []byte, ok bool) {
	b, i := it.b, it.i
	if i >= len(b) {
		return nil, nil, false
	}
	kend := stringEnd(b, i)
	if kend-1 <= i { // a key cut short: only in data that is not valid JSON
		it.i = len(b)
		return nil, nil, false
	}
	key = b[i+1 : kend-1]
	if bytes.IndexByte(key, '\\') >= 0 {
		var s string
		if json.Unmarshal(b[i:kend], &s) == nil {
			key = []byte(s)
		}
	}
	i = skipWS(b, skipWS(b, kend)+1) // past ':'
	if i >= len(b) {                 // no value: only in data that is not valid JSON
		it.i = len(b)
		return nil, nil, false
	}
	vend := valueEnd(b, i)
	val = b[i:vend]
	i = skipWS(b, vend)
	if i >= len(b) || b[i] == '}' {
		it.i = len(b)
	} else {
		it.i = skipWS(b, i+1) // past ','
	}
	return key, val, true
}

// arrIter iterates over the elements of a valid JSON array.
type arrIter struct {
	b []byte
	i int
}

// newArrIter starts iterating over arr, which must be a valid JSON array (see isArray).
func newArrIter(arr []byte) arrIter {
	i := skipWS(arr, skipWS(arr, 0)+1)
	if i < len(arr) && arr[i] == ']' {
		i = len(arr)
	}
	return arrIter{b: arr, i: i}
}

// next returns the next raw element, or ok == false at the end.
func (it *arrIter) next() (val []byte, ok bool) {
	b, i := it.b, it.i
	if i >= len(b) {
		return nil, false
	}
	vend := valueEnd(b, i)
	val = b[i:vend]
	i = skipWS(b, vend)
	if i >= len(b) || b[i] == ']' {
		it.i = len(b)
	} else {
		it.i = skipWS(b, i+1)
	}
	return val, true
}

// arrayLen counts the elements of a valid JSON array.
func arrayLen(arr []byte) int {
	n := 0
	it := newArrIter(arr)
	for _, ok := it.next(); ok; _, ok = it.next() {
		n++
	}
	return n
}

func isNull(v []byte) bool   { return len(v) == 4 && string(v) == "null" }
func isObject(v []byte) bool { return len(v) > 0 && v[0] == '{' }
func isArray(v []byte) bool  { return len(v) > 0 && v[0] == '[' }
func isString(v []byte) bool { return len(v) > 0 && v[0] == '"' }
func isNumber(v []byte) bool { return len(v) > 0 && (v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) }

// jsonType names the JSON type of a raw value, for error messages.
func jsonType(v []byte) string {
	switch {
	case len(v) == 0:
		return "nothing"
	case isString(v):
		return "a string"
	case isObject(v):
		return "an object"
	case isArray(v):
		return "an array"
	case isNumber(v):
		return "a number"
	case isNull(v):
		return "null"
	default:
		return "a boolean"
	}
}

// decString decodes a JSON string value; ok is false if v is not a string, or if it escapes
// a lone surrogate (see loneSurrogate).
func decString(v []byte) (s string, ok bool) {
	if !isString(v) {
		return "", false
	}
	inner := v[1 : len(v)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return string(inner), true
	}
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false
	}
	// Lines are valid UTF-8 (checkSyntax), so U+FFFD in s was written, or was a lone surrogate.
	if strings.ContainsRune(s, utf8.RuneError) && loneSurrogate(inner) {
		return "", false
	}
	return s, true
}

// loneSurrogate reports whether the inside of a valid JSON string escapes half of a UTF-16
// surrogate pair without the other half ("\ud800", "\udc00x"). That is no character:
// encoding/json decodes it as U+FFFD, so two different strings would become one, and Python
// keeps it as a code point that no UTF-8 encoder, and so no tokenizer, accepts.
func loneSurrogate(inner []byte) bool {
	high := false // the previous escape was a high surrogate, waiting for its low half
	for i := 0; i < len(inner); i++ {
		if inner[i] != '\\' {
			if high {
				return true
			}
			continue
		}
		i++
		if inner[i] != 'u' {
			if high {
				return true
			}
			continue
		}
		r, _ := strconv.ParseUint(string(inner[i+1:i+5]), 16, 16) // valid JSON: four hex digits
		i += 4
		switch {
		case r >= 0xd800 && r < 0xdc00:
			if high {
				return true
			}
			high = true
		case r >= 0xdc00 && r < 0xe000:
			if !high {
				return true
			}
			high = false
		default:
			if high {
				return true
			}
		}
	}
	return high
}

// errNotInt and errIntRange are the two ways decInt fails.
const (
	errNotInt   = "must be an integer"
	errIntRange = "is out of range for a 64-bit integer"
)

// decInt decodes a JSON number that is written as an integer (no fraction, no exponent). On
// failure it returns one of the errNotInt / errIntRange messages.
func decInt(v []byte) (int64, string) {
	if !isNumber(v) {
		return 0, errNotInt
	}
	neg := v[0] == '-'
	digits := v
	if neg {
		digits = v[1:]
	}
	if len(digits) == 0 {
		return 0, errNotInt
	}
	var n uint64
	for i, c := range digits {
		if c < '0' || c > '9' {
			if c == '.' && len(bytes.TrimRight(digits[i+1:], "0")) == 0 {
				break // 256.0: the whole number before the point, exactly
			}
			if c == '.' || c == 'e' || c == 'E' {
				// 256.0 or 1e3: accept if the value is a whole number that fits.
				f, err := strconv.ParseFloat(string(v), 64)
				if err == nil && f == math.Trunc(f) && f >= math.MinInt64 && f < math.MaxInt64 {
					return int64(f), ""
				}
			}
			return 0, errNotInt
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, errIntRange
		}
		n = n*10 + d
	}
	if neg {
		if n > 1<<63 {
			return 0, errIntRange
		}
		return -int64(n), "" //nolint:gosec // bounded above
	}
	if n > math.MaxInt64 {
		return 0, errIntRange
	}
	return int64(n), ""
}

// decFloat decodes a JSON number.
func decFloat(v []byte) (float64, bool) {
	if !isNumber(v) {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(v), 64)
	return f, err == nil
}

// decBool decodes a JSON boolean.
func decBool(v []byte) (b, ok bool) {
	switch string(v) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

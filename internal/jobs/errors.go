package jobs

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrEmptyFile is wrapped by the error Reader.Next returns, once, at the end of an input that
// held no job line at all (nothing, or only blank lines). Test for it with errors.Is.
var ErrEmptyFile = errors.New("file has no job lines")

// FieldError is a problem with one field of a job. Field is the path of the field as it is
// spelled in the input line (for example "sampling_params.temperature", "messages[2].role" or
// "body.max_completion_tokens"; an unusual key is quoted, see keyPath); it is empty for
// problems with the line as a whole.
type FieldError struct {
	// Field is the dotted path of the offending field, or "" for the whole line.
	Field string
	// Msg says what is wrong, in lower case and without a trailing period.
	Msg string
}

// Error returns "field <path>: <msg>", or just the message when Field is empty.
func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return "field " + e.Field + ": " + e.Msg
}

// MaxExcerpt bounds the bytes of a value that Excerpt quotes.
const MaxExcerpt = 200

// Excerpt is s, a key, value or line read from outside, for an error message: quoted as
// strconv.Quote does (a line break cannot split the message, nor an escape sequence reach a
// terminal), and when s is longer than MaxExcerpt bytes, only its first ones, cut at a
// character's start, with "…" after the closing quote. A line may be hundreds of megabytes,
// and its message is printed, logged and stored.
func Excerpt[T string | []byte](s T) string {
	if len(s) <= MaxExcerpt {
		return strconv.Quote(string(s))
	}
	return strconv.Quote(string(s[:excerptEnd(s)])) + "…"
}

// Clip is s, text already quoted or escaped (another package's error about a value read from
// outside), cut as Excerpt cuts: at most MaxExcerpt bytes, at a character's start, with "…"
// after them when s is longer.
func Clip(s string) string {
	if len(s) <= MaxExcerpt {
		return s
	}
	return s[:excerptEnd(s)] + "…"
}

// excerptEnd is where Excerpt and Clip cut s, longer than MaxExcerpt bytes: at the start of
// the character that MaxExcerpt falls in. It looks back no further than a character reaches
// (utf8.UTFMax bytes): bytes that start no character are no UTF-8, each quoted on its own.
func excerptEnd[T string | []byte](s T) int {
	cut := MaxExcerpt
	for cut > MaxExcerpt-(utf8.UTFMax-1) && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if !utf8.RuneStart(s[cut]) {
		return MaxExcerpt
	}
	return cut
}

// keyPath is the path of the member key of the object at parent ("" for the line itself):
// parent.key, or key alone. A key that would not read as one key when written bare is
// quoted (strconv.Quote): an empty one (a path "" is the line's own), one with a character
// not printed as itself (a line break would split the error's line, an escape sequence
// would reach the terminal), and one with a '.', '[', ']' or '"', which a path spells. A key
// longer than MaxExcerpt bytes is quoted and cut (Excerpt): a line may hold megabytes of one.
func keyPath(parent string, key []byte) string {
	var name string
	switch {
	case len(key) > MaxExcerpt:
		name = Excerpt(key)
	case len(key) == 0 || strings.ContainsAny(string(key), `.[]"`) || strconv.Quote(string(key)) != `"`+string(key)+`"`:
		name = strconv.Quote(string(key))
	default:
		name = string(key)
	}
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// fieldErr builds a *FieldError; it exists to keep call sites short.
func fieldErr(field, msg string) *FieldError {
	return &FieldError{Field: field, Msg: msg}
}

// LineError is a bad line of a JSONL input. Its Error method reads like a compiler diagnostic:
// "prompts.jsonl:12: field sampling_params.max_tokens: must be a positive integer".
type LineError struct {
	// File is the name the Reader was given (may be empty).
	File string
	// Line is the 1-based line number in the input.
	Line int
	// Field is the path of the offending field as spelled in the line, or "" for line-level
	// problems (malformed JSON, invalid UTF-8, an oversize line).
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error formats the problem as "file:line: field path: message".
func (e *LineError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteByte(':')
	} else {
		b.WriteString("line ")
	}
	b.WriteString(strconv.Itoa(e.Line))
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString("field ")
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

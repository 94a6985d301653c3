package jobs

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestErrorsBoundTheValuesTheyQuote: an error that names a key or value of a line quotes at
// most MaxExcerpt bytes of it, cut at a character's start and marked, however long the line
// holds it (up to MaxLineBytes, 8 MiB): a line is reported on standard error and in the
// --rejects file, and a worker's invalid_job result carries the message. Before, a 1 MiB role
// or key was quoted whole, once in each of them.
func TestErrorsBoundTheValuesTheyQuote(t *testing.T) {
	long := strings.Repeat("é", 1<<19) // 1 MiB, two bytes a character
	for _, c := range []struct{ name, line, field string }{
		{"unknown key", `{"custom_id":"a","model":"m","prompt":"p","` + long + `":1}`, ""},
		{"unknown key in sampling_params", `{"custom_id":"a","model":"m","prompt":"p","sampling_params":{"` + long + `":1}}`, ""},
		{"unknown key in an OpenAI body", `{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"model":"m","prompt":"p","` + long + `":1}}`, ""},
		{"role", `{"custom_id":"a","model":"Qwen/Qwen3-8B","messages":[{"role":"` + long + `","content":"hi"}]}`, "messages[0].role"},
		{"reasoning_effort", `{"custom_id":"a","model":"openai/gpt-oss-20b","messages":[{"role":"user","content":"hi"}],"reasoning_effort":"` + long + `"}`, "reasoning_effort"},
		{"content part type", `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":[{"type":"` + long + `","text":"hi"}]}]}}`, "body.messages[0].content[0].type"},
	} {
		items, err := readString(t, c.line+"\n", Limits{})
		mustEOF(t, err)
		if len(items) != 1 || items[0].lerr == nil {
			t.Errorf("%s: %+v; want one line error", c.name, items)
			continue
		}
		le := items[0].lerr
		if msg := le.Error(); len(msg) > 2*MaxExcerpt+200 || !strings.Contains(msg, `é"…`) || !utf8.ValidString(msg) {
			t.Errorf("%s: a %d-byte error (valid UTF-8 %v), starting %.300q; want the value's first bytes, marked as cut", c.name, len(msg), utf8.ValidString(msg), msg)
		}
		if c.field != "" && le.Field != c.field {
			t.Errorf("%s: field %q, want %q", c.name, le.Field, c.field)
		}
	}

	// A job message from another producer, checked by the worker, names its format so too.
	j := Job{CustomID: "a", Model: "m", Prompt: "p", Format: long}
	if err := j.Validate(Limits{}); err == nil || len(err.Error()) > MaxExcerpt+200 {
		t.Errorf("a job of a 1 MiB format: %d bytes of error; want its first bytes", len(err.Error()))
	}
}

// TestExcerpt: short text is quoted whole; longer text is cut at a character's start, at most
// MaxExcerpt bytes of it, with "…" after the quotes.
func TestExcerpt(t *testing.T) {
	if got := Excerpt("a\nb"); got != `"a\nb"` {
		t.Errorf("Excerpt(a\\nb) = %s", got)
	}
	exact := strings.Repeat("x", MaxExcerpt)
	if got := Excerpt([]byte(exact)); got != `"`+exact+`"` {
		t.Errorf("Excerpt of %d bytes = %s; want it whole", MaxExcerpt, got)
	}
	s := strings.Repeat("x", MaxExcerpt-1) + "日本"
	if got, want := Excerpt(s), `"`+strings.Repeat("x", MaxExcerpt-1)+`"…`; got != want {
		t.Errorf("Excerpt cutting a character = %s; want %s", got, want)
	}
	if got, want := Clip(s), strings.Repeat("x", MaxExcerpt-1)+"…"; got != want {
		t.Errorf("Clip cutting a character = %s; want %s", got, want)
	}
	if got := Clip(exact); got != exact {
		t.Errorf("Clip of %d bytes = %s; want it whole", MaxExcerpt, got)
	}
}

// TestTruncateKeepsCharactersWhole: a value shortened for a message is cut at a character's
// start, so that the message stays UTF-8 (the --rejects file would show U+FFFD, a terminal
// garbage).
func TestTruncateKeepsCharactersWhole(t *testing.T) {
	items, err := readString(t, `{"custom_id":"a","model":"m","prompt_tokens":[1,"xx`+strings.Repeat("日", 20)+`"]}`+"\n", Limits{})
	mustEOF(t, err)
	if len(items) != 1 || items[0].lerr == nil {
		t.Fatalf("%+v; want one line error", items)
	}
	if msg := items[0].lerr.Error(); !utf8.ValidString(msg) || !strings.Contains(msg, "日...") {
		t.Errorf("error %q; want valid UTF-8, the value's first characters and \"...\"", msg)
	}
}

// TestDecodeResultBoundsItsError: a stored result with an unknown key of a megabyte (another
// client's, or a bug's) is refused with an error of its first bytes: encoding/json names an
// unknown field whole, and submit returns the error on its way to the terminal.
func TestDecodeResultBoundsItsError(t *testing.T) {
	_, err := DecodeResult([]byte(`{"custom_id":"a","format":"openai-chat","` + strings.Repeat("k", 1<<20) + `":1}`))
	if err == nil || len(err.Error()) > MaxExcerpt+100 || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("DecodeResult of a result with a 1 MiB key: %d bytes of error, starting %.200q", len(err.Error()), err)
	}
}

// TestExcerptOfBytesThatAreNoUTF8: bytes that start no character (a binary file read as an
// output file, a header of another client) are quoted as escapes, MaxExcerpt of them at most:
// a cut looks back for a character's start only as far as a character reaches, utf8.UTFMax
// bytes. It looked back to the first byte, and quoted nothing of them: `""…`.
func TestExcerptOfBytesThatAreNoUTF8(t *testing.T) {
	s := strings.Repeat("\x80", MaxExcerpt+1)
	if got, want := Excerpt(s), `"`+strings.Repeat(`\x80`, MaxExcerpt)+`"…`; got != want {
		t.Errorf("Excerpt of %d bytes 0x80 = %.40s (%d bytes); want %.40s… (%d bytes)", len(s), got, len(got), want, len(want))
	}
	if got, want := Clip(s), s[:MaxExcerpt]+"…"; got != want {
		t.Errorf("Clip of %d bytes 0x80 = %d bytes; want %d", len(s), len(got), len(want))
	}
}

package jobs

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"
)

// referenceEncode is how results were encoded before AppendJSON: encoding/json through
// reflection, HTML escaping off, metadata appended byte for byte. AppendJSON must match it.
func referenceEncode(r Result) ([]byte, error) {
	meta := r.Metadata
	r.Metadata = nil
	return encodeWithMetadata(resultNoMethods(r), meta)
}

func tricky() []Result {
	nan := math.NaN()
	return []Result{
		{CustomID: "a", BatchID: "b", Status: StatusOK},
		{
			CustomID: "q\"uote\\back\x00\x1f\b\f\n\r\t\x7f<>&\u2028\u2029é漢🙂", BatchID: "batch-1", Status: StatusOK,
			Model: "Qwen/Qwen3-8B", Format: FormatOpenAIChat,
			Samples: []Sample{
				{Text: "<|im_end|> hello", Tokens: []int{1, -2, 151645}, Logprobs: Logprobs{-0.5, nan, math.Inf(-1)}, StopReason: StopReasonStop},
				{Text: "", Tokens: nil, StopReason: StopReasonLength},
				{Text: "x", Tokens: []int{}, Logprobs: Logprobs{}, StopReason: StopReasonLength},
			},
			PromptLogprobs:     Logprobs{nan, -1.25, 1e-30, -3.4028235e+38, math.Inf(1)},
			TopKPromptLogprobs: [][]TokenLogprob{nil, {}, {{Token: 7, Logprob: -0.1}, {Token: 8, Logprob: nan}}},
			Usage:              &Usage{PromptTokens: 12, CompletionTokens: 3, CacheHitTokens: 4},
			Attempts:           2, LatencyMS: 1234567,
			Metadata: json.RawMessage(`{"k": [1, 2],   "s":"v"}`),
		},
		{
			CustomID: "bad-utf8-\xff\xfe-\xe2\x82", BatchID: "b", Status: StatusError, Model: "m", Format: FormatOpenAICompletions,
			Error:    &ResultError{Code: CodeAPIError, Message: "line\nbreak \"quoted\"", Category: CategoryUser, Retryable: true},
			Metadata: json.RawMessage("{\n  \"pretty\": true\n}"),
		},
		{CustomID: "c", BatchID: "b", Status: StatusCancelled, Error: &ResultError{Code: CodeCancelled, Category: CategoryUser},
			PromptLogprobs: Logprobs{}, TopKPromptLogprobs: [][]TokenLogprob{}, Samples: []Sample{}, Metadata: json.RawMessage(`null`)},
		{CustomID: "n", BatchID: "b", Status: StatusOK, Metadata: json.RawMessage(`"string"`), Usage: &Usage{}},
		{CustomID: "o", BatchID: "b", Status: StatusOK, Format: FormatOpenAIChat, OpenAILogprobs: true, Samples: []Sample{
			{Text: "é", Tokens: []int{1, 2, 3}, Logprobs: Logprobs{-1, -2, nan}, TokenBytes: TokenBytes{{0xc3}, {0xa9, 0, 255}, nil}, StopReason: StopReasonStop},
			{Text: "", Tokens: []int{}, TokenBytes: TokenBytes{}, StopReason: StopReasonLength},
		}},
		// A format without a model, and one no reader produces: still encoded as encoding/json does.
		{CustomID: "f", BatchID: "b", Status: StatusOK, Format: FormatOpenAIChat},
		{CustomID: "g", BatchID: "b", Status: StatusOK, Model: "m", Format: "\u2028<x>\"q\""},
	}
}

func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	for i, r := range tricky() {
		want, err := referenceEncode(r)
		if err != nil {
			t.Fatalf("%d: reference: %v", i, err)
		}
		got, err := r.Encode()
		if err != nil {
			t.Fatalf("%d: Encode: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%d:\n got %s\nwant %s", i, got, want)
		}
		// Appending keeps what the buffer held.
		got, err = r.AppendJSON([]byte("prefix:"))
		if err != nil || string(got) != "prefix:"+string(want) {
			t.Errorf("%d: AppendJSON onto a prefix: %q, %v", i, got, err)
		}
	}
}

func TestAppendJSONRejectsBadMetadata(t *testing.T) {
	r := Result{CustomID: "a", BatchID: "b", Status: StatusOK, Metadata: json.RawMessage(`{"open":`)}
	if _, err := r.Encode(); err == nil {
		t.Fatal("metadata that is not JSON was encoded")
	}
}

func FuzzResultJSON(f *testing.F) {
	f.Add("id", "text", "m", "msg", "", []byte{1, 2, 3}, uint64(0), []byte(`{"a":1}`), true)
	f.Add("\xff\u2028\"", "\x00\n<>&", "", "", FormatOpenAIChat, []byte{}, math.Float64bits(math.NaN()), []byte("[1,\n2]"), false)
	f.Add("c", "t", "m", "", FormatOpenAICompletions, []byte{7}, uint64(1), []byte(`null`), true)
	f.Fuzz(func(t *testing.T, id, text, model, msg, format string, toks []byte, lpBits uint64, meta []byte, ok bool) {
		tokens := make([]int, len(toks))
		lps := make(Logprobs, len(toks))
		for i, c := range toks {
			tokens[i] = int(c) * 1000
			lps[i] = math.Float64frombits(lpBits + uint64(c))
		}
		r := Result{CustomID: id, BatchID: "batch", Status: StatusOK, Model: model, Format: format,
			Samples:  []Sample{{Text: text, Tokens: tokens, Logprobs: lps, StopReason: StopReasonStop}},
			Usage:    &Usage{PromptTokens: len(id), CompletionTokens: len(tokens)},
			Attempts: len(text), LatencyMS: int64(lpBits >> 1)}
		if !ok {
			r.Status, r.Samples, r.Usage = StatusError, nil, nil
			r.Error = &ResultError{Code: CodeInternal, Message: msg, Category: CategoryServer}
		}
		if json.Valid(meta) {
			r.Metadata = meta
		}
		want, err := referenceEncode(r)
		if err != nil {
			t.Skip() // e.g. metadata encoding/json rejects as well
		}
		got, err := r.Encode()
		if err != nil {
			t.Fatalf("Encode: %v (reference encoded %s)", err, want)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
		// The OpenAI line of a valid result is one line of valid JSON too.
		if line, err := r.AppendOpenAI(nil, time.Unix(int64(lpBits>>30), 0)); err == nil && (!json.Valid(line) || bytes.IndexByte(line, '\n') >= 0) {
			t.Fatalf("AppendOpenAI wrote %q", line)
		} else if err != nil && r.Validate() == nil {
			t.Fatalf("AppendOpenAI of a valid result: %v", err)
		}
	})
}

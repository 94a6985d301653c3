package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// oldOpenAILine is the conversion AppendOpenAIFromJSON replaces: DecodeResult, then AppendOpenAI.
func oldOpenAILine(data []byte, created time.Time) ([]byte, string, string, error) {
	r, err := DecodeResult(data)
	if err != nil {
		return nil, "", "", err
	}
	out, err := r.AppendOpenAI(nil, created)
	return out, r.CustomID, r.BatchID, err
}

// randomResult returns a random result, ok or not, with the edge cases of results: no
// samples, empty samples, both stop reasons, tokens that are parts of characters or no
// UTF-8, missing logprobs (nil, NaN, ±Inf), no token bytes, reasoning texts, metadata.
func randomResult(rng *rand.Rand) Result {
	pick := func(s ...string) string { return s[rng.IntN(len(s))] }
	r := Result{
		CustomID: pick("a", "job-1", "ü\u2028\"x", "id\n\t"), BatchID: pick("", "b1", "batch\\2"),
		Status: StatusOK, Model: pick("", "Qwen/Qwen3-8B", "deepseek-ai/DeepSeek-V3.1", "openai/gpt-oss-20b"),
		Format: pick("", FormatOpenAIChat, FormatOpenAICompletions), Attempts: rng.IntN(3), LatencyMS: rng.Int64N(1e6),
	}
	switch rng.IntN(6) {
	case 0:
		r.Status = StatusError
		r.Error = &ResultError{Code: pick(CodeRateLimited, CodeInternal, CodeInvalidJob, CodeDeadLetter), Message: pick("boom", "bad \"x\" \x00 é"),
			Category: Category(pick("user", "server", "unknown")), Retryable: rng.IntN(2) == 0}
		return r
	case 1:
		r.Status = StatusCancelled
		r.Error = &ResultError{Code: CodeCancelled, Message: "batch cancelled", Category: CategoryUser}
		return r
	}
	r.OpenAILogprobs = rng.IntN(3) > 0
	if rng.IntN(3) == 0 {
		r.Usage = &Usage{PromptTokens: rng.IntN(100), CompletionTokens: rng.IntN(100), CacheHitTokens: rng.IntN(10)}
	}
	if rng.IntN(4) == 0 {
		r.Metadata = []byte(pick(`{"a":[1,2,{"b":null}]}`, `"x"`, `null`, `12`))
	}
	if rng.IntN(4) == 0 {
		r.PromptLogprobs = Logprobs{math.NaN(), -1.5, 0}
		r.TopKPromptLogprobs = [][]TokenLogprob{nil, {{Token: 5, Logprob: -0.25}, {Token: 7, Logprob: math.NaN()}}}
	}
	pieces := [][]byte{[]byte("a"), []byte(" the"), []byte("é"), {0xe4, 0xbd}, {0xa0}, {0xff}, []byte("\n"), []byte("\""),
		[]byte("<think>"), []byte("</think>"), []byte("<|channel|>final<|message|>"), []byte("<|end|>"), {0}, []byte("\u2028")}
	for range rng.IntN(4) {
		s := Sample{StopReason: pick(StopReasonStop, StopReasonLength)}
		n := rng.IntN(12)
		if rng.IntN(5) > 0 {
			s.Tokens = make([]int, 0, n)
		}
		withLogprobs, withBytes := rng.IntN(3) > 0, rng.IntN(3) > 0
		var text []byte
		for range n {
			if s.Tokens == nil {
				break
			}
			s.Tokens = append(s.Tokens, rng.IntN(200000))
			if withLogprobs {
				lp := -rng.Float64() * 20
				switch rng.IntN(12) {
				case 0:
					lp = math.NaN()
				case 1:
					lp = math.Inf(-1)
				case 2:
					lp = -20000
				case 3:
					lp = 0
				}
				s.Logprobs = append(s.Logprobs, lp)
			}
			tb := pieces[rng.IntN(len(pieces))]
			if withBytes {
				s.TokenBytes = append(s.TokenBytes, tb)
			}
			text = append(text, tb...)
		}
		if withLogprobs && s.Tokens != nil && s.Logprobs == nil {
			s.Logprobs = Logprobs{}
		}
		if withBytes && s.Tokens != nil && s.TokenBytes == nil {
			s.TokenBytes = TokenBytes{}
		}
		s.Text = strings.ToValidUTF8(string(text), "\uFFFD")
		r.Samples = append(r.Samples, s)
	}
	return r
}

// mutations rewrite a stored line into the forms that AppendJSON does not write but
// DecodeResult reads or refuses, each in its way.
var mutations = []func(string) string{
	func(s string) string { return s },
	func(s string) string { return "  " + s + "\n" },
	func(s string) string { return s + "garbage" },
	func(s string) string { return s + " {}" },
	func(s string) string { return s[:len(s)/2] },
	func(s string) string { return strings.Replace(s, `"custom_id"`, `"Custom_ID"`, 1) },
	func(s string) string { return strings.Replace(s, `"status"`, `"st\u0061tus"`, 1) },
	func(s string) string { return strings.Replace(s, `{"custom_id":`, `{"extra":1,"custom_id":`, 1) },
	func(s string) string { return strings.Replace(s, `"attempts":`, `"attempts":1,"attempts":`, 1) },
	func(s string) string { return strings.Replace(s, `"attempts":`, `"attempts":1.0,"latency_ms":`, 1) },
	func(s string) string { return strings.Replace(s, `"tokens":[`, `"tokens":[-0,`, 1) },
	func(s string) string { return strings.Replace(s, `"logprobs":[`, `"logprobs":[null,`, 1) },
	func(s string) string { return strings.Replace(s, `"token_bytes":[`, `"token_bytes":[[],`, 1) },
	func(s string) string { return strings.Replace(s, `"tokens":[`, `"tokens":null,"x":[`, 1) },
	func(s string) string { return strings.Replace(s, `"tokens":[`, `"tokens":[null,`, 1) },
	// No tokens (null or absent) but empty lists: len(nil) is 0, so DecodeResult takes them.
	func(s string) string { return strings.Replace(s, `"tokens":null`, `"tokens":null,"logprobs":[]`, 1) },
	func(s string) string { return strings.Replace(s, `"tokens":null,`, `"token_bytes":[ ],`, 1) },
	func(s string) string { return strings.Replace(s, `"tokens":[`, `"tokens":[1.5,`, 1) },
	func(s string) string { return strings.Replace(s, `"tokens":[`, `"tokens":[99999999999999999999,`, 1) },
	func(s string) string { return strings.Replace(s, `"logprobs":[`, `"logprobs":[1e999,`, 1) },
	func(s string) string { return strings.Replace(s, `"logprobs":[`, `"logprobs":["x",`, 1) },
	func(s string) string { return strings.Replace(s, `"token_bytes":[`, `"token_bytes":[[256],`, 1) },
	func(s string) string { return strings.Replace(s, `"token_bytes":[`, `"token_bytes":[null,`, 1) },
	func(s string) string { return strings.Replace(s, `"token_bytes":[[`, `"token_bytes":[[-1,`, 1) },
	func(s string) string { return strings.Replace(s, `"stop_reason":"stop"`, `"stop_reason":null`, 1) },
	func(s string) string { return strings.Replace(s, `"stop_reason":"length"`, `"stop_reason":"eos"`, 1) },
	func(s string) string { return strings.Replace(s, `{"text":`, `{"text":null,"text":`, 1) },
	func(s string) string { return strings.Replace(s, `"samples":[`, `"samples":[null,`, 1) },
	func(s string) string { return strings.Replace(s, `"model":`, `"model":null,"format":`, 1) },
	func(s string) string { return strings.Replace(s, `"status":"ok"`, `"status":"error"`, 1) },
	func(s string) string { return strings.Replace(s, `"usage":{`, `"usage":{"prompt_tokens":null,`, 1) },
	func(s string) string { return strings.Replace(s, `"usage":{`, `"usage":{"total":3,`, 1) },
	func(s string) string { return strings.Replace(s, `"error":{`, `"error":{"category":"x",`, 1) },
	func(s string) string { return strings.Replace(s, `"retryable":`, `"retryable":"no","x":`, 1) },
	func(s string) string {
		return strings.Replace(s, `"topk_prompt_logprobs":[`, `"topk_prompt_logprobs":[[[1]],`, 1)
	},
	func(s string) string {
		return strings.Replace(s, `"topk_prompt_logprobs":[`, `"topk_prompt_logprobs":[[["1",2]],`, 1)
	},
	func(s string) string { return strings.Replace(s, `"prompt_logprobs":[`, `"prompt_logprobs":[true,`, 1) },
	func(s string) string { return strings.Replace(s, `"text":"`, `"text":"\ud800\"\u00e9`, 1) },
	func(s string) string { return strings.Replace(s, `"text":"`, "\"text\":\"\xff\xfe", 1) },
	func(s string) string { return strings.Replace(s, `,"latency_ms"`, ",\n \"latency_ms\" ", 1) },
}

// TestAppendOpenAIFromJSONMatchesDecodeResult runs random results, and the mutations of
// their stored lines, through AppendOpenAIFromJSON and the conversion it replaces: the same
// line and ids, or the same error.
func TestAppendOpenAIFromJSONMatchesDecodeResult(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	created := time.Unix(1700000000, 0)
	fallbacks, inPlace := 0, 0
	for i := range 1500 {
		r := randomResult(rng)
		stored, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		for m, mutate := range mutations {
			data := []byte(mutate(string(stored)))
			wantOut, wantID, wantBatch, wantErr := oldOpenAILine(data, created)
			prefix := []byte("prefix")
			gotOut, gotID, gotBatch, gotErr := AppendOpenAIFromJSON(prefix, data, created)
			if (wantErr == nil) != (gotErr == nil) || wantErr != nil && wantErr.Error() != gotErr.Error() {
				t.Fatalf("result %d, mutation %d: %s\nerror %v, want %v", i, m, data, gotErr, wantErr)
			}
			if wantErr != nil {
				continue
			}
			if !bytes.Equal(gotOut, append([]byte("prefix"), wantOut...)) || gotID != wantID || gotBatch != wantBatch {
				t.Fatalf("result %d, mutation %d: %s\ngot  %s %q %q\nwant %s %q %q", i, m, data, gotOut, gotID, gotBatch, wantOut, wantID, wantBatch)
			}
			if _, ok := scanStoredResult(data); !ok {
				fallbacks++
			} else {
				inPlace++
			}
		}
		if _, ok := scanStoredResult(stored); !ok {
			t.Fatalf("result %d: a line as AppendJSON writes it is left to DecodeResult: %s", i, stored)
		}
	}
	t.Logf("results written: %d read in place, %d by DecodeResult", inPlace, fallbacks)
}

// FuzzAppendOpenAIFromJSON holds AppendOpenAIFromJSON to DecodeResult and AppendOpenAI on
// any line: the same bytes and ids, or the same error.
func FuzzAppendOpenAIFromJSON(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 5))
	for range 20 {
		r := randomResult(rng)
		data, err := r.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	created := time.Unix(1700000000, 0)
	f.Fuzz(func(t *testing.T, data []byte) {
		wantOut, wantID, wantBatch, wantErr := oldOpenAILine(data, created)
		gotOut, gotID, gotBatch, gotErr := AppendOpenAIFromJSON(nil, data, created)
		if (wantErr == nil) != (gotErr == nil) || wantErr != nil && wantErr.Error() != gotErr.Error() {
			t.Fatalf("%s\nerror %v, want %v", data, gotErr, wantErr)
		}
		if !bytes.Equal(gotOut, wantOut) || gotID != wantID || gotBatch != wantBatch {
			t.Fatalf("%s\ngot  %s %q %q\nwant %s %q %q", data, gotOut, gotID, gotBatch, wantOut, wantID, wantBatch)
		}
	})
}

// encodingJSONLogprobs and encodingJSONTokenBytes are Logprobs' and TokenBytes'
// UnmarshalJSON as they were, all through encoding/json, for the lists the in-place reading
// does not take.
func encodingJSONLogprobs(b []byte) (Logprobs, error) {
	if string(bytes.TrimSpace(b)) == "null" {
		return nil, nil
	}
	var raw []*float64
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("logprobs: %w", err)
	}
	out := make(Logprobs, len(raw))
	for i, p := range raw {
		if p == nil {
			out[i] = math.NaN()
		} else {
			out[i] = *p
		}
	}
	return out, nil
}

func encodingJSONTokenBytes(b []byte) (TokenBytes, error) {
	if string(bytes.TrimSpace(b)) == "null" {
		return nil, nil
	}
	var raw [][]int
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("token bytes: %w", err)
	}
	out := make(TokenBytes, len(raw))
	for i, tok := range raw {
		out[i] = make([]byte, 0, len(tok))
		for _, c := range tok {
			if c < 0 || c > 255 {
				return nil, fmt.Errorf("token bytes: %d is not a byte", c)
			}
			out[i] = append(out[i], byte(c))
		}
	}
	return out, nil
}

// sameLogprobs reports whether a and b are the same list, NaN for NaN, nil for nil.
func sameLogprobs(a, b Logprobs) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float64bits(a[i]) != math.Float64bits(b[i]) && !(math.IsNaN(a[i]) && math.IsNaN(b[i])) {
			return false
		}
	}
	return true
}

// sameTokenBytes reports whether a and b are the same lists, nil for nil.
func sameTokenBytes(a, b TokenBytes) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// checkListsDecode holds Logprobs' and TokenBytes' UnmarshalJSON, which read a list in place
// when they can, to encoding/json's reading of it: the same list, or the same error.
func checkListsDecode(t *testing.T, data []byte) {
	t.Helper()
	if !json.Valid(data) {
		return // encoding/json calls UnmarshalJSON with one valid value only
	}
	var l Logprobs
	err := l.UnmarshalJSON(data)
	want, wantErr := encodingJSONLogprobs(data)
	if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() || err == nil && !sameLogprobs(l, want) {
		t.Fatalf("Logprobs %s: %v, %v; want %v, %v", data, l, err, want, wantErr)
	}
	var tb TokenBytes
	err = tb.UnmarshalJSON(data)
	wantTB, wantErr := encodingJSONTokenBytes(data)
	if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() || err == nil && !sameTokenBytes(tb, wantTB) {
		t.Fatalf("TokenBytes %s: %v, %v; want %v, %v", data, tb, err, wantTB, wantErr)
	}
	for i := range tb {
		if cap(tb[i]) != len(tb[i]) {
			t.Fatalf("TokenBytes %s: token %d has room for more (%d), and an append would write over the next", data, i, cap(tb[i]))
		}
	}
}

var listSeeds = []string{
	`[]`, `null`, ` [ ] `, `[null]`, `[0,-0,1.5,-1e-400,1e308,-3.4028235e+38,null, 2 ,1E2]`, `[1e400]`, `["1"]`,
	`[true]`, `{}`, `"x"`, `5`, `[[]]`, `[[0,255],[],[ 1 ]]`, `[[256]]`, `[[-1]]`, `[[1.0]]`, `[[1e2]]`, `[null,[1]]`,
	`[[null]]`, `[[1],2]`, `[[99999999999999999999]]`, `[["a"]]`, `[[-0]]`,
}

func TestListsDecodeAsEncodingJSON(t *testing.T) {
	for _, s := range listSeeds {
		checkListsDecode(t, []byte(s))
	}
}

func FuzzListsDecode(f *testing.F) {
	for _, s := range listSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkListsDecode)
}

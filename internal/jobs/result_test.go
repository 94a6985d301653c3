package jobs

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestResultEncodeDecode(t *testing.T) {
	t.Parallel()
	j := Job{CustomID: "r1", ModelPath: "tinker://s:train:0/sampler_weights/x", Prompt: "p", NumSamples: 2,
		Metadata: json.RawMessage(`{"a": 1}`)}
	r := NewResult(j, "batch-7")
	r.Samples = []Sample{
		{Text: "Hi<|im_end|>", Tokens: []int{1, 151645}, Logprobs: Logprobs{-0.5, float64(float32(-0.1))}, StopReason: StopReasonStop},
		{Text: "Hello", Tokens: []int{2}, StopReason: StopReasonLength},
	}
	r.PromptLogprobs = Logprobs{math.NaN(), -3.5, math.Inf(-1)}
	r.TopKPromptLogprobs = [][]TokenLogprob{nil, {{Token: 11, Logprob: -0.5}, {Token: 12, Logprob: -2}}}
	r.Usage = &Usage{PromptTokens: 3, CompletionTokens: 3, CacheHitTokens: 2}
	r.Attempts = 2
	r.LatencyMS = 1234

	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"custom_id":"r1","batch_id":"batch-7","status":"ok","model":"tinker://s:train:0/sampler_weights/x",` +
		`"samples":[{"text":"Hi<|im_end|>","tokens":[1,151645],"logprobs":[-0.5,-0.1],"stop_reason":"stop"},` +
		`{"text":"Hello","tokens":[2],"stop_reason":"length"}],` +
		`"prompt_logprobs":[null,-3.5,-3.4028235e+38],"topk_prompt_logprobs":[null,[[11,-0.5],[12,-2]]],` +
		`"usage":{"prompt_tokens":3,"completion_tokens":3,"cache_hit_tokens":2},"attempts":2,"latency_ms":1234,"metadata":{"a": 1}}`
	if string(b) != want {
		t.Fatalf("Encode:\n got %s\nwant %s", b, want)
	}
	back, err := DecodeResult(b)
	if err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(back.PromptLogprobs[0]) || back.PromptLogprobs[1] != -3.5 {
		t.Fatalf("prompt logprobs: %v", back.PromptLogprobs)
	}
	back.PromptLogprobs, r.PromptLogprobs = nil, nil
	back.Samples[0].Logprobs[1] = float64(float32(back.Samples[0].Logprobs[1]))
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, r)
	}
}

func TestResultConstructorsAndValidate(t *testing.T) {
	t.Parallel()
	j := Job{CustomID: "x", Model: "Qwen/Qwen3-8B", Prompt: "p", NumSamples: 1, Metadata: json.RawMessage(`7`)}
	e := ErrorResult(j, "b", ResultError{Code: CodeContextTooLong, Message: "too long", Category: CategoryUser})
	c := CancelledResult(j, "b", "")
	inv := InvalidJobResult(j, "b", &FieldError{Field: "num_samples", Msg: "must be an integer from 1 to 16"})
	for _, r := range []Result{e, c, inv} {
		if r.CustomID != "x" || r.BatchID != "b" || r.Model != "Qwen/Qwen3-8B" || string(r.Metadata) != "7" || r.Error == nil {
			t.Errorf("constructor result %+v", r)
		}
		if err := r.Validate(); err != nil {
			t.Errorf("Validate(%+v): %v", r, err)
		}
		b, err := r.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeResult(b); err != nil {
			t.Errorf("DecodeResult(%s): %v", b, err)
		}
	}
	if e.Status != StatusError || c.Status != StatusCancelled || c.Error.Code != CodeCancelled || c.Error.Message != "batch cancelled" {
		t.Errorf("statuses: %v %v %+v", e.Status, c.Status, c.Error)
	}
	if inv.Error.Code != CodeInvalidJob || inv.Error.Message != "field num_samples: must be an integer from 1 to 16" {
		t.Errorf("invalid job result: %+v", inv.Error)
	}
	if got := e.Error.Error(); got != "context_too_long: too long" {
		t.Errorf("ResultError.Error() = %q", got)
	}

	bad := []struct {
		line, field string
	}{
		{`{"custom_id":"","batch_id":"b","status":"ok","attempts":0,"latency_ms":0}`, "custom_id"},
		{`{"custom_id":"x","batch_id":"b","status":"done","attempts":0,"latency_ms":0}`, "status"},
		{`{"custom_id":"x","batch_id":"b","status":"error","attempts":0,"latency_ms":0}`, "error"},
		{`{"custom_id":"x","batch_id":"b","status":"ok","error":{"code":"internal","message":"m","category":"user","retryable":false},"attempts":0,"latency_ms":0}`, "error"},
		{`{"custom_id":"x","batch_id":"b","status":"error","error":{"code":"internal","message":"m","category":"mine","retryable":false},"attempts":0,"latency_ms":0}`, "error.category"},
		{`{"custom_id":"x","batch_id":"b","status":"ok","samples":[{"text":"","tokens":[1],"stop_reason":"eos"}],"attempts":0,"latency_ms":0}`, "samples[0].stop_reason"},
		{`{"custom_id":"x","batch_id":"b","status":"ok","samples":[{"text":"","tokens":[1],"logprobs":[],"stop_reason":"stop"}],"attempts":0,"latency_ms":0}`, "samples[0].logprobs"},
		{`{"custom_id":"x","batch_id":"b","status":"ok","samples":[{"text":"","tokens":[1],"token_bytes":[[1],[2]],"stop_reason":"stop"}],"attempts":0,"latency_ms":0}`, "samples[0].token_bytes"},
	}
	for _, tt := range bad {
		_, err := DecodeResult([]byte(tt.line))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("DecodeResult(%s) = %v, want field %q", tt.line, err, tt.field)
		}
	}
	if _, err := DecodeResult([]byte(`{"custom_id":"x","batch_id":"b","status":"ok","attempts":0,"latency_ms":0,"surprise":1}`)); err == nil || !strings.Contains(err.Error(), "surprise") {
		t.Errorf("unknown result field: %v", err)
	}
}

// TestResultTokenBytesEncodeDecode: the bytes of the sampled tokens of a job that asked for
// OpenAI logprobs, a part of a UTF-8 character and a token of no bytes included, are written
// as lists of integers, follow the schema and read back as they were; a number that is no
// byte is refused.
func TestResultTokenBytesEncodeDecode(t *testing.T) {
	t.Parallel()
	schema := compileSchema(t, "result.schema.json")
	r := Result{CustomID: "x", BatchID: "b", Status: StatusOK, Model: "Qwen/Qwen3-8B", Format: FormatOpenAICompletions,
		OpenAILogprobs: true, Usage: &Usage{CompletionTokens: 4},
		Samples: []Sample{{Text: "Hié", Tokens: []int{13048, 2, 3, 4}, Logprobs: Logprobs{-0.5, -1, -2, 0},
			TokenBytes: TokenBytes{[]byte("Hi"), {0xc3}, {0xa9}, {}}, StopReason: StopReasonLength}}}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"custom_id":"x","batch_id":"b","status":"ok","model":"Qwen/Qwen3-8B","format":"openai-completions","openai_logprobs":true,` +
		`"samples":[{"text":"Hié","tokens":[13048,2,3,4],"logprobs":[-0.5,-1,-2,0],"token_bytes":[[72,105],[195],[169],[]],"stop_reason":"length"}],` +
		`"usage":{"prompt_tokens":0,"completion_tokens":4,"cache_hit_tokens":0},"attempts":0,"latency_ms":0}`
	if string(b) != want {
		t.Fatalf("Encode:\n got %s\nwant %s", b, want)
	}
	if err := followsSchema(schema, b); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if FormatOfResult(b) != FormatOpenAICompletions {
		t.Errorf("FormatOfResult(%s) = %q", b, FormatOfResult(b))
	}
	back, err := DecodeResult(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, r)
	}
	for _, bad := range []string{`[[256]]`, `[[-1]]`, `[1]`, `"SGk="`} {
		line := strings.Replace(want, `[[72,105],[195],[169],[]]`, bad, 1)
		if _, err := DecodeResult([]byte(line)); err == nil || !strings.Contains(err.Error(), "token") {
			t.Errorf("DecodeResult with token_bytes %s: %v", bad, err)
		}
	}
}

// TestALogprobPastFloat32sRangeIsStillJSON: a logprob the service sent as a JSON number beyond
// float32's range (-1e39) is written as float32's extreme, as an infinity is, not as "-Inf",
// which is no JSON: the result line would be unreadable, and submit copies native lines byte
// for byte into the results file.
func TestALogprobPastFloat32sRangeIsStillJSON(t *testing.T) {
	t.Parallel()
	schema := compileSchema(t, "result.schema.json")
	r := Result{CustomID: "x", BatchID: "b", Status: StatusOK, Usage: &Usage{},
		Samples:            []Sample{{Tokens: []int{1, 2}, Logprobs: Logprobs{-1e39, 1e300}, StopReason: StopReasonLength}},
		PromptLogprobs:     Logprobs{math.NaN(), -math.MaxFloat64},
		TopKPromptLogprobs: [][]TokenLogprob{nil, {{Token: 3, Logprob: -1e39}}}}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := followsSchema(schema, b); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	for _, want := range []string{`"logprobs":[-3.4028235e+38,3.4028235e+38]`, `"prompt_logprobs":[null,-3.4028235e+38]`, `[[3,-3.4028235e+38]]`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %s", b, want)
		}
	}
}

// TestANaNTopKLogprobIsWrittenAndReadBack: a top-k pair whose logprob the service sent as NaN
// is written with null, as a NaN in the other logprobs is, follows the schema, and reads back
// as NaN; a null there failed to read back ("token logprob: logprob"), and the schema
// allowed only a number.
func TestANaNTopKLogprobIsWrittenAndReadBack(t *testing.T) {
	t.Parallel()
	schema := compileSchema(t, "result.schema.json")
	r := Result{CustomID: "x", BatchID: "b", Status: StatusOK, Usage: &Usage{},
		Samples:            []Sample{{Tokens: []int{1}, StopReason: StopReasonLength}},
		TopKPromptLogprobs: [][]TokenLogprob{nil, {{Token: 3, Logprob: math.NaN()}, {Token: 4, Logprob: -1.5}}}}
	b, err := r.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `[[3,null],[4,-1.5]]`) {
		t.Fatalf("%s: want the NaN written as null", b)
	}
	if err := followsSchema(schema, b); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("read back %s: %v", b, err)
	}
	if row := back.TopKPromptLogprobs[1]; len(row) != 2 || row[0].Token != 3 || !math.IsNaN(row[0].Logprob) || row[1].Logprob != -1.5 {
		t.Fatalf("read back %+v", row)
	}
}

// TestResultLineIDs: the ids of a result line as AppendJSON writes it, and ok false for a
// payload that an output file's reader would not take back as one line of one result.
func TestResultLineIDs(t *testing.T) {
	r := Result{CustomID: "q-1", BatchID: "b-1", Status: StatusOK, Attempts: 1}
	good, err := r.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, batch, ok := ResultLineIDs(good); !ok || id != "q-1" || batch != "b-1" {
		t.Fatalf("ResultLineIDs(%s) = %q, %q, %v", good, id, batch, ok)
	}
	if id, _, ok := ResultLineIDs([]byte(`{"custom_id":"q\u002d1","batch_id":"b","status":"ok"} ` + "\r")); !ok || id != "q-1" {
		t.Errorf("an escaped custom_id and white space after: %q, %v", id, ok)
	}
	s := string(good)
	for _, bad := range []string{
		"",
		s[:len(s)-1],
		s + " x",
		s + s,
		s + "\n" + s,
		strings.Replace(s, `,"batch_id"`, ",\n"+`"batch_id"`, 1),
		" " + s,
		`{"batch_id":"b-1","custom_id":"q-1","status":"ok"}`,
		`{"custom_id":"","batch_id":"b-1","status":"ok"}`,
		`{"custom_id":"q-1","batch_id":"b-1"}`,
		`{"custom_id":"q-1","batch_id":"b-1","status":""}`,
		`{"custom_id":"q-1","batch_id":1,"status":"ok"}`,
		`{"custom_id":"q-1","status":"ok"}`,
		`{"custom_id":"q-1` + "\xff" + `","batch_id":"b-1","status":"ok"}`,
		`{"custom_id":"q-1","batch_id":"b-1","status":"ok","x":01}`,
	} {
		if id, batch, ok := ResultLineIDs([]byte(bad)); ok {
			t.Errorf("ResultLineIDs(%.80q) = %q, %q, true; want false", bad, id, batch)
		}
	}
}

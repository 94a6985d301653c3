package jobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestJobEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	jobs := []Job{
		{CustomID: "a", Format: FormatNative, Model: "Qwen/Qwen3-8B", Prompt: "<|im_start|>user & \"q\"", NumSamples: 1},
		{
			CustomID: "b/ü", Format: FormatNative, ModelPath: "tinker://x:train:0/sampler_weights/s",
			PromptTokens: []int{0, 1, 2147483647}, NumSamples: 16, PromptLogprobs: true, TopKPromptLogprobs: 20,
			Params: SamplingParams{MaxTokens: intp(1), Temperature: floatp(0), TopP: floatp(1), TopK: intp(-1),
				Seed: int64p(-9223372036854775808), Stop: Stop{TokenIDs: []int{151645, 151643}}},
			Metadata: json.RawMessage(`[1, {"deep": null}]`),
		},
		{
			CustomID: "c", Format: FormatOpenAIChat, Model: "m",
			Messages: []Message{{Role: RoleTool, Content: ""}, {Role: RoleUser, Content: "x"}}, Thinking: true,
			NumSamples: 2, Params: SamplingParams{Stop: Stop{Strings: []string{"</s>"}}, Seed: int64p(9223372036854775807)},
			Metadata: json.RawMessage(`null`),
		},
		{
			CustomID: "d", Format: FormatOpenAIChat, Model: "openai/gpt-oss-20b",
			Messages: []Message{{Role: RoleUser, Content: "x"}}, ReasoningEffort: "low", NumSamples: 1,
		},
		{CustomID: "e", Format: FormatOpenAICompletions, Model: "m", Prompt: "p", NumSamples: 1, OpenAILogprobs: true},
	}
	for _, j := range jobs {
		if err := j.Validate(Limits{}); err != nil {
			t.Fatalf("%s: Validate: %v", j.CustomID, err)
		}
		b, err := j.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if bytes.ContainsAny(b, "\n") || !json.Valid(b) {
			t.Fatalf("encoding is not one line of JSON: %s", b)
		}
		got, err := DecodeJob(b)
		if err != nil {
			t.Fatalf("DecodeJob(%s): %v", b, err)
		}
		if !reflect.DeepEqual(got, j) {
			t.Fatalf("round trip:\n got %+v\nwant %+v\n via %s", got, j, b)
		}
		again, _ := got.Encode()
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%s\n%s", again, b)
		}
		// json.Marshal / Unmarshal go through the same methods.
		wrapped, err := json.Marshal(struct{ J Job }{j})
		if err != nil {
			t.Fatal(err)
		}
		var w struct{ J Job }
		if err := json.Unmarshal(wrapped, &w); err != nil {
			t.Fatalf("json round trip: %v", err)
		}
		// An outer encoding/json compacts what MarshalJSON returns, so metadata survives as
		// equal JSON, not byte for byte; Encode is the byte-exact path.
		var compact bytes.Buffer
		if j.Metadata != nil {
			_ = json.Compact(&compact, j.Metadata)
			if !bytes.Equal(w.J.Metadata, compact.Bytes()) {
				t.Fatalf("json round trip metadata %s, want %s", w.J.Metadata, compact.Bytes())
			}
		}
		w.J.Metadata = j.Metadata
		if !reflect.DeepEqual(w.J, j) {
			t.Fatalf("json round trip:\n%+v\n%+v", w.J, j)
		}
	}
	if b, _ := jobs[0].Encode(); !strings.Contains(string(b), `"<|im_start|>user & \"q\""`) {
		t.Errorf("HTML escaping applied: %s", b)
	}
}

func TestDecodeJobStrict(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{`{"custom_id":"a","model":"m","prompt":"p","num_samples":1,"extra":1}`, "field extra: unknown field"},
		{`{"custom_id":"a","model":"m","prompt":"p","sampling_params":{"temperature":"x"}}`, "field sampling_params.temperature"},
		{`not json`, "malformed JSON"},
		{`{"custom_id":"a","format":5}`, "field format: must be a string"},
		{`{"custom_id":"a","openai_logprobs":0}`, "field openai_logprobs: must be true or false"},
	}
	for _, tt := range tests {
		_, err := DecodeJob([]byte(tt.in))
		var fe *FieldError
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.As(err, &fe) {
			t.Errorf("DecodeJob(%s) = %v, want a *FieldError containing %q", tt.in, err, tt.want)
		}
	}
	// A payload of an older submit has no openai_logprobs: no OpenAI logprobs were asked for.
	if j, err := DecodeJob([]byte(`{"custom_id":"a","format":"openai-chat","model":"m","messages":[{"role":"user","content":"c"}],"num_samples":1}`)); err != nil || j.OpenAILogprobs {
		t.Fatalf("DecodeJob of a payload without openai_logprobs = %+v, %v", j, err)
	}
	// Absent num_samples defaults to 1; DecodeJob does not apply limits, Validate does.
	j, err := DecodeJob([]byte(`{"custom_id":"a","model":"m","prompt":"p","num_samples":99}`))
	if err != nil || j.NumSamples != 99 {
		t.Fatalf("DecodeJob = %+v, %v", j, err)
	}
	if err := j.Validate(Limits{}); err == nil {
		t.Fatal("Validate accepted num_samples 99")
	}
	var fe *FieldError
	if err := j.Validate(Limits{}); !errors.As(err, &fe) || fe.Field != "num_samples" {
		t.Fatalf("Validate error = %v, want *FieldError for num_samples", err)
	}
	if err := j.Validate(Limits{MaxNumSamples: 100}); err != nil {
		t.Fatalf("Validate with a raised limit: %v", err)
	}
}

func TestValidateProgrammaticJobs(t *testing.T) {
	t.Parallel()
	ok := Job{CustomID: "x", Model: "m", Prompt: "p", NumSamples: 1}
	tests := []struct {
		name  string
		mod   func(*Job)
		field string
	}{
		{"zero num_samples", func(j *Job) { j.NumSamples = 0 }, "num_samples"},
		{"mixed stop", func(j *Job) { j.Params.Stop = Stop{Strings: []string{"a"}, TokenIDs: []int{1}} }, "sampling_params.stop"},
		{"negative token", func(j *Job) { j.Prompt = ""; j.PromptTokens = []int{-1} }, "prompt_tokens[0]"},
		{"invalid metadata", func(j *Job) { j.Metadata = json.RawMessage(`{`) }, "metadata"},
		{"invalid utf8 id", func(j *Job) { j.CustomID = "\xff" }, "custom_id"},
		{"infinite temperature", func(j *Job) { j.Params.Temperature = floatp(posInf()) }, "sampling_params.temperature"},
		{"NaN top_p", func(j *Job) { j.Params.TopP = floatp(nan()) }, "sampling_params.top_p"},
	}
	if err := ok.Validate(Limits{}); err != nil {
		t.Fatalf("base job: %v", err)
	}
	for _, tt := range tests {
		j := ok
		tt.mod(&j)
		var fe *FieldError
		if err := j.Validate(Limits{}); !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("%s: Validate = %v, want field %q", tt.name, err, tt.field)
		}
	}
}

// TestMetadataByteForByte follows odd but valid metadata from a line through the job message to
// the result line.
func TestMetadataByteForByte(t *testing.T) {
	t.Parallel()
	metas := []string{
		`{"b": 1,   "a" : [1.50, 1e3, -0.0],	"h": "<x>&amp;", "u": "\u00e9\ud83d\ude00", "n": null}`,
		`"plain"`,
		`12345678901234567890123`,
		`null`,
		`[]`,
	}
	for _, meta := range metas {
		line := `{"custom_id":"m","model":"Qwen/Qwen3-8B","prompt":"p","metadata":` + meta + "}\r\n"
		items, err := readString(t, line, Limits{})
		mustEOF(t, err)
		if len(items) != 1 || items[0].lerr != nil {
			t.Fatalf("%s: %+v", meta, items)
		}
		j := items[0].job
		if string(j.Metadata) != meta {
			t.Fatalf("reader: metadata %q, want %q", j.Metadata, meta)
		}
		b, err := j.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(`"metadata":`+meta+"}")) {
			t.Fatalf("job message does not carry the metadata verbatim: %s", b)
		}
		back, err := DecodeJob(b)
		if err != nil || string(back.Metadata) != meta {
			t.Fatalf("DecodeJob: %q, %v", back.Metadata, err)
		}
		res := NewResult(back, "batch-1")
		rb, err := res.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(rb, []byte(`"metadata":`+meta+"}")) {
			t.Fatalf("result line does not end with the metadata verbatim: %s", rb)
		}
		rback, err := DecodeResult(rb)
		if err != nil || string(rback.Metadata) != meta {
			t.Fatalf("DecodeResult: %q, %v", rback.Metadata, err)
		}
	}
	// Absent metadata stays absent.
	j := Job{CustomID: "x", Model: "m", Prompt: "p", NumSamples: 1}
	b, _ := NewResult(j, "b").Encode()
	if bytes.Contains(b, []byte("metadata")) {
		t.Errorf("absent metadata written: %s", b)
	}
	// Metadata holding a newline (only possible programmatically) is compacted to stay one line.
	j.Metadata = json.RawMessage("{\n  \"a\": 1\n}")
	b, err := j.Encode()
	if err != nil || !bytes.HasSuffix(b, []byte(`"metadata":{"a":1}}`)) {
		t.Errorf("multi-line metadata: %s, %v", b, err)
	}
}

func TestStopJSON(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Stop{
		`"\n"`:      {Strings: []string{"\n"}},
		`["a","b"]`: {Strings: []string{"a", "b"}},
		`[1, 2]`:    {TokenIDs: []int{1, 2}},
		`[]`:        {},
		`null`:      {},
	} {
		var s Stop
		if err := json.Unmarshal([]byte(in), &s); err != nil || !reflect.DeepEqual(s, want) {
			t.Errorf("Unmarshal(%s) = %+v, %v", in, s, err)
		}
	}
	var s Stop
	if err := json.Unmarshal([]byte(`[1,"a"]`), &s); err == nil {
		t.Error("mixed stop accepted")
	}
}

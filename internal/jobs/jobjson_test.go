package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"testing"
)

// referenceJobEncode is how jobs were encoded before AppendJSON: encoding/json through
// reflection of the native line's shape plus "format", HTML escaping off, the metadata
// spliced in byte for byte. AppendJSON must match it.
func referenceJobEncode(j Job) ([]byte, error) {
	type wireJob struct {
		CustomID           string          `json:"custom_id"`
		Format             string          `json:"format,omitempty"`
		Model              string          `json:"model,omitempty"`
		ModelPath          string          `json:"model_path,omitempty"`
		Prompt             *string         `json:"prompt,omitempty"`
		PromptTokens       []int           `json:"prompt_tokens,omitempty"`
		Messages           []Message       `json:"messages,omitempty"`
		Thinking           bool            `json:"thinking,omitempty"`
		ReasoningEffort    string          `json:"reasoning_effort,omitempty"`
		Params             *SamplingParams `json:"sampling_params,omitempty"`
		NumSamples         int             `json:"num_samples"`
		PromptLogprobs     bool            `json:"prompt_logprobs,omitempty"`
		TopKPromptLogprobs int             `json:"topk_prompt_logprobs,omitempty"`
		OpenAILogprobs     bool            `json:"openai_logprobs,omitempty"`
	}
	w := wireJob{CustomID: j.CustomID, Format: j.Format, Model: j.Model, ModelPath: j.ModelPath,
		PromptTokens: j.PromptTokens, Messages: j.Messages, Thinking: j.Thinking,
		ReasoningEffort: j.ReasoningEffort, NumSamples: j.NumSamples, PromptLogprobs: j.PromptLogprobs,
		TopKPromptLogprobs: j.TopKPromptLogprobs, OpenAILogprobs: j.OpenAILogprobs}
	if j.Prompt != "" {
		w.Prompt = &j.Prompt
	}
	if !j.Params.isZero() {
		w.Params = &j.Params
	}
	return encodeWithMetadata(w, j.Metadata)
}

// encodeWithMetadata marshals v (a struct encoding to a JSON object) without HTML escaping and
// appends "metadata": raw before the closing brace, raw kept byte for byte unless it holds a
// newline (then it is compacted).
func encodeWithMetadata(v any, raw json.RawMessage) ([]byte, error) {
	b, err := marshalNoEscape(v)
	if err != nil {
		return nil, err
	}
	if raw == nil {
		return b, nil
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("metadata is not valid JSON")
	}
	if bytes.IndexByte(raw, '\n') >= 0 {
		var c bytes.Buffer
		if err := json.Compact(&c, raw); err != nil {
			return nil, fmt.Errorf("compact metadata: %w", err)
		}
		raw = c.Bytes()
	}
	out := make([]byte, 0, len(b)+len(raw)+12)
	out = append(out, b[:len(b)-1]...)
	if len(b) > 2 {
		out = append(out, ',')
	}
	out = append(out, `"metadata":`...)
	out = append(out, raw...)
	out = append(out, '}')
	return out, nil
}

func trickyJobs() []Job {
	f := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	seed := int64(-9223372036854775808)
	return []Job{
		{CustomID: "a"},
		{CustomID: "q\"uote\\\x00\x1f\b\f\n\r\t\x7f<>&\u2028\u2029é漢🙂\xff", Format: FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
			Messages: []Message{{Role: RoleSystem, Content: "<|im_start|>sys & \"x\""}, {Role: RoleUser, Content: "line\nbreak\u2028"}},
			Thinking: true, ReasoningEffort: "high", NumSamples: 4, PromptLogprobs: true, TopKPromptLogprobs: 20, OpenAILogprobs: true,
			Params: SamplingParams{MaxTokens: i(256), Seed: &seed, Stop: Stop{Strings: []string{"\n\n", "</s>"}},
				Temperature: f(0.7), TopK: i(-1), TopP: f(0.95)},
			Metadata: json.RawMessage(`{"k": [1, 2],   "s":"v"}`)},
		{CustomID: "t", ModelPath: "tinker://run/sampler_weights/1", PromptTokens: []int{151644, -1, 0}, NumSamples: 1,
			Params:   SamplingParams{Stop: Stop{TokenIDs: []int{151645}}, Temperature: f(0)},
			Metadata: json.RawMessage("{\n  \"pretty\": true\n}")},
		{CustomID: "p", Prompt: "x", Params: SamplingParams{TopP: f(1e-7)}, Metadata: json.RawMessage(`null`)},
		{CustomID: "e", Prompt: "y", Params: SamplingParams{Temperature: f(1e21), TopP: f(123456789.125)}, Metadata: json.RawMessage(`"s"`)},
		{CustomID: "z", Prompt: "z", Params: SamplingParams{Temperature: f(math.Copysign(0, -1)), TopK: i(5)}, PromptTokens: []int{}, Messages: []Message{}},
		{CustomID: "s", Prompt: "s", Params: SamplingParams{Seed: &seed}},
	}
}

func TestJobAppendJSONMatchesEncodingJSON(t *testing.T) {
	for k, j := range trickyJobs() {
		want, err := referenceJobEncode(j)
		if err != nil {
			t.Fatalf("%d: reference: %v", k, err)
		}
		got, err := j.Encode()
		if err != nil {
			t.Fatalf("%d: Encode: %v", k, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%d:\n got %s\nwant %s", k, got, want)
		}
		got, err = j.AppendJSON([]byte("prefix:"))
		if err != nil || string(got) != "prefix:"+string(want) {
			t.Errorf("%d: AppendJSON onto a prefix: %q, %v", k, got, err)
		}
	}
}

func TestJobAppendJSONRejectsWhatIsNotJSON(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(-1)
	for _, j := range []Job{
		{CustomID: "m", Metadata: json.RawMessage(`{"open":`)},
		{CustomID: "n", Params: SamplingParams{Temperature: &nan}},
		{CustomID: "i", Params: SamplingParams{TopP: &inf}},
	} {
		if b, err := j.Encode(); err == nil {
			t.Errorf("job %s encoded as %s", j.CustomID, b)
		}
	}
}

func FuzzJobJSON(f *testing.F) {
	f.Add("id", "m", "prompt", "sys", "<|im_end|>", []byte{1, 2}, uint64(0x3fe6666666666666), []byte(`{"a":1}`), uint8(0))
	f.Add("\xff\u2028\"", "", "", "\x00\n<>&", "", []byte{}, math.Float64bits(1e-9), []byte("[1,\n2]"), uint8(0xff))
	f.Fuzz(func(t *testing.T, id, model, prompt, content, stop string, toks []byte, fBits uint64, meta []byte, flags uint8) {
		v := math.Float64frombits(fBits)
		mt, seed := int(fBits>>40), int64(fBits)
		j := Job{CustomID: id, Model: model, Prompt: prompt, NumSamples: int(flags), Thinking: flags&1 != 0,
			PromptLogprobs: flags&2 != 0, TopKPromptLogprobs: int(flags >> 4), OpenAILogprobs: flags&8 != 0}
		for _, c := range toks {
			j.PromptTokens = append(j.PromptTokens, int(c)*1000-5)
		}
		if content != "" {
			j.Messages = []Message{{Role: RoleUser, Content: content}, {Role: RoleAssistant, Content: stop}}
		}
		if flags&4 != 0 {
			j.Params = SamplingParams{MaxTokens: &mt, Seed: &seed, Temperature: &v}
		}
		if flags&8 != 0 {
			j.Params.TopP, j.Params.TopK = &v, &mt
			if stop != "" {
				j.Params.Stop.Strings = []string{stop}
			} else {
				j.Params.Stop.TokenIDs = j.PromptTokens
			}
		}
		if json.Valid(meta) {
			j.Metadata = meta
		}
		want, werr := referenceJobEncode(j)
		got, err := j.Encode()
		if (werr == nil) != (err == nil) {
			t.Fatalf("Encode: %v; reference: %v", err, werr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("\n got %s\nwant %s", got, want)
		}
	})
}

// BenchmarkJobEncode measures Job.Encode on the jobs genLine's lines read into (native and
// OpenAI, about 250 bytes each): submit encodes one per line. One op is one job.
func BenchmarkJobEncode(b *testing.B) {
	var js []Job
	for i := range 64 {
		r := NewReader(bytes.NewReader([]byte(genLine(i)+"\n")), "bench.jsonl", Limits{})
		j, err := r.Next()
		if err != nil {
			b.Fatal(err)
		}
		js = append(js, j)
	}
	for _, c := range []struct {
		name   string
		encode func(Job) ([]byte, error)
	}{{"AppendJSON", Job.Encode}, {"encoding-json", referenceJobEncode}} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, err := c.encode(js[i%len(js)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package jobs

import (
	"reflect"
	"strings"
	"testing"
)

func TestOpenAIMapping(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line string
		want Job
	}{
		{
			name: "chat with n, stop list, seed and metadata",
			line: `{"custom_id":"c1","method":"POST","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":100,"temperature":0.5,"top_p":0.9,"n":3,"stop":["\n","END"],"seed":-7,"metadata":{"k": "v"}}}`,
			want: Job{
				CustomID: "c1", Format: FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
				Messages:   []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}},
				NumSamples: 3,
				Params: SamplingParams{MaxTokens: intp(100), Temperature: floatp(0.5), TopP: floatp(0.9),
					Seed: int64p(-7), Stop: Stop{Strings: []string{"\n", "END"}}},
				Metadata: []byte(`{"k": "v"}`),
			},
		},
		{
			name: "chat max_completion_tokens, developer role, text parts, ignored and default fields",
			line: `{"custom_id":"c2","url":"/v1/chat/completions","body":{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"developer","content":"Rules."},{"role":"user","content":[{"type":"text","text":"part one"},{"type":"text","text":"part two"}]}],"max_completion_tokens":64,"user":"u-1","store":false,"service_tier":"auto","logprobs":true,"top_logprobs":0,"stream":false,"frequency_penalty":0,"presence_penalty":0.0,"logit_bias":{},"response_format":{"type":"text"},"modalities":["text"],"seed":null,"stop":null}}`,
			want: Job{
				CustomID: "c2", Format: FormatOpenAIChat, Model: "meta-llama/Llama-3.1-8B-Instruct",
				Messages:   []Message{{Role: "system", Content: "Rules."}, {Role: "user", Content: "part one\npart two"}},
				NumSamples: 1,
				Params:     SamplingParams{MaxTokens: intp(64)}, OpenAILogprobs: true,
			},
		},
		{
			name: "chat logprobs false, and completions logprobs null: OpenAI's defaults, no logprobs",
			line: `{"custom_id":"c7","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"logprobs":false}}`,
			want: Job{CustomID: "c7", Format: FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
				Messages: []Message{{Role: "user", Content: "Hi"}}, NumSamples: 1},
		},
		{
			name: "completions logprobs null",
			line: `{"custom_id":"p3","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":"Once","logprobs":null}}`,
			want: Job{CustomID: "p3", Format: FormatOpenAICompletions, Model: "Qwen/Qwen3-8B", Prompt: "Once", NumSamples: 1,
				Params: SamplingParams{MaxTokens: intp(16)}},
		},
		{
			name: "chat with the bookkeeping fields that replace user (safety_identifier, prompt_cache_key)",
			line: `{"custom_id":"c6","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":8,"safety_identifier":"u-9f2c","prompt_cache_key":"eval-v2","prompt_cache_retention":"24h"}}`,
			want: Job{CustomID: "c6", Format: FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
				Messages: []Message{{Role: "user", Content: "Hi"}}, NumSamples: 1, Params: SamplingParams{MaxTokens: intp(8)}},
		},
		{
			name: "chat with the thinking switch (vLLM's chat_template_kwargs)",
			line: `{"custom_id":"c3","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"enable_thinking":true}}}`,
			want: Job{CustomID: "c3", Format: FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
				Messages: []Message{{Role: "user", Content: "Hi"}}, Thinking: true, NumSamples: 1},
		},
		{
			name: "chat with the thinking switch spelled as DeepSeek's template does",
			line: `{"custom_id":"c4","url":"/v1/chat/completions","body":{"model":"deepseek-ai/DeepSeek-V3.1","messages":[{"role":"user","content":"Hi"}],"chat_template_kwargs":{"thinking":true}}}`,
			want: Job{CustomID: "c4", Format: FormatOpenAIChat, Model: "deepseek-ai/DeepSeek-V3.1",
				Messages: []Message{{Role: "user", Content: "Hi"}}, Thinking: true, NumSamples: 1},
		},
		{
			name: "chat with a reasoning effort (gpt-oss)",
			line: `{"custom_id":"c5","url":"/v1/chat/completions","body":{"model":"openai/gpt-oss-20b","messages":[{"role":"user","content":"Hi"}],"reasoning_effort":"high"}}`,
			want: Job{CustomID: "c5", Format: FormatOpenAIChat, Model: "openai/gpt-oss-20b",
				Messages: []Message{{Role: "user", Content: "Hi"}}, ReasoningEffort: "high", NumSamples: 1},
		},
		{
			name: "completions string prompt with stop string, top_k and best_of = n",
			line: `{"custom_id":"p1","method":"POST","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":"Once upon","max_tokens":10,"stop":"\n","top_k":40,"n":2,"best_of":2,"echo":false,"suffix":null,"logprobs":0}}`,
			want: Job{
				CustomID: "p1", Format: FormatOpenAICompletions, Model: "Qwen/Qwen3-8B", Prompt: "Once upon",
				NumSamples:     2,
				Params:         SamplingParams{MaxTokens: intp(10), TopK: intp(40), Stop: Stop{Strings: []string{"\n"}}},
				OpenAILogprobs: true,
			},
		},
		{
			name: "an answer written back as OpenAI writes it, and fields a client left unset as null",
			line: `{"custom_id":"c9","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi","name":null},{"role":"assistant","content":"Hello!","refusal":null},{"role":"user","content":"Again"}],"tools":null,"tool_choice":null,"stream_options":null}}`,
			want: Job{
				CustomID: "c9", Format: FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
				Messages:   []Message{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello!"}, {Role: "user", Content: "Again"}},
				NumSamples: 1,
			},
		},
		{
			name: "messages with a name, which OpenAI takes and the chat templates tinkerfleet renders leave out (as vLLM does)",
			line: `{"custom_id":"c11","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"system","name":"rules","content":"Be brief."},{"role":"user","name":"alice","content":"Hi"},{"role":"assistant","name":"bot","content":"Hello!"},{"role":"user","content":"Again","name":"bob"}]}}`,
			want: Job{
				CustomID: "c11", Format: FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
				Messages: []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"},
					{Role: "assistant", Content: "Hello!"}, {Role: "user", Content: "Again"}},
				NumSamples: 1,
			},
		},
		{
			name: "the other endpoint's fields as null, which a client that writes every field writes",
			line: `{"custom_id":"c10","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"prompt":null,"echo":null,"suffix":null,"best_of":null}}`,
			want: Job{CustomID: "c10", Format: FormatOpenAIChat, Model: "Qwen/Qwen3-8B",
				Messages: []Message{{Role: "user", Content: "Hi"}}, NumSamples: 1},
		},
		{
			name: "a completion with the chat endpoint's fields as null",
			line: `{"custom_id":"p2","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":"Once","messages":null,"max_completion_tokens":null,"top_logprobs":null,"chat_template_kwargs":null,"reasoning_effort":null,"response_format":null}}`,
			want: Job{CustomID: "p2", Format: FormatOpenAICompletions, Model: "Qwen/Qwen3-8B", Prompt: "Once", NumSamples: 1,
				Params: SamplingParams{MaxTokens: intp(16)}},
		},
		{
			name: "completions top_k 0, vLLM's no limit",
			line: `{"custom_id":"p0","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":"Once","top_k":0}}`,
			want: Job{CustomID: "p0", Format: FormatOpenAICompletions, Model: "Qwen/Qwen3-8B", Prompt: "Once", NumSamples: 1,
				Params: SamplingParams{MaxTokens: intp(16), TopK: intp(-1)}},
		},
		{
			name: "completions list of one string",
			line: `{"custom_id":"p2","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":["Only one"]}}`,
			want: Job{CustomID: "p2", Format: FormatOpenAICompletions, Model: "Qwen/Qwen3-8B", Prompt: "Only one", NumSamples: 1,
				Params: SamplingParams{MaxTokens: intp(16)}},
		},
		{
			name: "completions token ids and stop token ids",
			line: `{"custom_id":"p3","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":[151644,872,198],"stop":[151645]}}`,
			want: Job{CustomID: "p3", Format: FormatOpenAICompletions, Model: "Qwen/Qwen3-8B", PromptTokens: []int{151644, 872, 198},
				NumSamples: 1, Params: SamplingParams{MaxTokens: intp(16), Stop: Stop{TokenIDs: []int{151645}}}},
		},
		{
			name: "completions without max_tokens: OpenAI's (and vLLM's) default of 16",
			line: `{"custom_id":"p5","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":"Once upon"}}`,
			want: Job{CustomID: "p5", Format: FormatOpenAICompletions, Model: "Qwen/Qwen3-8B", Prompt: "Once upon", NumSamples: 1,
				Params: SamplingParams{MaxTokens: intp(16)}},
		},
		{
			name: "completions max_tokens null, which asks for the default",
			line: `{"custom_id":"p6","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":"Once upon","max_tokens":null}}`,
			want: Job{CustomID: "p6", Format: FormatOpenAICompletions, Model: "Qwen/Qwen3-8B", Prompt: "Once upon", NumSamples: 1,
				Params: SamplingParams{MaxTokens: intp(16)}},
		},
		{
			name: "completions list of one token list, tinker model path",
			line: `{"custom_id":"p4","url":"/v1/completions","body":{"model":"tinker://s:train:0/sampler_weights/final","prompt":[[1,2]],"max_tokens":5.0}}`,
			want: Job{CustomID: "p4", Format: FormatOpenAICompletions, ModelPath: "tinker://s:train:0/sampler_weights/final",
				PromptTokens: []int{1, 2}, NumSamples: 1, Params: SamplingParams{MaxTokens: intp(5)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			items, err := readString(t, tt.line+"\n", Limits{})
			mustEOF(t, err)
			if len(items) != 1 || items[0].lerr != nil {
				t.Fatalf("got %+v", items)
			}
			got := items[0].job
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tt.want)
			}
			// The normalized job survives the NATS encoding and validates again with the
			// OpenAI field names.
			b, err := got.Encode()
			if err != nil {
				t.Fatal(err)
			}
			back, err := DecodeJob(b)
			if err != nil {
				t.Fatalf("DecodeJob(%s): %v", b, err)
			}
			if !reflect.DeepEqual(back, got) {
				t.Fatalf("round trip changed the job:\n%+v\n%+v", back, got)
			}
			if err := back.Validate(Limits{}); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

// TestValidateNamesFieldsByFormat checks that a worker re-validating a decoded OpenAI job reports
// the OpenAI field name.
func TestValidateNamesFieldsByFormat(t *testing.T) {
	t.Parallel()
	base := Job{CustomID: "x", Model: "m", Prompt: "p", NumSamples: 20}
	for format, want := range map[string]string{
		FormatNative:            "field num_samples: must be an integer from 1 to 16",
		"":                      "field num_samples: must be an integer from 1 to 16",
		FormatOpenAIChat:        "field body.n: must be an integer from 1 to 16",
		FormatOpenAICompletions: "field body.n: must be an integer from 1 to 16",
	} {
		j := base
		j.Format = format
		if err := j.Validate(Limits{}); err == nil || err.Error() != want {
			t.Errorf("format %q: Validate = %v, want %q", format, err, want)
		}
	}
	j := base
	j.Format = "csv"
	if err := j.Validate(Limits{}); err == nil || !strings.Contains(err.Error(), `unknown format "csv"`) {
		t.Errorf("unknown format: %v", err)
	}
}

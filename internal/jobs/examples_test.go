package jobs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// repoFile is a path relative to the repository root.
func repoFile(parts ...string) string {
	return filepath.Join(append([]string{"..", ".."}, parts...)...)
}

func readFile(t *testing.T, parts ...string) (*Reader, func()) {
	t.Helper()
	f, err := os.Open(repoFile(parts...))
	if err != nil {
		t.Fatal(err)
	}
	return NewReader(f, filepath.Base(f.Name()), Limits{}), func() { _ = f.Close() }
}

func TestExamplePromptsParse(t *testing.T) {
	t.Parallel()
	r, done := readFile(t, "examples", "prompts.jsonl")
	defer done()
	items, err := readAll(t, r)
	mustEOF(t, err)
	if len(items) < 20 {
		t.Fatalf("examples/prompts.jsonl has %d jobs, want about 20", len(items))
	}
	formats := map[string]int{}
	kinds := map[string]int{}
	for _, it := range items {
		if it.lerr != nil {
			t.Errorf("examples/prompts.jsonl: %v", it.lerr)
			continue
		}
		j := it.job
		formats[j.Format]++
		switch {
		case j.Prompt != "":
			kinds["prompt"]++
		case len(j.PromptTokens) > 0:
			kinds["prompt_tokens"]++
		default:
			kinds["messages"]++
		}
		if j.Model != "Qwen/Qwen3-8B" && j.Model != "Qwen/Qwen3-30B-A3B" && j.ModelPath == "" {
			t.Errorf("%s: unexpected model %q", j.CustomID, j.Model)
		}
	}
	for _, f := range []string{FormatNative, FormatOpenAIChat, FormatOpenAICompletions} {
		if formats[f] == 0 {
			t.Errorf("no %s example", f)
		}
	}
	for _, k := range []string{"prompt", "prompt_tokens", "messages"} {
		if kinds[k] == 0 {
			t.Errorf("no %s example", k)
		}
	}
}

// TestExampleBadLines checks that every line of examples/bad.jsonl fails with the documented field.
func TestExampleBadLines(t *testing.T) {
	t.Parallel()
	want := map[int]struct{ field, msg string }{
		2:  {"custom_id", `duplicate "ok-first" (first used on line 1)`},
		3:  {"", "malformed JSON"},
		4:  {"", "must be a JSON object"},
		5:  {"custom_id", "is required"},
		6:  {"priority", "unknown field"},
		7:  {"max_tokens", "sampling_params"},
		8:  {"sampling_params.temperature", "must be a number, not a string"},
		9:  {"sampling_params.max_tokens", "positive integer"},
		10: {"sampling_params.temperature", ">= 0"},
		11: {"sampling_params.top_p", "(0, 1]"},
		12: {"sampling_params.top_k", "-1"},
		13: {"sampling_params.seed", "must be an integer"},
		14: {"sampling_params.stop[1]", "must not mix"},
		15: {"sampling_params.repetition_penalty", "unknown field"},
		16: {"model_path", "together with model"},
		17: {"model", "is required"},
		18: {"model_path", "tinker://"},
		19: {"prompt", "one of prompt, prompt_tokens or messages is required"},
		20: {"messages", "exactly one of"},
		21: {"prompt", "must not be empty"},
		22: {"prompt_tokens[1]", "token id"},
		23: {"messages[0].role", "narrator"},
		24: {"num_samples", "from 1 to 16"},
		25: {"topk_prompt_logprobs", "0 to 20"},
		26: {"custom_id", "appears more than once"},
		28: {"url", "must be"},
		29: {"method", "POST"},
		30: {"body.tools", "not supported"},
		31: {"body.logit_bias", "default {}"},
		32: {"body.max_completion_tokens", "together with body.max_tokens"},
		33: {"body.n", "from 1 to 16"},
		34: {"body.prompt", "several prompts"},
		35: {"body.messages", "not valid for /v1/completions"},
		36: {"body.messages[0].content[0].type", "only text content parts"},
		37: {"body.stream", "default false"},
		38: {"model", "OpenAI batch line"},
	}
	r, done := readFile(t, "examples", "bad.jsonl")
	defer done()
	items, err := readAll(t, r)
	mustEOF(t, err)
	seen := map[int]bool{}
	for _, it := range items {
		if it.lerr == nil {
			if it.line != 1 {
				t.Errorf("bad.jsonl:%d accepted (%s)", it.line, it.job.CustomID)
			}
			continue
		}
		w, ok := want[it.line]
		if !ok {
			t.Errorf("unexpected error %v", it.lerr)
			continue
		}
		seen[it.line] = true
		if it.lerr.File != "bad.jsonl" || it.lerr.Field != w.field || !strings.Contains(it.lerr.Msg, w.msg) {
			t.Errorf("got %v, want field %q with %q", it.lerr, w.field, w.msg)
		}
	}
	for line := range want {
		if !seen[line] {
			t.Errorf("bad.jsonl:%d produced no error", line)
		}
	}
}

func TestSchemaExamplesParse(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"job-native.jsonl", "job-openai.jsonl"} {
		r, done := readFile(t, "schemas", "examples", name)
		items, err := readAll(t, r)
		done()
		mustEOF(t, err)
		if len(items) == 0 {
			t.Errorf("%s is empty", name)
		}
		for _, it := range items {
			if it.lerr != nil {
				t.Errorf("%v", it.lerr)
			}
		}
	}
	data, err := os.ReadFile(repoFile("schemas", "examples", "result.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	statuses := map[Status]bool{}
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		r, err := DecodeResult([]byte(line))
		if err != nil {
			t.Errorf("result.jsonl:%d: %v", i+1, err)
			continue
		}
		statuses[r.Status] = true
	}
	if len(statuses) != 3 {
		t.Errorf("result examples cover statuses %v, want all three", statuses)
	}
}

// TestSchemaFiles checks that the schemas are JSON Schema 2020-12 documents with the expected
// required fields, and that their embedded examples parse with this package.
func TestSchemaFiles(t *testing.T) {
	t.Parallel()
	type schema struct {
		Schema   string            `json:"$schema"`
		Required []string          `json:"required"`
		Defs     map[string]schema `json:"$defs"`
		Props    map[string]any    `json:"properties"`
		Examples []json.RawMessage `json:"examples"`
	}
	load := func(name string) schema {
		b, err := os.ReadFile(repoFile("schemas", name))
		if err != nil {
			t.Fatal(err)
		}
		var s schema
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Schema != "https://json-schema.org/draft/2020-12/schema" {
			t.Errorf("%s: $schema = %q", name, s.Schema)
		}
		return s
	}
	job := load("job.schema.json")
	native, openai := job.Defs["native"], job.Defs["openai"]
	if !reflect.DeepEqual(native.Required, []string{"custom_id"}) {
		t.Errorf("native required = %v", native.Required)
	}
	if !reflect.DeepEqual(openai.Required, []string{"custom_id", "url", "body"}) {
		t.Errorf("openai required = %v", openai.Required)
	}
	for _, p := range []string{"custom_id", "model", "model_path", "prompt", "prompt_tokens", "messages",
		"thinking", "sampling_params", "num_samples", "prompt_logprobs", "topk_prompt_logprobs", "metadata"} {
		if _, ok := native.Props[p]; !ok {
			t.Errorf("native schema lacks %s", p)
		}
	}
	var lines []string
	for _, ex := range append(native.Examples, openai.Examples...) {
		lines = append(lines, string(ex))
	}
	items, err := readString(t, strings.Join(lines, "\n"), Limits{})
	mustEOF(t, err)
	if len(items) != len(lines) {
		t.Fatalf("%d outcomes for %d schema examples", len(items), len(lines))
	}
	for _, it := range items {
		if it.lerr != nil {
			t.Errorf("job schema example: %v", it.lerr)
		}
	}

	res := load("result.schema.json")
	if !reflect.DeepEqual(res.Required, []string{"custom_id", "batch_id", "status", "attempts", "latency_ms"}) {
		t.Errorf("result required = %v", res.Required)
	}
	for _, ex := range res.Examples {
		if _, err := DecodeResult(ex); err != nil {
			t.Errorf("result schema example: %v", err)
		}
	}

}

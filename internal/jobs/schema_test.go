package jobs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"os"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// compileSchema compiles schemas/NAME, with its formats asserted.
func compileSchema(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	s, err := c.Compile(repoFile("schemas", name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

// followsSchema validates one JSON document against s.
func followsSchema(s *jsonschema.Schema, doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

// TestSchemasTakeWhatTheCodeTakesAndWrites: every valid example line (examples/, the schemas'
// own examples) follows job.schema.json, and the result lines the code writes, of every kind,
// follow result.schema.json (native) and openai-result.schema.json (AppendOpenAI), as a
// full JSON Schema 2020-12 validator reads them.
func TestSchemasTakeWhatTheCodeTakesAndWrites(t *testing.T) {
	t.Parallel()
	job, result, openai := compileSchema(t, "job.schema.json"), compileSchema(t, "result.schema.json"), compileSchema(t, "openai-result.schema.json")
	for _, file := range [][]string{{"examples", "prompts.jsonl"}, {"schemas", "examples", "job-native.jsonl"}, {"schemas", "examples", "job-openai.jsonl"}} {
		eachLine(t, file, func(n int, line []byte) {
			if err := followsSchema(job, line); err != nil {
				t.Errorf("%s:%d: %v", file[len(file)-1], n, err)
			}
		})
	}
	eachLine(t, []string{"schemas", "examples", "result.jsonl"}, func(n int, line []byte) {
		if err := followsSchema(result, line); err != nil {
			t.Errorf("result.jsonl:%d: %v", n, err)
		}
	})

	usage := &Usage{PromptTokens: 12, CompletionTokens: 5, CacheHitTokens: 4}
	samples := []Sample{
		{Text: "<think>\nhm\n</think>\n\nParis.", Tokens: []int{1, 2, 3}, Logprobs: Logprobs{-0.5, -1, math.Inf(-1)}, StopReason: StopReasonStop},
		{Text: "", Tokens: []int{}, StopReason: StopReasonLength},
	}
	var results []Result
	for _, format := range []string{FormatNative, FormatOpenAIChat, FormatOpenAICompletions} {
		ok := Result{CustomID: "ok-" + format, BatchID: "b-1", Status: StatusOK, Model: "Qwen/Qwen3-8B", Format: ResultFormat(format),
			Samples: samples, Usage: usage, Attempts: 1, LatencyMS: 1200, Metadata: json.RawMessage(`{"k":[1,"v"]}`),
			PromptLogprobs: Logprobs{math.NaN(), -1.25}, TopKPromptLogprobs: [][]TokenLogprob{nil, {{Token: 7, Logprob: -0.1}}}}
		results = append(results, ok)
		for _, code := range []string{CodeAPIError, CodeContextTooLong, CodeDeadLetter, CodeFailedFuture, CodeInternal,
			CodeInvalidJob, CodeRateLimited, CodeTimeout, CodeTokenize} {
			r := Result{CustomID: code + "-" + format, BatchID: "b-1", Status: StatusError, Model: "Qwen/Qwen3-8B", Format: ResultFormat(format),
				Error: &ResultError{Code: code, Message: "what went wrong", Category: CategoryUser, Retryable: code == CodeDeadLetter}}
			results = append(results, r)
		}
		results = append(results, Result{CustomID: "cancelled-" + format, BatchID: "b-1", Status: StatusCancelled, Model: "Qwen/Qwen3-8B", Format: ResultFormat(format),
			Error: &ResultError{Code: CodeCancelled, Message: "batch cancelled", Category: CategoryUser}})
	}
	created := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for _, r := range results {
		native, err := r.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := followsSchema(result, native); err != nil {
			t.Errorf("result line %s: %v", native, err)
		}
		line, err := r.AppendOpenAI(nil, created)
		if err != nil {
			t.Fatal(err)
		}
		if err := followsSchema(openai, line); err != nil {
			t.Errorf("OpenAI result line %s: %v", line, err)
		}
	}
}

// eachLine calls f with every non-blank line of the repository file at parts.
func eachLine(t *testing.T, parts []string, f func(n int, line []byte)) {
	t.Helper()
	data, err := os.ReadFile(repoFile(parts...))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			f(n, sc.Bytes())
		}
	}
}

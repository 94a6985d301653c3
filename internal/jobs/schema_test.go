package jobs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
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
		// Asked for logprobs in OpenAI's format: with token bytes (a part of a character, a NaN
		// and an -inf logprob among them), and without them (no tokenizer).
		ok.CustomID, ok.OpenAILogprobs = "logprobs-"+format, true
		ok.Samples = []Sample{
			{Text: "a你", Tokens: []int{1, 2, 3}, Logprobs: Logprobs{-0.5, math.NaN(), math.Inf(-1)},
				TokenBytes: TokenBytes{[]byte("a"), {0xe4, 0xbd}, {0xa0}}, StopReason: StopReasonStop},
			{Text: "", Tokens: []int{4}, Logprobs: Logprobs{-2}, StopReason: StopReasonLength},
			{Text: "", Tokens: []int{}, StopReason: StopReasonLength},
		}
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

// TestJobSchemaAgreesWithTheReader takes valid lines of every kind (native prompt, tokens,
// chat; OpenAI completions and chat, with every body field the rule names) and varies them one
// place at a time: every value replaced by each of many values, every key left out, keys of
// the other formats and unknown ones added. The reader must take a line exactly when
// job.schema.json does, but for what the schema says it cannot say.
func TestJobSchemaAgreesWithTheReader(t *testing.T) {
	t.Parallel()
	schema := compileSchema(t, "job.schema.json")
	bases := []string{
		`{"custom_id":"a","model":"Qwen/Qwen3-8B","prompt":"hi","sampling_params":{"max_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":4,"seed":3,"stop":["x"]},"num_samples":2,"prompt_logprobs":true,"topk_prompt_logprobs":2,"metadata":{"a":1}}`,
		`{"custom_id":"a","model_path":"tinker://a/b","prompt_tokens":[1,2],"sampling_params":{"stop":[5]}}`,
		`{"custom_id":"a","model":"openai/gpt-oss-20b","messages":[{"role":"user","content":"hi"}],"thinking":false,"reasoning_effort":"low"}`,
		`{"custom_id":"a","model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"hi"}],"thinking":true}`,
		`{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":"hi","max_tokens":5,"temperature":1,"top_p":1,"top_k":0,"n":2,"best_of":2,"stop":"x","seed":1,"metadata":null,"user":"u","store":true,"service_tier":"auto","stream":false,"frequency_penalty":0,"presence_penalty":0,"logit_bias":{},"logprobs":0,"echo":false,"suffix":""}}`,
		`{"custom_id":"a","url":"/v1/completions","body":{"model":"tinker://x/y","prompt":[[1,2]]}}`,
		`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"developer","content":[{"type":"text","text":"a"}]},{"role":"user","content":"b","name":null}],"max_completion_tokens":5,"logprobs":true,"top_logprobs":0,"response_format":{"type":"text"},"chat_template_kwargs":{"enable_thinking":true},"reasoning_effort":"high","n":3,"stop":[1,2]}}`,
	}
	values := []string{
		`null`, `true`, `false`, `0`, `-1`, `1`, `2`, `0.5`, `1.0`, `1e2`, `-0.0`, `16`, `17`, `20`, `21`, `32768`, `32769`,
		`2147483647`, `2147483648`, `9223372036854775807`, `9223372036854775808`, `-9223372036854775809`,
		`""`, `"a"`, `"x y"`, `"a\u0085b"`, `"a\u0000b"`, `"tinker://"`, `"tinker://a"`, `"low"`, `"text"`, `"POST"`, `"post"`,
		`"/v1/completions"`, `"/v1/chat/completions"`, `"user"`, `"developer"`, `"system"`, `"tool"`,
		`[]`, `[1]`, `[-1]`, `[1.5]`, `[""]`, `["a"]`, `["a",1]`, `[1,"a"]`, `[[1]]`, `[[]]`, `[["a"]]`, `["a","b"]`, `[[1],[2]]`, `[null]`, `["text"]`, `["text","audio"]`, `["text","text"]`,
		`{}`, `{"type":"text"}`, `{"type":"json_object"}`, `{"type":"text","x":null}`, `{"a":null}`,
		`[{"role":"user","content":"hi"}]`, `[{"role":"user","content":null}]`, `[{"type":"text","text":"a"}]`, `[{"type":"image_url","text":"a"}]`,
		`{"enable_thinking":true}`, `{"enable_thinking":null}`, `{"enable_thinking":true,"thinking":true}`, `{"max_tokens":5}`,
	}
	added := []string{`null`, `1`, `0`, `"a"`, `true`, `false`, `{}`, `[]`}
	keys := []string{"x", "model", "model_path", "prompt", "prompt_tokens", "messages", "thinking", "reasoning_effort",
		"sampling_params", "num_samples", "prompt_logprobs", "topk_prompt_logprobs", "metadata", "format", "body", "url", "method",
		"max_tokens", "max_completion_tokens", "n", "best_of", "echo", "suffix", "logprobs", "top_logprobs", "response_format",
		"modalities", "chat_template_kwargs", "stream", "tools", "refusal", "name", "role", "content", "type", "text", "enable_thinking", "custom_id"}
	// What the schema says it cannot say: best_of equal to n, a string that escapes a lone
	// surrogate; and a number past float64's range, which the validator takes as a number.
	cannotSay := []string{"best_of: is only accepted when it is 1 or equal to n", "escapes a lone surrogate", "is out of range"}

	seen := map[string]bool{}
	check := func(doc any) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(doc); err != nil {
			t.Fatal(err)
		}
		line := bytes.TrimSpace(buf.Bytes())
		if seen[string(line)] {
			return
		}
		seen[string(line)] = true
		j, names, fe := parseLine(line) // as the Reader does
		if fe == nil {
			fe = j.validate(DefaultLimits(), &names)
		}
		schemaErr := followsSchema(schema, line)
		switch {
		case fe == nil && schemaErr != nil:
			t.Errorf("the reader takes %s, the schema does not: %v", line, schemaErr)
		case fe != nil && schemaErr == nil:
			for _, s := range cannotSay {
				if strings.Contains(fe.Error(), s) {
					return
				}
			}
			t.Errorf("the schema takes %s, the reader does not: %v", line, fe)
		}
	}
	// vary calls check with each one-place variation of v; set puts a new value in v's place
	// and returns the whole line.
	var vary func(v any, set func(any) any)
	vary = func(v any, set func(any) any) {
		for _, raw := range values {
			check(set(json.RawMessage(raw)))
		}
		switch v := v.(type) {
		case map[string]any:
			with := func(k string, nv any) any {
				m := maps.Clone(v)
				if nv == nil {
					delete(m, k)
				} else {
					m[k] = nv
				}
				return set(m)
			}
			for k, kv := range v {
				check(with(k, nil))
				vary(kv, func(nv any) any { return with(k, nv) })
			}
			for _, k := range keys {
				if _, ok := v[k]; !ok {
					for _, raw := range added {
						check(with(k, json.RawMessage(raw)))
					}
				}
			}
		case []any:
			for i := range v {
				vary(v[i], func(nv any) any {
					s := slices.Clone(v)
					s[i] = nv
					return set(s)
				})
			}
		}
	}
	for _, base := range bases {
		dec := json.NewDecoder(strings.NewReader(base))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		vary(v, func(nv any) any { return nv })
	}
	if len(seen) < 10000 {
		t.Fatalf("only %d lines checked", len(seen))
	}
}

// TestResultLinesFollowTheSchemas writes many random results (ok with any number of samples,
// texts that reason first or not, logprobs with NaN and infinities, top-k rows; errors of
// every code and category; cancelled; native, chat and completions formats; odd metadata) as
// the worker does, reads each back as submit does and writes it as an OpenAI Batch output
// line: every line must follow result.schema.json or openai-result.schema.json.
func TestResultLinesFollowTheSchemas(t *testing.T) {
	t.Parallel()
	result, openai := compileSchema(t, "result.schema.json"), compileSchema(t, "openai-result.schema.json")
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(n int) int { return rng.IntN(n) }
	texts := []string{"", "plain", "<think>\nhm\n</think>\n\nParis", "<think>\nunfinished", "a</think>b",
		"<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y", "<|channel|>analysis",
		"<|channel|>final<|message|>z<|return|>", "\xff\xfe cut", "\u2028 \u0000 \"q\" \\ <>&"}
	models := []string{"Qwen/Qwen3-8B", "deepseek-ai/DeepSeek-V3.1", "openai/gpt-oss-20b", "tinker://a/b", ""}
	floats := []float64{0, -0.5, math.NaN(), math.Inf(-1), math.Inf(1), -1e-40, -1e300, 1e300, -3.5e38, math.Copysign(0, -1)}
	codes := []string{CodeAPIError, CodeContextTooLong, CodeDeadLetter, CodeFailedFuture, CodeInternal, CodeInvalidJob,
		CodeRateLimited, CodeTimeout, CodeTokenize}
	categories := []Category{CategoryUser, CategoryServer, CategoryUnknown}
	metadata := []json.RawMessage{nil, json.RawMessage(`null`), json.RawMessage(`{"a": [1, 2]}`), json.RawMessage("{\n\"x\":1}"), json.RawMessage(`"s"`)}
	logprobs := func(n int) Logprobs {
		if pick(4) == 0 {
			return nil
		}
		l := make(Logprobs, n)
		for i := range l {
			l[i] = floats[pick(len(floats))]
		}
		return l
	}
	for i := range 3000 {
		r := Result{CustomID: fmt.Sprint("c-", i), BatchID: "b-1", Model: models[pick(len(models))],
			Format: []string{"", FormatOpenAIChat, FormatOpenAICompletions}[pick(3)], Attempts: pick(5),
			LatencyMS: rng.Int64N(1e6), Metadata: metadata[pick(len(metadata))]}
		switch pick(3) {
		case 0:
			r.Status = StatusOK
			for range pick(4) {
				toks := make([]int, pick(4))
				for j := range toks {
					toks[j] = pick(200000)
				}
				r.Samples = append(r.Samples, Sample{Text: texts[pick(len(texts))], Tokens: toks,
					Logprobs: logprobs(len(toks)), StopReason: []string{StopReasonStop, StopReasonLength}[pick(2)]})
			}
			if pick(2) == 0 {
				r.Usage = &Usage{PromptTokens: pick(100), CompletionTokens: pick(100), CacheHitTokens: pick(10)}
			}
			r.PromptLogprobs = logprobs(pick(4))
			for range pick(4) {
				var row []TokenLogprob
				if pick(3) > 0 {
					row = []TokenLogprob{}
					for range pick(3) {
						row = append(row, TokenLogprob{Token: pick(1000), Logprob: floats[pick(len(floats))]})
					}
				}
				r.TopKPromptLogprobs = append(r.TopKPromptLogprobs, row)
			}
		case 1:
			r.Status = StatusError
			r.Error = &ResultError{Code: codes[pick(len(codes))], Message: texts[pick(len(texts))],
				Category: categories[pick(len(categories))], Retryable: pick(2) == 0}
		default:
			r.Status = StatusCancelled
			r.Error = &ResultError{Code: CodeCancelled, Message: "batch cancelled", Category: CategoryUser}
		}
		native, err := r.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := followsSchema(result, native); err != nil {
			t.Fatalf("result line %s: %v", native, err)
		}
		back, err := DecodeResult(native)
		if err != nil {
			t.Fatalf("result line %s: %v", native, err)
		}
		line, err := back.AppendOpenAI(nil, time.Unix(rng.Int64N(2e9), 0))
		if err != nil {
			t.Fatal(err)
		}
		if err := followsSchema(openai, line); err != nil {
			t.Fatalf("OpenAI result line %s: %v", line, err)
		}
	}
}

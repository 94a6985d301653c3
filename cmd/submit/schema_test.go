package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// loadSchema reads schemas/NAME as generic JSON.
func loadSchema(t *testing.T, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "schemas", name))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if s["$schema"] != "https://json-schema.org/draft/2020-12/schema" {
		t.Errorf("%s: $schema = %v", name, s["$schema"])
	}
	return s
}

// jsonFields lists the JSON names of typ's fields (those of embedded structs in place) and
// those always written (no omitempty or omitzero).
func jsonFields(typ reflect.Type) (all, always []string) {
	for f := range typ.Fields() {
		if f.Anonymous {
			a, w := jsonFields(f.Type)
			all, always = append(all, a...), append(always, w...)
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
			always = append(always, name)
		}
	}
	return all, always
}

// compileSchema compiles schemas/NAME, with its formats (date-time) asserted.
func compileSchema(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	s, err := c.Compile(filepath.Join("..", "..", "schemas", name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s
}

// validLine validates one JSON document against s.
func validLine(s *jsonschema.Schema, line []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(line))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

func keys(m any) []string {
	var k []string
	for name := range m.(map[string]any) {
		k = append(k, name)
	}
	slices.Sort(k)
	return k
}

func strs(v any) []string {
	var s []string
	for _, x := range v.([]any) {
		s = append(s, x.(string))
	}
	slices.Sort(s)
	return s
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// TestOutputSchemasNameTheStructsFields checks that the schemas of the rejects file and of
// status and list --json name exactly the fields of the structs written, and require those
// written always.
func TestOutputSchemasNameTheStructsFields(t *testing.T) {
	t.Parallel()
	rejects, status, list := loadSchema(t, "rejects.schema.json"), loadSchema(t, "status.schema.json"), loadSchema(t, "list.schema.json")
	check := func(what string, schema map[string]any, typ reflect.Type) {
		t.Helper()
		all, always := jsonFields(typ)
		if got := keys(schema["properties"]); !slices.Equal(got, sorted(all)) {
			t.Errorf("%s: properties %v, %s writes %v", what, got, typ, sorted(all))
		}
		if got := strs(schema["required"]); !slices.Equal(got, sorted(always)) {
			t.Errorf("%s: required %v, %s always writes %v", what, got, typ, sorted(always))
		}
		if schema["additionalProperties"] != false {
			t.Errorf("%s: additionalProperties is not false", what)
		}
	}
	defs := func(s map[string]any, name string) map[string]any {
		return s["$defs"].(map[string]any)[name].(map[string]any)
	}
	check("rejects", rejects, reflect.TypeFor[rejectLine]())
	check("status", status, reflect.TypeFor[batchStatus]())
	check("status workers", status["properties"].(map[string]any)["workers"].(map[string]any), reflect.TypeFor[workerCount]())
	check("status usage", defs(status, "usage"), reflect.TypeFor[queue.Tokens]())
	check("list", list, reflect.TypeFor[listedBatch]())
	manifest := defs(status, "manifest")
	if !reflect.DeepEqual(manifest, defs(list, "manifest")) {
		t.Error("the manifest definitions of status.schema.json and list.schema.json differ")
	}
	all, always := jsonFields(reflect.TypeFor[queue.Manifest]())
	if got := keys(manifest["properties"]); !slices.Equal(got, sorted(all)) {
		t.Errorf("manifest properties %v, queue.Manifest has %v", got, sorted(all))
	}
	if got := strs(manifest["required"]); !slices.Equal(got, sorted(always)) {
		t.Errorf("manifest required %v, queue.Manifest always writes %v", got, sorted(always))
	}
	statuses := manifest["properties"].(map[string]any)["status"].(map[string]any)["enum"]
	if got, want := strs(statuses), sorted([]string{queue.BatchPublishing, queue.BatchSubmitted, queue.BatchCancelled, queue.BatchDeleted}); !slices.Equal(got, want) {
		t.Errorf("manifest status enum %v, want %v", got, want)
	}
	for name, s := range map[string]map[string]any{"rejects": rejects, "status": status, "list": list} {
		compiled := compileSchema(t, name+".schema.json")
		for _, ex := range s["examples"].([]any) {
			b, _ := json.Marshal(ex)
			if err := validLine(compiled, b); err != nil {
				t.Errorf("%s example %s: %v", name, b, err)
			}
		}
	}
	for _, ex := range rejects["examples"].([]any) {
		b, _ := json.Marshal(ex)
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var r rejectLine
		if err := dec.Decode(&r); err != nil {
			t.Errorf("rejects example %s: %v", b, err)
		}
	}
}

// TestOutputsFollowTheirSchemas writes a rejects file, status --json and list --json of
// batches in several states, and validates every line against its schema.
func TestOutputsFollowTheirSchemas(t *testing.T) {
	t.Parallel()
	schemas := map[string]*jsonschema.Schema{}
	for _, name := range []string{"rejects", "status", "list"} {
		schemas[name] = compileSchema(t, name+".schema.json")
	}
	valid := func(name, lines string) {
		t.Helper()
		if strings.TrimSpace(lines) == "" {
			t.Fatalf("no %s output", name)
		}
		for line := range strings.Lines(lines) {
			if err := validLine(schemas[name], []byte(line)); err != nil {
				t.Errorf("%s line %s: %v", name, strings.TrimSpace(line), err)
			}
		}
	}
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 16})
	ctx := context.Background()
	dir := t.TempDir()
	in := writeLines(t, append(jobLines(12),
		`{"custom_id":"job-00000","model":"Qwen/Qwen3-8B","prompt":"again"}`,
		"{not json",
		`{"custom_id":"y","model":"Qwen/Qwen3-8B","prompt":"a","colour":"red"}`,
		"{\"custom_id\":\"u\",\"model\":\"Qwen/Qwen3-8B\",\"prompt\":\"\xff\xfe\"}",
		`{"custom_id":"c","model":"moonshotai/Kimi-K2-Thinking","messages":[{"role":"user","content":"hi"}]}`,
		`[1]`,
	))
	rejects := filepath.Join(dir, "rejects.jsonl")
	mustRun := func(args ...string) string {
		t.Helper()
		stdout, stderr, err := f.submit(ctx, args...)
		if err != nil {
			t.Fatalf("submit %q: %v: %s", args, err, stderr)
		}
		return stdout
	}
	mustRun("--skip-invalid", "--rejects", rejects, "--batch-id", "schema-a", in)
	data, err := os.ReadFile(rejects)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n != 6 {
		t.Fatalf("%d rejects, want 6:\n%s", n, data)
	}
	valid("rejects", string(data))
	valid("status", mustRun("status", "--json", "schema-a")) // no worker yet: activity
	mustRun(writeLines(t, jobLines(5)), "--batch-id", "schema-b")
	mustRun("cancel", "schema-b")
	valid("status", mustRun("status", "--json", "schema-b")) // cancelled, not done
	valid("list", mustRun("list", "--json"))

	f.startWorker(8)
	mustRun("results", "schema-a", "--wait", "-o", filepath.Join(dir, "a.jsonl"))
	mustRun("results", "schema-b", "--wait", "-o", filepath.Join(dir, "b.jsonl"))
	valid("status", mustRun("status", "--json", "schema-a")) // done
	valid("status", mustRun("status", "--json", "schema-b")) // cancelled, done
	mustRun("delete", "schema-b")
	valid("status", mustRun("status", "--json", "schema-b")) // deleted
	valid("list", mustRun("list", "--json"))
}

// TestResultFilesFollowTheirSchemas runs jobs of every kind through a worker and the
// simulator (ok with samples, logprobs, top-k logprobs and several samples, errors of several
// codes, failed futures, cancelled jobs; native and OpenAI lines, some asking for logprobs,
// one of them without a tokenizer) and validates every line
// submit writes, in each --result-format, against result.schema.json or
// openai-result.schema.json.
func TestResultFilesFollowTheirSchemas(t *testing.T) {
	t.Parallel()
	result, openai := compileSchema(t, "result.schema.json"), compileSchema(t, "openai-result.schema.json")
	f := newFleet(t, queue.Config{}, tinkersim.Config{StopTokenProbability: 0.2})
	// Half the samples fail as the service's fault of the request (failed_future).
	if _, err := f.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultFailed, Rate: 0.5, Category: "user", Reason: "bad request <&>"}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("1,", 40) + "2"
	var lines []string
	for i := range 16 { // so many of each that some fail and some do not (all but certainly)
		for _, l := range []string{
			`{"custom_id":"n-logprobs-%d","model":"Qwen/Qwen3-8B","prompt":"The sky is","sampling_params":{"max_tokens":8,"stop":["\n"," the"]},"num_samples":3,"prompt_logprobs":true,"topk_prompt_logprobs":3,"metadata":{"k":[1,"<v>"]}}`,
			`{"custom_id":"n-tokens-%d","model":"Qwen/Qwen3-8B","prompt_tokens":[9707,11,1879],"sampling_params":{"max_tokens":6,"stop":[1000,1001,1002],"seed":7,"temperature":0,"top_k":5,"top_p":0.5},"topk_prompt_logprobs":20,"metadata":null}`,
			`{"custom_id":"n-chat-%d","model":"Qwen/Qwen3-8B","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"thinking":true,"sampling_params":{"max_tokens":1}}`,
			`{"custom_id":"n-long-%d","model":"Qwen/Qwen3-8B","prompt_tokens":[` + long + `],"sampling_params":{"max_tokens":32768}}`,
			`{"custom_id":"n-notok-%d","model":"meta-llama/Llama-3.2-1B","prompt":"no tokenizer offline"}`,
			`{"custom_id":"o-chat-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"developer","content":"Think."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_completion_tokens":12,"n":2,"chat_template_kwargs":{"enable_thinking":true},"metadata":{"m":1},"logprobs":true}}`,
			`{"custom_id":"o-long-%d","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"max_tokens":32768}}`,
			`{"custom_id":"o-cmpl-%d","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":[[9707,11]],"max_tokens":5,"stop":"\n","n":2,"best_of":2,"logprobs":0}}`,
			`{"custom_id":"o-ids-notok-%d","url":"/v1/completions","body":{"model":"meta-llama/Llama-3.2-1B","prompt":[128000,9906],"max_tokens":5,"logprobs":0}}`,
			`{"custom_id":"o-notok-%d","url":"/v1/completions","body":{"model":"meta-llama/Llama-3.2-1B","prompt":"no tokenizer offline","max_tokens":5}}`,
		} {
			lines = append(lines, fmt.Sprintf(l, i))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	in := writeLines(t, lines)
	// A batch cancelled before any worker runs: its jobs end as cancelled results.
	cancelled, stderr, err := f.submit(ctx, in, "--batch-id", "schema-cancelled")
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	if _, stderr, err := f.submit(ctx, "cancel", strings.TrimSpace(cancelled)); err != nil {
		t.Fatalf("cancel: %v: %s", err, stderr)
	}
	f.startWorker(8)
	if _, stderr, err := f.submit(ctx, in, "--batch-id", "schema-done", "-o", filepath.Join(dir, "auto.jsonl")); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	seen := map[string]bool{} // kinds of line met: status, code, format
	check := func(what string, data []byte) {
		t.Helper()
		n := 0
		for line := range strings.Lines(string(data)) {
			n++
			var head struct {
				Status   string                 `json:"status"`
				Format   string                 `json:"format"`
				Error    *struct{ Code string } `json:"error"`
				Response *struct {
					StatusCode int `json:"status_code"`
					Body       struct {
						Object string                 `json:"object"`
						Error  *struct{ Code string } `json:"error"`
					} `json:"body"`
				} `json:"response"`
			}
			if err := json.Unmarshal([]byte(line), &head); err != nil {
				t.Fatalf("%s: %s: %v", what, line, err)
			}
			schema, kind := result, "native "+head.Status+" "+head.Format
			if head.Status == "" {
				schema, kind = openai, "openai"
				if r := head.Response; r != nil {
					kind += fmt.Sprint(" ", r.StatusCode, " ", r.Body.Object)
					if r.Body.Error != nil {
						kind += " " + r.Body.Error.Code
					}
				}
			}
			if head.Error != nil {
				kind += " " + head.Error.Code
			}
			seen[kind] = true
			if err := validLine(schema, []byte(line)); err != nil {
				t.Errorf("%s: %s: %v", what, strings.TrimSpace(line), err)
			}
		}
		if n != len(lines) {
			t.Errorf("%s: %d lines for %d jobs", what, n, len(lines))
		}
	}
	auto, err := os.ReadFile(filepath.Join(dir, "auto.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	check("auto", auto)
	for _, batch := range []string{"schema-done", "schema-cancelled"} {
		for _, format := range []string{"auto", "native", "openai"} {
			stdout, stderr, err := f.submit(ctx, "results", batch, "--wait", "--result-format", format)
			if err != nil {
				t.Fatalf("results %s --result-format %s: %v: %s", batch, format, err, stderr)
			}
			check(batch+" "+format, []byte(stdout))
		}
	}
	kinds := slices.Sorted(maps.Keys(seen))
	for _, want := range []string{"native ok ", "native ok openai-chat", "native ok openai-completions",
		"native error  context_too_long", "native error  tokenize_failed", "native error  failed_future",
		"native error openai-chat context_too_long", "native error openai-completions tokenize_failed",
		"native cancelled  cancelled", "native cancelled openai-chat cancelled",
		"openai 200 chat.completion", "openai 200 text_completion", "openai 400  context_too_long",
		"openai 400  tokenize_failed", "openai 400  failed_future", "openai batch_cancelled"} {
		if !seen[want] {
			t.Errorf("no %q line among %q", want, kinds)
		}
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
)

// TestDryRunCountsWhatABatchAsksAndPublishesNothing: --dry-run validates, counts jobs, samples,
// prompt tokens as the worker sends them (text encoded, token ids as given, chat rendered with
// the template: "Hi" as a Qwen3 user turn is 13 tokens) and the most tokens sampled, per
// model, and needs no NATS server; a bad line, or no job line at all, fails it as a real
// submit would.
func TestDryRunCountsWhatABatchAsksAndPublishesNothing(t *testing.T) {
	t.Parallel()
	lines := []string{
		`{"custom_id":"a","model":"Qwen/Qwen3-8B","prompt":"Hello, world","sampling_params":{"max_tokens":10}}`,
		`{"custom_id":"b","model":"Qwen/Qwen3-8B","prompt_tokens":[9707,11,1879,0,1],"num_samples":3,"sampling_params":{"max_tokens":20}}`,
		`{"custom_id":"c","model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"sampling_params":{"max_tokens":5}}`,
		`{"custom_id":"d","model_path":"tinker://run-1:train:0/sampler_weights/final","prompt":"Hi","sampling_params":{"max_tokens":7}}`,
		`{"custom_id":"e","model":"Qwen/Qwen3-30B-A3B","prompt":"Hi"}`,
	}
	dryRun := func(lines ...string) (string, string, error) {
		var stdout, stderr bytes.Buffer
		env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr}
		err := run(context.Background(), []string{"--dry-run", "--nats-url", fleettest.ClosedURL(t), writeLines(t, lines)}, env)
		return stdout.String(), stderr.String(), err
	}
	out, stderr, err := dryRun(lines...)
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, stderr)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 6 && !strings.HasSuffix(f[0], ":") {
			rows[f[0]] = f[1:]
		}
	}
	for model, want := range map[string]string{
		"Qwen/Qwen3-8B": "3 5 21 13 75", // prompts 3 + 5 + 13 tokens; sampled 10 + 3 x 20 + 5
		"tinker://run-1:train:0/sampler_weights/final": "1 1 - - 7",
		"Qwen/Qwen3-30B-A3B":                           "1 1 1 1 no bound",
		"all":                                          "models 5 7 22 (4 jobs) 13 no bound",
	} {
		if got := strings.Join(rows[model], " "); got != want {
			t.Errorf("%s: %q, want %q\n%s", model, got, want, out)
		}
	}
	for _, want := range []string{
		"dry run: nothing is published): 5 valid lines, 0 invalid",
		"tinker://run-1:train:0/sampler_weights/final: prompt tokens not counted for 1 of 1 jobs: the base model of a tinker:// path is known to the service only",
		"Qwen/Qwen3-30B-A3B: 1 of 1 jobs set no max_tokens",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the dry run does not say %q:\n%s", want, out)
		}
	}

	out, stderr, err = dryRun(lines[1], `{"custom_id":"f","model":"Qwen/Qwen3-8B","prompt":"x","colour":"red"}`)
	if !errors.Is(err, errInvalidInput) || !strings.Contains(stderr, ":2: field colour: unknown field") || !strings.Contains(out, "1 valid line, 1 invalid") {
		t.Errorf("a bad line: %v, said %q, printed %q", err, stderr, out)
	}
	if _, stderr, err = dryRun(); !errors.Is(err, errInvalidInput) || !strings.Contains(err.Error(), "no valid lines") {
		t.Errorf("a file without job lines: %v, said %q; want no valid lines, as a real submit", err, stderr)
	}
}

// TestDryRunAsksForAMissingTokenizerOnce: a model whose tokenizer cannot be had is asked for
// once, not once per job (a million downloads that fail alike), and its prompts are said to
// be not counted, with why.
func TestDryRunAsksForAMissingTokenizerOnce(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		http.NotFound(w, r)
	}))
	defer hub.Close()
	lines := make([]string, 50)
	for i := range lines {
		lines[i] = fmt.Sprintf(`{"custom_id":"j%d","model":"meta-llama/Llama-3.1-8B","prompt":"Hello %d","sampling_params":{"max_tokens":8}}`, i, i)
	}
	vars := map[string]string{"HF_ENDPOINT": hub.URL, "HF_HOME": t.TempDir()}
	var stdout, stderr bytes.Buffer
	env := &environment{getenv: func(k string) string { return vars[k] }, stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr}
	if err := run(context.Background(), []string{"--dry-run", writeLines(t, lines)}, env); err != nil {
		t.Fatalf("dry run: %v\n%s", err, stderr.String())
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("the hub was asked %d times for one model's tokenizer", n)
	}
	if want := "meta-llama/Llama-3.1-8B: prompt tokens not counted for 50 of 50 jobs: tokenizer:"; !strings.Contains(stdout.String(), want) {
		t.Errorf("the dry run does not say %q:\n%s", want, stdout.String())
	}
}

// TestATokenizerDirThatIsNotThereIsRefused: a --tokenizer-dir (or TINKERFLEET_TOKENIZER_DIR)
// that does not exist, a typo, was passed over without a word by --dry-run and the local
// worker, which took every tokenizer from the HF cache or the hub instead. It is refused
// before anything is read or started, named.
func TestATokenizerDirThatIsNotThereIsRefused(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "tokenizres")
	file := writeLines(t, []string{`{"custom_id":"a","model":"Qwen/Qwen3-8B","prompt":"Hi","sampling_params":{"max_tokens":5}}`})
	for _, tc := range []struct {
		args []string
		vars map[string]string
	}{
		{[]string{"--dry-run", "--tokenizer-dir", missing, file}, nil},
		{[]string{"--dry-run", file}, map[string]string{"TINKERFLEET_TOKENIZER_DIR": missing}},
		{[]string{"--local", "--simulate", "--data-dir", t.TempDir(), file}, map[string]string{"TINKERFLEET_TOKENIZER_DIR": missing}},
	} {
		env := quietEnv()
		env.getenv = func(k string) string { return tc.vars[k] }
		err := run(context.Background(), tc.args, env)
		if err == nil || !strings.Contains(err.Error(), "--tokenizer-dir (or TINKERFLEET_TOKENIZER_DIR)") || !strings.Contains(err.Error(), missing) {
			t.Errorf("submit %q with %v: %v, want an error naming --tokenizer-dir and %s", tc.args, tc.vars, err, missing)
		}
	}
}

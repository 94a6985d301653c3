package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestTokensAreSummedFromTheResults: submit's last line, results' and status (text and JSON)
// give the tokens of the ok results, the same sums as the usage of the output file's lines,
// tinkerfleet and OpenAI lines alike; a wait that resumes a file counts the lines it holds.
func TestTokensAreSummedFromTheResults(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	f.startWorker(8)
	ctx := context.Background()
	lines := jobLines(12) // jobLine mixes prompts, token prompts and OpenAI chat lines
	out := filepath.Join(t.TempDir(), "out.jsonl")
	_, stderr, err := f.submit(ctx, writeLines(t, lines), "--batch-id", "tokens", "-o", out)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var want queue.Tokens
	for _, line := range strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n") {
		want.Add(lineUsage(t, line))
	}
	if want.Prompt == 0 || want.Completion == 0 {
		t.Fatalf("the output's lines count no tokens: %+v", want)
	}
	phrase := fmt.Sprintf("%d prompt tokens, %d sampled", want.Prompt, want.Completion)
	if !strings.Contains(stderr, "12 results (12 ok, 0 error, 0 cancelled) in "+out+"; "+phrase+"\n") {
		t.Errorf("submit's last line does not give %q:\n%s", phrase, stderr)
	}

	text, _, err := f.submit(ctx, "status", "tokens")
	if err != nil || !strings.Contains(text, "tokens   "+phrase+"\n") {
		t.Errorf("status: %v\n%s", err, text)
	}
	text, _, err = f.submit(ctx, "status", "tokens", "--json")
	var st batchStatus
	if err == nil {
		err = json.Unmarshal([]byte(text), &st)
	}
	if err != nil || st.Usage != want {
		t.Errorf("status --json: usage %+v, want %+v (%v)", st.Usage, want, err)
	}

	// The file keeps its OpenAI lines and two tinkerfleet lines: the rest is read from the
	// server.
	var kept strings.Builder
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if strings.Contains(line, `"id":"batch_req_`) || strings.Contains(line, `"custom_id":"job-00000"`) || strings.Contains(line, `"custom_id":"job-00001"`) {
			kept.WriteString(line)
		}
	}
	if err := os.WriteFile(out, []byte(kept.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err = f.submit(ctx, "results", "tokens", "--wait", "-o", out); err != nil || !strings.Contains(stderr, "12 of 12 results (12 ok, 0 error, 0 cancelled) in "+out+"; "+phrase+"\n") {
		t.Errorf("a resumed wait: %v: %s", err, stderr)
	}
}

// lineUsage reads the usage of an output line, a tinkerfleet line's or an OpenAI line's.
func lineUsage(t *testing.T, line string) queue.Tokens {
	t.Helper()
	var r struct {
		Usage    *queue.Tokens `json:"usage"`
		Response *struct {
			Body struct {
				Usage struct {
					PromptTokens     int `json:"prompt_tokens"`
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			} `json:"body"`
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	switch {
	case r.Usage != nil:
		return *r.Usage
	case r.Response != nil:
		return queue.Tokens{Prompt: r.Response.Body.Usage.PromptTokens, Completion: r.Response.Body.Usage.CompletionTokens}
	}
	t.Fatalf("a line without usage: %s", line)
	return queue.Tokens{}
}

// TestTokensPhraseNamesCacheHits: cached prompt tokens are named when there are some (the
// simulator bills none, so the fleet tests never show them).
func TestTokensPhraseNamesCacheHits(t *testing.T) {
	if got, want := tokensPhrase(queue.Tokens{Prompt: 1200, Completion: 35, CacheHit: 300}), "1200 prompt tokens (300 cached), 35 sampled"; got != want {
		t.Errorf("tokensPhrase = %q, want %q", got, want)
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestFailedWritesTheLinesOfErrorsAsTheyWere: `submit failed` writes exactly the input lines
// (native and OpenAI ones, byte for byte) of the jobs whose results are errors, none with
// --retryable when no error is retryable, adds those whose results were lost, and refuses
// input files that changed since, and -o one of them.
func TestFailedWritesTheLinesOfErrorsAsTheyWere(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	if _, err := f.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultFailed, Rate: 0.4, Category: "user", Reason: "prompt refused"}); err != nil {
		t.Fatal(err)
	}
	f.startWorker(8)
	lines := make([]string, 60)
	byID := map[string]string{}
	for i := range lines {
		lines[i] = jobLine(i)
		byID[fmt.Sprintf("job-%05d", i)] = lines[i]
	}
	in := writeLines(t, lines)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "results.jsonl")
	stdout, stderr, err := f.submit(ctx, in, "-o", out)
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, stderr)
	}
	batch := strings.TrimSpace(stdout)
	var want []string
	for id, r := range readResults(t, out) {
		if lineStatus(t, r) == "error" {
			want = append(want, byID[id])
		}
	}
	if len(want) == 0 || len(want) == len(lines) {
		t.Fatalf("%d of %d jobs failed; the test needs some of each", len(want), len(lines))
	}

	got, _, err := f.submit(ctx, "failed", batch)
	if err != nil {
		t.Fatal(err)
	}
	gotLines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	slices.Sort(gotLines)
	slices.Sort(want)
	if !slices.Equal(gotLines, want) {
		t.Errorf("failed wrote %d lines:\n%s\nwant the %d input lines of the errors:\n%s", len(gotLines), got, len(want), strings.Join(want, "\n"))
	}
	if got, said, err := f.submit(ctx, "failed", batch, "--retryable"); err != nil || got != "" || !strings.Contains(said, "no results that are errors marked retryable: nothing to try again") {
		t.Errorf("failed --retryable: %q, %v, said %q; want nothing (refused prompts are not retryable), and that", got, err, said)
	}

	// A result lost from the server (expired, purged) is written too, with or without
	// --retryable: it will never come, and sampling it again may well succeed.
	var okID string
	for id, r := range readResults(t, out) {
		if lineStatus(t, r) == "ok" {
			okID = id
			break
		}
	}
	q := bind(t, f)
	if err := q.Results.Purge(ctx, jetstream.WithPurgeSubject(q.Names.ResultSubject(batch, okID))); err != nil {
		t.Fatal(err)
	}
	got, said, err := f.submit(ctx, "failed", batch)
	gotLines = strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	slices.Sort(gotLines)
	want = append(want, byID[okID])
	slices.Sort(want)
	if err != nil || !slices.Equal(gotLines, want) {
		t.Errorf("failed after a result was lost: %v; wrote\n%s\nwant the errors' lines and %s's", err, got, okID)
	}
	if phrase := fmt.Sprintf("%d lines of batch %s: %d whose results are errors, and 1 whose results will never come: none of its jobs", len(want), batch, len(want)-1); !strings.Contains(said, phrase) {
		t.Errorf("failed said %q, want %q", said, phrase)
	}
	if got, said, err := f.submit(ctx, "failed", batch, "--retryable"); err != nil || got != byID[okID]+"\n" || !strings.Contains(said, "1 line of batch "+batch+" whose results will never come") {
		t.Errorf("failed --retryable after a result was lost: %q, %v, said %q; want %s's line", got, err, said, okID)
	}

	// -o compresses as its name says, as results' -o does: the file reads back as the lines
	// (submit reads compressed input), not as text under a .gz or .zst name.
	for _, name := range []string{"retry.jsonl.gz", "retry.jsonl.zst"} {
		path := filepath.Join(t.TempDir(), name)
		if _, _, err := f.submit(ctx, "failed", batch, "-o", path); err != nil {
			t.Fatal(err)
		}
		file, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		r, kind, release, err := decompressed(path, bufio.NewReader(file))
		if err != nil || kind != outputCompression(path) {
			t.Fatalf("failed -o %s: compressed as %q (%v)", name, kind, err)
		}
		data, err := io.ReadAll(r)
		release()
		file.Close()
		if err != nil {
			t.Fatal(err)
		}
		gotLines = strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
		slices.Sort(gotLines)
		if !slices.Equal(gotLines, want) {
			t.Errorf("failed -o %s holds\n%s\nwant the same lines as on stdout", name, data)
		}
	}

	// A device takes them too (it cannot be synced, and need not be).
	if _, _, err := f.submit(ctx, "failed", batch, "-o", os.DevNull); err != nil {
		t.Errorf("failed -o %s: %v", os.DevNull, err)
	}

	// Written over the batch's own input, the lines would be gone before they were read.
	before, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.submit(ctx, "failed", batch, "-o", in); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "is the input file") {
		t.Errorf("failed -o its input: %v; want a refusal", err)
	}
	if after, _ := os.ReadFile(in); !bytes.Equal(after, before) {
		t.Fatalf("failed -o its input left %d of its %d bytes", len(after), len(before))
	}

	if err := os.WriteFile(in, []byte(strings.Join(lines[1:], "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.submit(ctx, "failed", batch); err == nil || !strings.Contains(err.Error(), "changed since it was submitted") {
		t.Errorf("failed on edited input: %v; want a refusal", err)
	}
}

// TestFailedRetryableTakesDeadLetters: with one delivery allowed, a job whose sample fails on
// the service's side ends as a dead letter, which is retryable: `failed --retryable` writes
// its line, and those of jobs that succeeded stay out.
func TestFailedRetryableTakesDeadLetters(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{MaxDeliver: 1}, tinkersim.Config{})
	if _, err := f.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultFailed, Rate: 0.4, Category: "server"}); err != nil {
		t.Fatal(err)
	}
	f.startWorker(8)
	lines := jobLines(60)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "results.jsonl")
	stdout, stderr, err := f.submit(ctx, writeLines(t, lines), "-o", out, "--result-format", "native")
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, stderr)
	}
	var dead []string // native lines for every job: the error's code is at the top
	for id, r := range readResults(t, out) {
		if e, _ := r["error"].(map[string]any); e["code"] == "dead_letter" {
			dead = append(dead, id)
		}
	}
	if len(dead) == 0 || len(dead) == len(lines) {
		t.Fatalf("%d of %d jobs were dead-lettered; the test needs some of each", len(dead), len(lines))
	}
	got, _, err := f.submit(ctx, "failed", strings.TrimSpace(stdout), "--retryable")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, line := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		ids = append(ids, line[len(`{"custom_id":"`):len(`{"custom_id":"job-00000`)])
	}
	slices.Sort(ids)
	slices.Sort(dead)
	if !slices.Equal(ids, dead) {
		t.Errorf("failed --retryable wrote the lines of %v; want the dead letters %v", ids, dead)
	}
}

package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestLostResultsAreNamedAndEndTheWait: a batch whose results are gone from the server while
// its manifest stays (the results expired after --results-max-age, or were purged) is named
// as such by status, list and results, and failed writes their lines; a reader waiting for
// it, and the same files submitted again, stop at once saying why instead of waiting for
// ever; it can be deleted; and an output file that already holds every result still
// completes.
func TestLostResultsAreNamedAndEndTheWait(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	f.startWorker(8)
	ctx := context.Background()
	lines := jobLines(6)
	in, dir := writeLines(t, lines), t.TempDir()
	complete := filepath.Join(dir, "complete.jsonl")
	if _, stderr, err := f.submit(ctx, in, "--batch-id", "lost", "-o", complete); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	q := bind(t, f)
	// Two results stay: the lost ones are those the server no longer has.
	for _, id := range []string{"job-00000", "job-00001", "job-00002", "job-00003"} {
		if err := q.Results.Purge(ctx, jetstream.WithPurgeSubject(q.Names.ResultSubject("lost", id))); err != nil {
			t.Fatal(err)
		}
	}
	const lostPhrase = "4 results will never come: none of its jobs is left in the queue, and its results were removed from the NATS server"

	out, _, err := f.submit(ctx, "status", "lost")
	if err != nil || !strings.Contains(out, "status   submitted: "+lostPhrase+"\n") || strings.Contains(out, "activity") {
		t.Errorf("status: %v\n%s", err, out)
	}
	out, _, err = f.submit(ctx, "status", "lost", "--json")
	var st batchStatus
	if err == nil {
		err = json.Unmarshal([]byte(out), &st)
	}
	if err != nil || st.Lost != 4 || st.Results != 2 || st.Done {
		t.Errorf("status --json: lost %d, results %d, done %v (%v)\n%s", st.Lost, st.Results, st.Done, err, out)
	}
	if out, _, err = f.submit(ctx, "list"); err != nil || !strings.Contains(out, "no (4 lost)") {
		t.Errorf("list: %v\n%s", err, out)
	}
	if _, stderr, err := f.submit(ctx, "results", "lost"); err != nil ||
		!strings.Contains(stderr, "batch lost: 2 of 6 results") || !strings.Contains(stderr, "batch lost: "+lostPhrase+"\n") {
		t.Errorf("results: %v: %s", err, stderr)
	}

	// failed writes the lines of the lost results, byte for byte, to run them again.
	if out, said, err := f.submit(ctx, "failed", "lost"); err != nil || out != strings.Join(lines[:4], "\n")+"\n" ||
		!strings.Contains(said, "4 lines of batch lost whose results will never come: none of its jobs is left in the queue") {
		t.Errorf("failed: %v: %s\n%s", err, said, out)
	}

	// Those who wait for the results stop at their first look, well before this deadline.
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"results", "lost", "--wait", "-o", filepath.Join(dir, "waited.jsonl")},
		{in, "--batch-id", "lost", "-o", filepath.Join(dir, "again.jsonl")},
	} {
		_, _, err := f.submit(waitCtx, args...)
		if waitCtx.Err() != nil {
			t.Fatalf("%q still waits for results that will never come", args)
		}
		if err == nil || !strings.Contains(err.Error(), "batch lost: "+lostPhrase+"; submit failed lost writes their lines") {
			t.Errorf("%q: %v", args, err)
		}
	}
	got, err := os.ReadFile(filepath.Join(dir, "waited.jsonl"))
	if err != nil || len(outputLines(t, got)) != 2 {
		t.Errorf("the waiting reader wrote %d of the 2 results left (%v)", len(outputLines(t, got)), err)
	}
	// A file with every result needs nothing of the server.
	if _, stderr, err := f.submit(ctx, in, "--batch-id", "lost", "-o", complete); err != nil {
		t.Errorf("a complete output file: %v: %s", err, stderr)
	}

	if _, stderr, err := f.submit(ctx, "delete", "lost"); err != nil {
		t.Errorf("delete of a batch whose results are lost: %v: %s", err, stderr)
	}
}

// TestLostResultsOfAnOldBatchExpired: results lost from a batch older than the results stream
// keeps results are said to have expired, with that age in days; a younger batch's were
// removed.
func TestLostResultsOfAnOldBatchExpired(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	q := bind(t, f)
	old := queue.Manifest{BatchID: "old", CreatedAt: time.Now().Add(-8 * 24 * time.Hour)}
	if got, want := lostCause(q, old), "the NATS server keeps results for 7 days (--results-max-age): they expired"; !strings.HasSuffix(got, want) {
		t.Errorf("lost results of a batch 8 days old: %q, want it to end in %q", got, want)
	}
	young := queue.Manifest{BatchID: "young", CreatedAt: time.Now().Add(-6 * 24 * time.Hour)}
	if got := lostCause(q, young); !strings.HasSuffix(got, "its results were removed from the NATS server") {
		t.Errorf("lost results of a batch 6 days old: %q", got)
	}
	if got := span(90 * time.Minute); got != "1h30m0s" {
		t.Errorf("span(90m) = %q", got)
	}
}

// TestWaitingAloneOnALocalStoreForLostResultsSaysTheyAreLost: results --wait on a local data
// directory that no run holds, for a batch whose results are lost, stops with the lost
// results' error, as a wait on a fleet does, rather than send the user to run the batch's
// submit --local command again, which only stops with that error in turn.
func TestWaitingAloneOnALocalStoreForLostResultsSaysTheyAreLost(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data, out := filepath.Join(dir, "data"), filepath.Join(dir, "results.jsonl")
	in := writeLines(t, jobLines(3))
	env := quietEnv()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: data, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"--nats-url", emb.ClientURL(), "--batch-id", "b-gone", "--progress", "none", in}, env); err != nil {
		t.Fatalf("publishing: %v", err)
	}
	// The jobs are gone from the queue, and no result of theirs is stored: all three are lost.
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	if err := q.Jobs.Purge(context.Background(), jetstream.WithPurgeSubject(q.Names.JobSubject("b-gone"))); err != nil {
		t.Fatal(err)
	}
	emb.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run(ctx, []string{"results", "--data-dir", data, "--progress", "none", "b-gone", "-o", out, "--wait"}, env)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "batch b-gone: 3 results will never come") ||
		strings.Contains(err.Error(), "submit --local command again") {
		t.Fatalf("results --wait on lost results with no worker: %v", err)
	}
}

// quietEnv is an environment with no variables, empty stdin, and its output discarded.
func quietEnv() *environment {
	return &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
}

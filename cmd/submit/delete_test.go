package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestDeleteRemovesABatchAndOnlyIt: delete removes a done batch's results from the server and
// leaves another batch's alone; the deleted batch says so wherever it is named, and its files
// run again only under another batch id (its job ids may still be in the duplicate window,
// which would drop every job of a batch published again under the same id).
func TestDeleteRemovesABatchAndOnlyIt(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	f.startWorker(16)
	ctx := context.Background()
	lines := jobLines(30)
	in, other := writeLines(t, lines), writeLines(t, lines[:10])
	dir := t.TempDir()
	batch, stderr, err := f.submit(ctx, in, "-o", filepath.Join(dir, "a.jsonl"))
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	batch = strings.TrimSpace(batch)
	kept, stderr, err := f.submit(ctx, other, "-o", filepath.Join(dir, "b.jsonl"))
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	kept = strings.TrimSpace(kept)

	if _, stderr, err = f.submit(ctx, "delete", batch); err != nil || !strings.Contains(stderr, "batch "+batch+" deleted: its 30 results") {
		t.Fatalf("delete: %v, said %q", err, stderr)
	}
	q := bind(t, f)
	if n, err := q.ResultsStored(ctx, batch); err != nil || n != 0 {
		t.Errorf("%d results of the deleted batch left (%v)", n, err)
	}
	if n, err := q.ResultsStored(ctx, kept); err != nil || n != 10 {
		t.Errorf("the other batch has %d results (%v), want its 10", n, err)
	}

	if out, _, err := f.submit(ctx, "status", batch); err != nil || !strings.Contains(out, "deleted") {
		t.Errorf("status: %v\n%s", err, out)
	}
	// list: DONE is neither yes nor no for a batch whose results were removed on purpose.
	listed, _, err := f.submit(ctx, "list")
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	shown := false
	for line := range strings.Lines(listed) {
		if cols := strings.Fields(line); len(cols) > 4 && cols[0] == batch {
			shown = true
			if cols[1] != "deleted" || cols[4] != "-" {
				t.Errorf("list shows the deleted batch as %q; want status deleted, DONE -", strings.TrimSpace(line))
			}
		}
	}
	if !shown {
		t.Errorf("list does not show the deleted batch:\n%s", listed)
	}
	for _, cmd := range [][]string{{"results", batch}, {"failed", batch}, {"cancel", batch}} {
		if _, _, err := f.submit(ctx, cmd...); err == nil || !strings.Contains(err.Error(), "batch "+batch+" was deleted on ") {
			t.Errorf("%s of a deleted batch: %v", cmd[0], err)
		}
	}
	if _, _, err := f.submit(ctx, in); err == nil || !strings.Contains(err.Error(), "another --batch-id") {
		t.Errorf("submitting the deleted batch's files again: %v", err)
	}
	out := filepath.Join(dir, "again.jsonl")
	if _, stderr, err := f.submit(ctx, in, "--batch-id", "again", "-o", out); err != nil {
		t.Fatalf("the same files as another batch: %v: %s", err, stderr)
	}
	if res := readResults(t, out); len(res) != 30 {
		t.Errorf("%d results under another batch id, want 30", len(res))
	}
}

// TestDeleteEndsWhatIsLeftOfABatch: a batch not done is deleted only once cancelled; its
// queued jobs are removed with it, and a job of it that reaches a worker afterwards (one that
// was at work during the delete) is acked without sampling and without a result, which
// nobody could read.
func TestDeleteEndsWhatIsLeftOfABatch(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	ctx := context.Background()
	lines := jobLines(20)
	if _, stderr, err := f.submit(ctx, "--batch-id", "unfinished", writeLines(t, lines)); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	if _, _, err := f.submit(ctx, "delete", "unfinished"); err == nil || !strings.Contains(err.Error(), "not done (0 of 20 results): cancel it first") {
		t.Fatalf("deleting a batch not done: %v", err)
	}
	for _, cmd := range []string{"cancel", "delete"} {
		if _, stderr, err := f.submit(ctx, cmd, "unfinished"); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, stderr)
		}
	}
	q := bind(t, f)
	if n := jobsIn(t, q); n != 0 {
		t.Errorf("%d jobs of the deleted batch still queued", n)
	}

	// One job slot: the worker takes the next batch's job only once the late job is settled.
	fleettest.Publish(t, q, "unfinished", []jobs.Job{deleteTestJob("late")})
	fleettest.Publish(t, q, "next", []jobs.Job{deleteTestJob("after")})
	f.startWorker(1)
	fleettest.Results(t, q, "next", 1, 30*time.Second)
	if n, err := q.ResultsStored(ctx, "unfinished"); err != nil || n != 0 {
		t.Errorf("%d results stored for the deleted batch (%v), want none", n, err)
	}
	// The next batch's job is acked after its result is stored (acks go in groups, 2 ms
	// apart): under load its ack came after the result was read, and the count read 1.
	fleettest.Eventually(t, 10*time.Second, "the late job and the next one acked", func() bool { return jobsIn(t, q) == 0 })
	if n := f.sim.Stats().SamplesAccepted; n != 1 {
		t.Errorf("%d samples; want 1, the next batch's", n)
	}
}

// TestDeleteDropsTheResultOfAJobAtWork: a job of a batch deleted while it is sampling is
// acked when it finishes, and its result is not stored: the batch's results were purged, and
// this one would stay until --results-max-age with nobody to read it.
func TestDeleteDropsTheResultOfAJobAtWork(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{BaseLatency: 2 * time.Second})
	ctx := context.Background()
	q := bind(t, f)
	fleettest.Publish(t, q, "gone", []jobs.Job{deleteTestJob("at-work")})
	if _, err := q.PutManifest(ctx, queue.Manifest{BatchID: "gone", Status: queue.BatchSubmitted, Jobs: 1}, 0); err != nil {
		t.Fatal(err)
	}
	f.startWorker(1) // one job slot: the next batch's job waits for the first to be settled
	// 30 s, as for the results: the worker first loads Qwen3's tokenizer, and in a CI run under
	// the race detector, beside the package's other tests, the sample came after more than 10 s.
	fleettest.Eventually(t, 30*time.Second, "the job sampling", func() bool { return f.sim.Stats().SamplesAccepted == 1 })
	for _, cmd := range []string{"cancel", "delete"} {
		if _, stderr, err := f.submit(ctx, cmd, "gone"); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, stderr)
		}
	}
	fleettest.Publish(t, q, "next", []jobs.Job{deleteTestJob("after")})
	fleettest.Results(t, q, "next", 1, 30*time.Second)
	if n, err := q.ResultsStored(ctx, "gone"); err != nil || n != 0 {
		t.Errorf("%d results stored for the deleted batch (%v), want none", n, err)
	}
}

// deleteTestJob is a small valid job.
func deleteTestJob(id string) jobs.Job {
	mt := 4
	return jobs.Job{CustomID: id, Model: "Qwen/Qwen3-8B", Prompt: "Hi.", NumSamples: 1, Params: jobs.SamplingParams{MaxTokens: &mt}}
}

// TestAFollowerOfADeletedBatchStops: a reader waiting for a batch's results (results --wait,
// or submit itself following) stops, saying why, once the batch is deleted: the results it
// waits for are gone and will not come.
func TestAFollowerOfADeletedBatchStops(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	ctx := context.Background()
	lines := jobLines(10)
	if _, stderr, err := f.submit(ctx, "--batch-id", "gone", writeLines(t, lines)); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	out := filepath.Join(t.TempDir(), "out.jsonl")
	followed := make(chan error, 1)
	go func() {
		_, _, err := f.submit(ctx, "results", "gone", "--wait", "-o", out)
		followed <- err
	}()
	// The output file is made once the batch's manifest is read: the follower is waiting,
	// not refused at the start as a deleted batch's reader is.
	fleettest.Eventually(t, 10*time.Second, "the follower following", func() bool {
		_, err := os.Stat(out)
		return err == nil
	})
	for _, cmd := range []string{"cancel", "delete"} {
		if _, stderr, err := f.submit(ctx, cmd, "gone"); err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, stderr)
		}
	}
	select {
	case err := <-followed:
		if err == nil || !strings.Contains(err.Error(), "batch gone was deleted on ") {
			t.Errorf("the follower of a deleted batch ended with %v; want that the batch was deleted", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the follower of a deleted batch still waits 30 s after the delete")
	}
}

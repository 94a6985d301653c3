package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// storeResult stores data as the result of job customID of batch, as a worker would (or
// another client of the results stream).
func storeResult(ctx context.Context, t *testing.T, q *queue.Queue, batch, customID, status string, data []byte) {
	t.Helper()
	codec, err := queue.NewCodec(0)
	if err != nil {
		t.Fatal(err)
	}
	var m *nats.Msg
	if m, err = q.ResultMsg(nil, codec, batch, customID, status, queue.Tokens{}, data, 0); err == nil {
		_, err = q.PublishResult(ctx, m)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// boundedErr fails unless err is a short message (the first bytes of the long value, cut and
// marked, rather than the value) with no control character in it.
func boundedErr(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	msg := err.Error()
	if len(msg) > 2*jobs.MaxExcerpt+400 || !strings.Contains(msg, `"…`) || strings.ContainsFunc(msg, func(r rune) bool { return r < ' ' }) {
		t.Errorf("%s: a %d-byte error, starting %.400q; want the line's first bytes, quoted and marked as cut", what, len(msg), msg)
	}
}

// TestFailedNamesALineThatIsNoResultBriefly: `submit failed` refuses a stored result that is
// no result line (another client's, or a bug's), and says so with its first bytes. Before,
// its error quoted the whole line, which may be 256 MiB.
func TestFailedNamesALineThatIsNoResultBriefly(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stdout, _, err := f.submit(ctx, writeLines(t, jobLines(2)))
	if err != nil {
		t.Fatal(err)
	}
	batch := strings.TrimSpace(stdout)
	q := bind(t, f)
	failed := jobs.Result{CustomID: "job-00000", BatchID: batch, Status: jobs.StatusError, Model: "Qwen/Qwen3-8B",
		Error: &jobs.ResultError{Code: jobs.CodeInternal, Message: "x", Category: jobs.CategoryUnknown}}
	data, err := failed.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	storeResult(ctx, t, q, batch, "job-00000", "error", data)
	// One JSON line of this job's result, as far as the check before it is written looks
	// (jobs.ResultLineIDs), but no result line for a reader of them: its usage is a string.
	storeResult(ctx, t, q, batch, "job-00001", "error", []byte(`{"custom_id":"job-00001","batch_id":"`+batch+`","status":"error","usage":"`+strings.Repeat("x", 1<<20)+`"}`))
	_, _, err = f.submit(ctx, "failed", batch)
	boundedErr(t, "failed, a result whose usage is a string", err)
}

// TestOutputOfAnotherBatchIsNamedBriefly: an -o file of another batch's results is refused
// with its batch and custom id, quoted and cut when they are long or hold control characters
// (a file's line may be 1 GiB, and the message goes to a terminal). Before, both were
// written whole, the batch id unquoted.
func TestOutputOfAnotherBatchIsNamedBriefly(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("y", 1<<20)
	path := filepath.Join(t.TempDir(), "out.jsonl")
	line := `{"custom_id":"` + long + `","batch_id":"\u001b[2J` + long + `","status":"ok","attempts":1,"latency_ms":1}` + "\n"
	if err := os.WriteFile(path, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := openOutput(path, "b", map[queue.JobKey]bool{}, &summary{})
	if !errors.Is(err, errOtherBatch) {
		t.Fatalf("openOutput of another batch's file: %v", err)
	}
	boundedErr(t, "another batch's output file", err)
}

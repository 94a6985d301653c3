package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
)

// TestEncodingSendsEveryValidJobInOrder: the publishing pass's reading, ahead of the
// publishing, gives the jobs of the valid lines of every file, in order and encoded as a
// plain eachJob pass (the publishing loop's before) gives and encodes them, in chunks of at
// most encodeChunkJobs, and counts the invalid lines as the validation pass did.
func TestEncodingSendsEveryValidJobInOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var files []string
	first := 0
	for k, n := range []int{700, 1, 300} {
		lines := make([]string, n)
		for i := range lines {
			lines[i] = jobLine(first + i)
		}
		first += n
		if k == 0 {
			lines[10] = `{"custom_id":"bad","model":"Qwen/Qwen3-8B"}` // no prompt
			lines[500] = jobLine(3)                                   // a custom_id seen before
		}
		name := filepath.Join(dir, "in"+string(rune('a'+k))+".jsonl")
		if err := os.WriteFile(name, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, name)
	}
	var want []encodedJob
	wantRejected := 0
	err := eachJob(files, jobs.Limits{}, nil, nil, func(j jobs.Job, _ []byte, _ lineAt, err error) error {
		if err != nil {
			wantRejected++
			return nil
		}
		data, err := j.Encode()
		want = append(want, encodedJob{customID: j.CustomID, data: data})
		return err
	})
	if err != nil || wantRejected != 2 {
		t.Fatalf("the plain pass: %v, %d rejected (want 2)", err, wantRejected)
	}

	enc := startEncoding(context.Background(), files, jobs.Limits{})
	defer enc.stop()
	var got []encodedJob
	for chunk := range enc.chunks {
		if len(chunk) == 0 || len(chunk) > encodeChunkJobs {
			t.Fatalf("a chunk of %d jobs, want 1 to %d", len(chunk), encodeChunkJobs)
		}
		got = append(got, chunk...)
	}
	accepted, rejected, err := enc.result()
	if err != nil || accepted != len(want) || rejected != wantRejected {
		t.Fatalf("result: %d accepted, %d rejected, %v; want %d, %d, nil", accepted, rejected, err, len(want), wantRejected)
	}
	if !slices.EqualFunc(got, want, func(a, b encodedJob) bool { return a.customID == b.customID && string(a.data) == string(b.data) }) {
		t.Fatalf("%d jobs read ahead differ from the %d of the plain pass", len(got), len(want))
	}
}

// TestEncodingStopsWhenThePublishingStops: a publishing pass that stops early (a job the
// server refused, an interrupt) stops the reading ahead with it, which is left blocked on a
// chunk nobody takes otherwise; and one that ends by its context says why.
func TestEncodingStopsWhenThePublishingStops(t *testing.T) {
	t.Parallel()
	in := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(jobLines(20*encodeChunkJobs), "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	enc := startEncoding(context.Background(), []string{in}, jobs.Limits{})
	<-enc.chunks
	stopped := make(chan struct{})
	go func() { enc.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("stop did not return: the reading goroutine still waits to hand on a chunk")
	}
	if _, _, err := enc.result(); !errors.Is(err, context.Canceled) {
		t.Fatalf("result after stop: %v, want context.Canceled", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	enc = startEncoding(ctx, []string{in}, jobs.Limits{})
	defer enc.stop()
	<-enc.chunks
	cancel()
	for range enc.chunks { // those read ahead, then the channel is closed
	}
	if accepted, _, err := enc.result(); !errors.Is(err, context.Canceled) || accepted == 20*encodeChunkJobs {
		t.Fatalf("result after the context ended: %d accepted, %v; want it stopped early with context.Canceled", accepted, err)
	}
}

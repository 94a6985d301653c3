package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestJobsTooLargeForTheServerPublishNothing: against a NATS server that takes smaller
// messages than a job (a stock nats-server takes 1 MiB; a line may be 8), submit names
// the line and the server's limit and publishes nothing, rather than stopping halfway with
// "maximum payload exceeded" from the publish.
func TestJobsTooLargeForTheServerPublishNothing(t *testing.T) {
	t.Parallel()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir(), Port: -1, MaxPayload: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	f := &fleet{t: t, nats: emb.ClientURL()}
	// A million characters (the prompt limit), some of two bytes: a line just under 1 MiB.
	big := `{"custom_id":"big","model":"Qwen/Qwen3-8B","prompt":"` + strings.Repeat("x", 951560) + strings.Repeat("é", 48440) + `"}`
	in := writeLines(t, []string{jobLine(0), big, jobLine(1)})
	_, stderr, err := f.submit(context.Background(), "--batch-id", "big", in)
	if !errors.Is(err, errJobsTooLarge) || !strings.Contains(stderr, in+":2: the job is ") {
		t.Fatalf("err = %v, said %q; want line 2 named, too large for the server", err, stderr)
	}
	// The job is over the limit by less than the headers' room: the limit said is what a job
	// may take (max_payload less that room), not max_payload, which the job is under.
	var size, limit int
	if _, err := fmt.Sscanf(stderr[strings.Index(stderr, "the job is "):], "the job is %d bytes, over the %d bytes", &size, &limit); err != nil || size <= limit || limit != 1<<20-queue.JobHeaderRoom {
		t.Errorf("said %q: want the job's size over the %d bytes it may take (%v)", stderr, 1<<20-queue.JobHeaderRoom, err)
	}
	q := bind(t, f)
	if n := jobsIn(t, q); n != 0 {
		t.Errorf("%d jobs published", n)
	}
	if _, _, err := q.GetManifest(context.Background(), "big"); !errors.Is(err, queue.ErrNoBatch) {
		t.Errorf("a manifest was written (%v)", err)
	}
}

// TestJobsThatGrowWhenEncodedAreChecked: a job's encoding may be larger than its line, most
// of all for token ids written with an exponent ("2e9" is written out as 2000000000), so a
// line under half the server's max payload may still make a job over it. The check reads the
// files again for it, rather than leave the job to stop the publishing halfway.
func TestJobsThatGrowWhenEncodedAreChecked(t *testing.T) {
	t.Parallel()
	ids := strings.TrimSuffix(strings.Repeat("2e9,", 100_000), ",")
	line := `{"custom_id":"grows","model":"Qwen/Qwen3-8B","prompt_tokens":[` + ids + `]}`
	const maxPayload = 1 << 20
	if 2*len(line)+queue.JobHeaderRoom > maxPayload {
		t.Fatalf("the line (%d bytes) is not under half the max payload: it tests nothing", len(line))
	}
	in := writeLines(t, []string{jobLine(0), line})
	var stderr strings.Builder
	err := checkJobSizes(context.Background(), []string{in}, jobs.Limits{}, len(line), maxPayload, &stderr)
	if !errors.Is(err, errJobsTooLarge) || !strings.Contains(stderr.String(), in+":2: the job is ") {
		t.Fatalf("err = %v, said %q; want line 2 named, too large for the server", err, stderr.String())
	}
}

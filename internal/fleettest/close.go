package fleettest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// ClosePullersAsJobsCome closes rounds job pullers on q, each just as a job comes for the
// pull request it gave up on, and fails t unless every such job can be fetched again at
// once from admin's consumer, not after AckWait (30 s). admin publishes the jobs; q may be
// the same queue, or one connected to another node of a cluster.
func ClosePullersAsJobsCome(t testing.TB, q, admin *queue.Queue, rounds int) {
	t.Helper()
	ctx := context.Background()
	cons, err := admin.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for round := range rounds {
		p, err := q.NewJobPuller(ctx)
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		_, err = p.Pull(short, 2, 5*time.Second, func(jetstream.Msg) {})
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("round %d: a request given up on: %v", round, err)
		}
		Publish(t, admin, "closing", []jobs.Job{{CustomID: "job-" + strconv.Itoa(round), Model: "Qwen/Qwen3-8B", Prompt: "a", NumSamples: 1}})
		if err := p.Close(nil); err != nil {
			t.Fatal(err)
		}
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			_ = m.Ack()
		}
		if got != 1 {
			t.Fatalf("round %d: the job sent as the puller closed did not come back within 2 s", round)
		}
	}
}

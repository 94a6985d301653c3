package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestAWorkerStartedWithAShorterAckWaitDoesNotTakeTheJobsOfTheOthers: a worker that sets up
// the consumer reads its ack wait once, and keeps its jobs alive at a third of it. A second
// worker started with a much shorter ack wait (a rolling update, another --ack-wait) would
// have the server give the first one's jobs, a few seconds into their samples, to whoever
// pulls next, to be sampled twice. Its setup is refused while the first runs; started with
// the fleet's ack wait, it samples nothing the first holds.
func TestAWorkerStartedWithAShorterAckWaitDoesNotTakeTheJobsOfTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{AckWait: 30 * time.Second}, tinkersim.Config{BaseLatency: 6 * time.Second})
	run(t, b.open(t, b.connect(t), Config{}))
	js := tokenJobs("wait-", 10)
	publishJobs(t, b.results, "ackwait", js)
	fleettest.Eventually(t, 30*time.Second, "every job's sample sent", func() bool {
		return b.sim.Stats().SamplesAccepted == int64(len(js))
	})

	// The second worker's connection and setup, as cmd/worker makes them.
	nc, err := queue.Connect(queue.ConnectConfig{URL: b.emb.ClientURL(), Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	jsc, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := queue.Setup(ctx, jsc, queue.Config{AckWait: time.Second})
	if err == nil {
		t.Error("a setup with a shorter ack wait under a running worker was accepted")
	} else {
		if !strings.Contains(err.Error(), "shorter ack wait") {
			t.Errorf("setup with a shorter ack wait under a running worker: %v", err)
		}
		t.Log(err)
		q = b.connect(t) // started again with the fleet's
	}
	run(t, b.open(t, q, Config{}))
	wantEachSampledOnce(t, b, "ackwait", js)
}

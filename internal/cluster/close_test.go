package cluster

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestAClosingPullerOnAnotherNodeLeavesNoJobToNobody: a worker's puller connected to a node
// other than the jobs consumer's leader closes just as a job comes for the request it gave
// up on. The leader may send the job before the puller's unsubscribe reaches it over the
// route, to a node where the puller's inbox is gone; Close waits for such a job, and hands
// it back, rather than leave it to wait out AckWait.
func TestAClosingPullerOnAnotherNodeLeavesNoJobToNobody(t *testing.T) {
	t.Parallel()
	c := fleettest.StartCluster(t, 3)
	ctx := context.Background()
	admin := c.Connect(t, 0, "admin", queue.Config{Replicas: 3})
	cons, err := admin.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.Index(info.Cluster.Leader)
	q := c.Connect(t, (leader+1)%c.Len(), "puller", queue.Config{Replicas: 3})
	for round := range 20 {
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
		publishJobs(t, admin, "b1", []jobs.Job{{CustomID: "job-" + strconv.Itoa(round), Model: "Qwen/Qwen3-8B", Prompt: "a", NumSamples: 1}})
		if err := p.Close(); err != nil {
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

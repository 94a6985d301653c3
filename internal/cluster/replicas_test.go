package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestAReplicasChangeReachesEveryStreamAndBucket: a fleet started with one replica and set up
// again with three (deploy/README.md: --replicas changes) has all its streams and both KV
// buckets on three nodes, the backoff bucket too, which the first worker's fleet backoff made,
// and the set-up that changes it does not fail while the jobs stream grows its replicas.
func TestAReplicasChangeReachesEveryStreamAndBucket(t *testing.T) {
	c := fleettest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := queue.Connect(queue.ConnectConfig{URL: c.URL(0), Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, replicas := range []int{1, 3} {
		// Setup may meet the jobs stream still growing its replicas, whose consumer's update
		// the server refuses for a moment ("replica count exceeds parent stream"): it waits.
		q, err := queue.Setup(ctx, js, queue.Config{Replicas: replicas})
		if err != nil {
			t.Fatalf("set up with %d replicas: %v", replicas, err)
		}
		f, err := backoff.Open(ctx, q.JS, backoff.Config{Bucket: q.Names.BackoffBucket(), Account: "acct", Replicas: replicas})
		if err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		for _, name := range []string{q.Names.JobsStream(), q.Names.ResultsStream(), q.Names.DeadStream(),
			"KV_" + q.Names.BatchesBucket(), "KV_" + q.Names.BackoffBucket()} {
			s, err := q.JS.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.CachedInfo().Config.Replicas; got != replicas {
				t.Errorf("set up with %d replicas: stream %s has %d", replicas, name, got)
			}
		}
	}
}

package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// runWorker opens a worker on q against the simulator at simURL and runs it until the
// returned stop is called (also at cleanup); Run must return nil.
func runWorker(t testing.TB, q *queue.Queue, simURL string, concurrency int) (stop func()) {
	t.Helper()
	cfg := worker.Config{
		Queue:         q,
		TinkerBaseURL: simURL,
		TinkerAPIKey:  testKey,
		Concurrency:   concurrency,
		ShutdownGrace: 2 * time.Second,
		RetryDelay:    200 * time.Millisecond,
	}
	if testing.Verbose() && os.Getenv("CLUSTER_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := worker.Open(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }() // stopped by stop
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker Run: %v", err)
			}
			w.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestStreamLeaderFailover runs a batch across three workers, each connected to a different
// node of a three-node cluster, shuts down the leader of the JOBS stream (the jobs being
// pulled and acked) or of the RESULTS stream (the results being stored) mid-batch, and
// checks that every job ends with exactly one result.
func TestStreamLeaderFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node NATS cluster; skipped with -short")
	}
	t.Run("jobs", func(t *testing.T) {
		failover(t, func(q *queue.Queue) jetstream.Stream { return q.Jobs })
	})
	t.Run("results", func(t *testing.T) {
		failover(t, func(q *queue.Queue) jetstream.Stream { return q.Results })
	})
}

// failover is TestStreamLeaderFailover with the leader of the stream that stream picks.
func failover(t *testing.T, stream func(*queue.Queue) jetstream.Stream) {
	const total = 1000
	c := fleettest.StartCluster(t, 3)
	// A short AckWait so that an ack lost in the leader change is redelivered within the
	// test; workers send InProgress every third of it.
	qcfg := queue.Config{Replicas: 3, AckWait: 4 * time.Second, MaxAckPending: 3 * 64}
	sim, simURL := startSim(t, tinkersim.Config{Capacity: 256, BaseLatency: 20 * time.Millisecond})

	admin := c.Connect(t, 0, "test", qcfg)
	for i := range c.Len() {
		runWorker(t, c.Connect(t, i, fmt.Sprintf("worker-%d", i+1), qcfg), simURL, 64)
	}
	const batch = "failover"
	publishJobs(t, admin, batch, makeJobs(total))

	ctx := context.Background()
	fleettest.Eventually(t, 60*time.Second, "a third of the results", func() bool {
		n, err := admin.ResultsStored(ctx, batch)
		return err == nil && n >= total/3
	})
	info, err := stream(admin).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("stream %s has no cluster leader: %+v", info.Config.Name, info.Cluster)
	}
	leader := c.Index(info.Cluster.Leader)
	if leader < 0 {
		t.Fatalf("leader %q is not one of the nodes", info.Cluster.Leader)
	}
	done, _ := admin.ResultsStored(ctx, batch)
	t.Logf("shutting down %s's leader %s with %d of %d results stored", info.Config.Name, info.Cluster.Leader, done, total)
	c.Stop(leader)

	fleettest.Eventually(t, 90*time.Second, "every result", func() bool {
		n, err := admin.ResultsStored(ctx, batch)
		return err == nil && n >= total
	})
	fleettest.Eventually(t, 30*time.Second, "an empty work queue", func() bool {
		info, err := admin.Jobs.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})

	counts, results := readResults(t, admin, batch)
	want := map[string]bool{}
	for _, j := range makeJobs(total) {
		want[j.CustomID] = true
	}
	for id := range want {
		if counts[id] != 1 {
			t.Errorf("custom_id %s: %d results, want 1", id, counts[id])
		}
	}
	for id := range counts {
		if !want[id] {
			t.Errorf("result for unknown custom_id %s", id)
		}
	}
	notOK := 0
	for _, r := range results {
		if r.Status != jobs.StatusOK {
			notOK++
			if notOK <= 5 {
				t.Errorf("result %s: status %s, error %+v", r.CustomID, r.Status, r.Error)
			}
		}
	}
	// The results stream keeps one message per subject: a second result for a job would
	// have replaced the first, which shows as a sequence number beyond the message count.
	rinfo, err := admin.Results.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rinfo.State.Msgs != total || rinfo.State.LastSeq != total {
		t.Errorf("results stream: %d messages, last sequence %d; want %d and %d (no result written twice)",
			rinfo.State.Msgs, rinfo.State.LastSeq, total, total)
	}
	cons, err := admin.JS.Consumer(ctx, admin.Names.JobsStream(), queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	cinfo, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cinfo.NumAckPending != 0 || cinfo.NumPending != 0 {
		t.Errorf("consumer after the batch: %d pending, %d ack pending", cinfo.NumPending, cinfo.NumAckPending)
	}
	if newInfo, err := stream(admin).Info(ctx); err == nil && newInfo.Cluster != nil {
		t.Logf("new %s leader %s; %d redelivered", newInfo.Config.Name, newInfo.Cluster.Leader, cinfo.NumRedelivered)
	}
	if samples := sim.Stats().SamplesCompleted; samples > total {
		t.Logf("%d samples for %d jobs: %d sampled again", samples, total, samples-total)
	}
}

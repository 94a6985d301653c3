package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestAWorkerCutOffFromItsNodeMovesToAnother cuts the network between the only worker and
// its node in the middle of a batch, as a failed link does: nothing closes, nothing arrives.
// The worker must notice by its pings, move to another node of the cluster and finish the
// batch, every job with one result. With nats.go's default pings it noticed after 4 minutes.
func TestAWorkerCutOffFromItsNodeMovesToAnother(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node NATS cluster; skipped with -short")
	}
	t.Parallel()
	const total, batch = 120, "partition"
	c := fleettest.StartCluster(t, 3)
	qcfg := queue.Config{Replicas: 3, AckWait: 4 * time.Second, MaxAckPending: 64}
	_, simURL := startSim(t, tinkersim.Config{Capacity: 256, BaseLatency: 200 * time.Millisecond})

	admin := c.Connect(t, 1, "test", qcfg)
	var link fleettest.Partition
	q := fleettest.Queue(t, c.URLs(0), qcfg, nats.DontRandomize(), nats.Name("worker"), nats.SetCustomDialer(&link))
	runWorker(t, q, simURL, 8)
	publishJobs(t, admin, batch, makeJobs(total))

	ctx := context.Background()
	fleettest.Eventually(t, 60*time.Second, "a first few results", func() bool {
		n, err := admin.ResultsStored(ctx, batch)
		return err == nil && n >= 8
	})
	done, _ := admin.ResultsStored(ctx, batch)
	link.Cut(c.URL(0))
	cut := time.Now()
	t.Logf("cut the worker's link to %s with %d of %d results stored", c.Name(0), done, total)

	// The pings notice within (MaxPingsOut+1) intervals; the rest of the batch takes seconds.
	within := (queue.MaxPingsOut+1)*queue.PingInterval + 30*time.Second
	fleettest.Eventually(t, within, "every result", func() bool {
		n, err := admin.ResultsStored(ctx, batch)
		return err == nil && n >= total
	})
	nc := q.JS.Conn()
	t.Logf("every result %s after the cut; the worker is on %s", time.Since(cut).Round(time.Millisecond), nc.ConnectedServerName())
	// By name: a node is reached at the URLs it gossips too, which the cut may not spell alike.
	if name := nc.ConnectedServerName(); name == c.Name(0) || nc.Stats().Reconnects == 0 {
		t.Errorf("the worker is on %s after %d reconnects; want another node than %s", name, nc.Stats().Reconnects, c.Name(0))
	}

	counts, _ := readResults(t, admin, batch)
	for _, j := range makeJobs(total) {
		if counts[j.CustomID] != 1 {
			t.Errorf("custom_id %s: %d results, want 1", j.CustomID, counts[j.CustomID])
		}
	}
}

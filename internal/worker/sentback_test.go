package worker

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// cancelAfterSentBack records batch's manifest, runs w, publishes js as batch, waits until w
// has pulled every job and sent it back to the stream with a delay (for the pause or the
// failure the test set up), cancels the batch and returns when it did.
func cancelAfterSentBack(t *testing.T, b *testBundle, w *Worker, reg *prometheus.Registry, batch string, js []jobs.Job) time.Time {
	t.Helper()
	ctx := context.Background()
	if _, err := b.results.PutManifest(ctx, queue.Manifest{BatchID: batch, Status: queue.BatchSubmitted, Jobs: len(js)}, 0); err != nil {
		t.Fatal(err)
	}
	run(t, w)
	publishJobs(t, b.results, batch, js)
	fleettest.Eventually(t, 30*time.Second, "every job sent back", func() bool {
		return counterValue(t, reg, "tinkerfleet_jobs_pulled_total", "") >= float64(len(js))
	})
	fleettest.Eventually(t, 30*time.Second, "every job waiting out its delay in the stream", func() bool {
		w.alive.mu.Lock()
		held := len(w.alive.msgs)
		w.alive.mu.Unlock()
		info, err := b.results.Jobs.Info(ctx)
		return held == 0 && err == nil && info.State.Msgs == uint64(len(js))
	})
	time.Sleep(200 * time.Millisecond) // the last naks are on their way
	if _, err := b.results.UpdateManifest(ctx, batch, func(m *queue.Manifest) error {
		m.Status, m.CancelledAt = queue.BatchCancelled, time.Now().UTC()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

// wantCancelledSoon waits for the n results of batch, cancelled at cancelledAt, and fails
// unless each is cancelled and all came within seconds of the cancel, and the work queue
// holds none of its jobs any more.
func wantCancelledSoon(t *testing.T, b *testBundle, batch string, n int, cancelledAt time.Time) {
	t.Helper()
	for id, r := range waitResults(t, b.results, batch, n, 10*time.Second) {
		if r.Status != jobs.StatusCancelled {
			t.Errorf("%s: %s, want cancelled", id, r.Status)
		}
	}
	t.Logf("%d cancelled results %v after the cancel", n, time.Since(cancelledAt).Round(time.Millisecond))
	fleettest.Eventually(t, 10*time.Second, "the work queue to let go of the cancelled jobs", func() bool {
		info, err := b.results.Jobs.Info(context.Background())
		if err != nil {
			return false
		}
		c, err := b.results.Consumer(context.Background())
		if err != nil {
			return false
		}
		ci, err := c.Info(context.Background())
		return err == nil && info.State.Msgs == 0 && ci.NumAckPending == 0
	})
}

// TestJobsWaitingOutAPauseInTheStreamEndSoonAfterTheirBatchIsCancelled: jobs sent back to
// wait out a long fleet pause in the stream (NakWithDelay of the pause's remaining time) end
// as cancelled results soon after their batch is cancelled. They ended only once the server
// delivered them again, when the pause was over: a reader waited on the batch for minutes
// after the cancel.
func TestJobsWaitingOutAPauseInTheStreamEndSoonAfterTheirBatchIsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{})
	reg := prometheus.NewRegistry()
	w := b.open(t, b.connect(t), Config{Concurrency: 4, Registerer: reg})
	if err := w.Backoff().Signal(context.Background(), backoff.ReasonPausedCapacity, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	cancelledAt := cancelAfterSentBack(t, b, w, reg, "paused", tokenJobs("p", 8))
	wantCancelledSoon(t, b, "paused", 8, cancelledAt)
	if got := b.sim.Stats().SamplesAccepted; got != 0 {
		t.Fatalf("the service accepted %d samples", got)
	}
}

// TestJobsWaitingToBeRetriedEndSoonAfterTheirBatchIsCancelled: jobs that failed transiently
// and wait in the stream for their retry delay (up to 5 minutes) end as cancelled results
// soon after their batch is cancelled, not when the delay is over.
func TestJobsWaitingToBeRetriedEndSoonAfterTheirBatchIsCancelled(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 8,
		Faults: []tinkersim.Fault{{Kind: tinkersim.FaultFailed, Category: "server"}}})
	reg := prometheus.NewRegistry()
	w := b.open(t, b.connect(t), Config{Concurrency: 4, Registerer: reg, RetryDelay: 2 * time.Minute})
	cancelledAt := cancelAfterSentBack(t, b, w, reg, "failing", tokenJobs("f", 4))
	wantCancelledSoon(t, b, "failing", 4, cancelledAt)
	if got := b.sim.Stats().SamplesAccepted; got != 4 {
		t.Fatalf("the service accepted %d samples, want one per job (4)", got)
	}
}

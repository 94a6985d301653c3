package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestACancelInABatchesBucketMadeAgainIsHeard: a batches bucket deleted and made again (by the
// next submit's or worker's set-up) numbers its revisions from 1 again; nats.go made the
// watch's consumer again past them, and the watch was silent for good: a cancel was never
// heard, and workers sampled the cancelled batch on. The watch now starts again from the new
// bucket's start, and forgets the batches the old one held.
func TestACancelInABatchesBucketMadeAgainIsHeard(t *testing.T) {
	t.Parallel()
	emb := fleettest.NATS(t)
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	ctx := context.Background()
	for i := range 20 {
		if _, err := q.PutManifest(ctx, queue.Manifest{BatchID: fmt.Sprintf("b%02d", i), Status: queue.BatchSubmitted}, 0); err != nil {
			t.Fatal(err)
		}
	}
	cancelBatch := func(q *queue.Queue, batch string) {
		t.Helper()
		if _, err := q.UpdateManifest(ctx, batch, func(m *queue.Manifest) error { m.Status = queue.BatchCancelled; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	cancelBatch(q, "b03")

	var s cancelSet
	loaded := make(chan struct{})
	var once sync.Once
	watchCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		check := bucketOf(q, q.Names.BatchesBucket())
		check.every = 50 * time.Millisecond
		s.watchChecking(watchCtx, q, slog.New(slog.DiscardHandler), func() { once.Do(func() { close(loaded) }) }, check)
	}()
	defer func() { stop(); <-done }()
	<-loaded
	fleettest.Eventually(t, 5*time.Second, "the cancel of b03 to be heard", func() bool { return s.has("b03") })

	if err := q.JS.DeleteKeyValue(ctx, q.Names.BatchesBucket()); err != nil {
		t.Fatal(err)
	}
	again := fleettest.Queue(t, emb.ClientURL(), queue.Config{}) // makes it again, as the next submit does
	if _, err := again.PutManifest(ctx, queue.Manifest{BatchID: "new", Status: queue.BatchSubmitted}, 0); err != nil {
		t.Fatal(err)
	}
	cancelBatch(again, "new") // revision 2 of the new bucket
	fleettest.Eventually(t, 5*time.Second, "the cancel in the bucket made again to be heard", func() bool {
		return s.has("new") && !s.has("b03")
	})
}

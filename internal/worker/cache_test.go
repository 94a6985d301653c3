package worker

import (
	"context"
	"errors"
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

// TestEndedContextsEndOnTheirBatchsCancel: the jobs of a batch at the gate share one context,
// done (cause errBatchCancelled) when the batch is found cancelled, by its manifest or by a
// watch that starts again; one handed out for a batch cancelled already is done at once. No
// context is kept once nobody holds it, nor once its batch is cancelled.
func TestEndedContextsEndOnTheirBatchsCancel(t *testing.T) {
	t.Parallel()
	var s cancelSet
	a1, forgetA1 := s.endedContext("a")
	a2, forgetA2 := s.endedContext("a")
	b, forgetB := s.endedContext("b")
	if a1 != a2 {
		t.Fatal("two jobs of one batch got contexts of their own")
	}
	s.set("a", &queue.Manifest{BatchID: "a", Status: queue.BatchSubmitted})
	if a1.Err() != nil || b.Err() != nil {
		t.Fatal("a context ended without a cancel")
	}
	s.set("a", &queue.Manifest{BatchID: "a", Status: queue.BatchCancelled})
	if !errors.Is(context.Cause(a1), errBatchCancelled) || b.Err() != nil {
		t.Fatalf("after a's cancel: a %v, b %v; want a cancelled, b not", context.Cause(a1), b.Err())
	}
	if late, forget := s.endedContext("a"); !errors.Is(context.Cause(late), errBatchCancelled) {
		t.Fatalf("a context of a batch cancelled already: %v", context.Cause(late))
	} else {
		forget()
	}
	s.replace(map[string]bool{"b": true}) // a watch started again finds b deleted
	if !errors.Is(context.Cause(b), errBatchCancelled) {
		t.Fatalf("after a watch found b deleted: %v", context.Cause(b))
	}
	forgetA1()
	forgetA2()
	forgetB()
	c, forgetC := s.endedContext("c")
	forgetC()
	if len(s.waiting) != 0 {
		t.Fatalf("%d batches' contexts kept after their jobs let go", len(s.waiting))
	}
	if c.Err() == nil {
		t.Fatal("a context held by nobody was not released")
	}
}

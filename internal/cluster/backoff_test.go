package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestSignalsRacingOnADeletedKeyAllSucceed: workers that signal together just after the
// account's key was deleted by hand (an operator clearing a pause) race to create it again.
// The losers write again over the winner, as after any lost race; in a replicated bucket
// nats.go hands them the server's bare "wrong last sequence" (10164), which Signal reported
// as a failure. Every fleet ends paused for the pause asked.
func TestSignalsRacingOnADeletedKeyAllSucceed(t *testing.T) {
	c := fleettest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const signallers = 6
	var kv jetstream.KeyValue
	fleets := make([]*backoff.Fleet, signallers)
	for i := range fleets {
		q := c.Connect(t, i%c.Len(), fmt.Sprintf("signaller-%d", i), queue.Config{Replicas: 3})
		f, err := backoff.Open(ctx, q.JS, backoff.Config{Bucket: q.Names.BackoffBucket(), Account: "acct", Replicas: 3,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		fleets[i] = f
		if kv == nil {
			if kv, err = q.JS.KeyValue(ctx, q.Names.BackoffBucket()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for round := 1; round <= 10; round++ {
		if _, err := kv.Put(ctx, "acct", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, "acct"); err != nil {
			t.Fatal(err)
		}
		// Each round asks for a longer pause than the last, which no fleet holds yet (and
		// within the longest a fleet honours, backoff.MaxPause).
		d := time.Duration(round) * 5 * time.Minute
		errs := make(chan error, signallers)
		var wg sync.WaitGroup
		for _, f := range fleets {
			wg.Go(func() { errs <- f.Signal(ctx, "429", d) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		// Every fleet is paused for the round's pause.
		fleettest.Eventually(t, 10*time.Second, "every fleet paused for the round's pause", func() bool {
			for _, f := range fleets {
				if time.Until(f.Until()) < d-time.Minute {
					return false
				}
			}
			return true
		})
	}
}

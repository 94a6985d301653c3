package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestAJobHandedBackOutlivesAServerRestart: a job handed back just before its NATS server
// stops (an interrupted submit --local stops its embedded server right after its worker) is
// delivered again as soon as a server runs on the store again. A plain nak only queues the
// job again in the server's memory, and a nak sent is not yet handled: the restarted server
// waited out AckWait (30 s) first, and the rerun of an interrupted submit --local sat on its
// last few hundred jobs.
func TestAJobHandedBackOutlivesAServerRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	b := setupIn(t, dir, Config{}) // AckWait 30 s
	const n = 3
	for _, id := range []string{"a", "b", "c"} {
		publishJob(t, b.q, "b1", id)
	}
	p := newPuller(t, b)
	var held []jetstream.Msg
	if got, err := p.Pull(ctx, n, time.Second, func(m jetstream.Msg) { held = append(held, m) }); err != nil || got != n {
		t.Fatalf("pull: %d, %v", got, err)
	}
	for _, m := range held {
		if err := HandBack(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := held[0].Ack(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		t.Fatalf("ack after HandBack: %v, want ErrMsgAlreadyAckd", err)
	}
	b.nc.Close()
	b.emb.Shutdown()

	again := setupIn(t, dir, Config{})
	cons, err := again.q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		if d := NumDelivered(m); d != 2 {
			t.Errorf("%s delivered %d times, want 2", m.Headers().Get(HeaderCustomID), d)
		}
		got++
	}
	if got != n {
		t.Fatalf("%d of the %d jobs handed back came within 5 s of the restart", got, n)
	}
}

// TestHandBackDoesNotWaitForAServerThatIsGone: with the connection down, HandBack leaves the
// nak to nats.go's reconnect buffer and returns, rather than wait out its context for a
// reply no server can send (a worker stopping in an outage took that long per job).
func TestHandBackDoesNotWaitForAServerThatIsGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, Config{})
	publishJob(t, b.q, "b1", "a")
	p := newPuller(t, b)
	var held []jetstream.Msg
	if got, err := p.Pull(ctx, 1, time.Second, func(m jetstream.Msg) { held = append(held, m) }); err != nil || got != 1 {
		t.Fatalf("pull: %d, %v", got, err)
	}
	b.emb.Shutdown()
	waitFor(t, "the connection to drop", func() bool { return !b.nc.IsConnected() })
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	began := time.Now()
	if err := HandBack(wait, held[0]); err != nil {
		t.Fatalf("hand back while disconnected: %v", err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("HandBack took %v with no server to answer it", took)
	}
}

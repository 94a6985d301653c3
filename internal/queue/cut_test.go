package queue_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestWriteToAServerGoneIsStoreUnavailable: a result whose write fails on the socket (the
// server went away under the connection; nats.go reconnects) is "cannot store now", to be
// held and published again, not a refusal that would have its job sampled again; published
// again after the reconnect, it is stored.
func TestWriteToAServerGoneIsStoreUnavailable(t *testing.T) {
	t.Parallel()
	var dialer fleettest.WriteCutter
	q := fleettest.Queue(t, fleettest.NATS(t).ClientURL(), queue.Config{}, nats.SetCustomDialer(&dialer))
	p, err := q.NewResultPublisher()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := q.JS.Conn().Flush(); err != nil { // nothing left in nats.go's buffer to take the cut
		t.Fatal(err)
	}

	// Larger than nats.go's 32 KiB write buffer, so the publish itself writes to the socket.
	msg := nats.NewMsg(q.Names.ResultSubject("b1", "id-0"))
	msg.Header.Set(queue.HeaderCustomID, "id-0")
	msg.Data = make([]byte, 40<<10)
	rand.Read(msg.Data)
	errs := make([]error, 1)
	ctx := context.Background()
	dialer.CutNextWrite()
	p.Publish(ctx, []*nats.Msg{msg}, errs)
	if errs[0] == nil {
		t.Fatal("a result was stored through a write that failed")
	}
	if !queue.StoreUnavailable(errs[0]) {
		t.Fatalf("%v: not taken for a store that is unavailable now", errs[0])
	}

	fleettest.Eventually(t, 10*time.Second, "the result stored after the reconnect", func() bool {
		p.Publish(ctx, []*nats.Msg{msg}, errs)
		return errs[0] == nil
	})
	if ok, err := q.HasResult(ctx, "b1", "id-0"); !ok || err != nil {
		t.Fatalf("result stored: %v, %v", ok, err)
	}
}

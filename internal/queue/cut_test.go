package queue_test

import (
	"context"
	"crypto/rand"
	"errors"
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

// TestResultsWaitNoLongerThanTheirConnection: a group published on a link that then died
// silently will not be acked; once the connection is dropped as stale, the publisher stops
// waiting (the drop is "cannot store now", as a reconnect is) rather than wait out its 5 s.
func TestResultsWaitNoLongerThanTheirConnection(t *testing.T) {
	t.Parallel()
	var link fleettest.Partition
	url := fleettest.NATS(t).ClientURL()
	// Pings far quicker than a worker's, so that the link's death shows at once.
	q := fleettest.Queue(t, url, queue.Config{}, nats.SetCustomDialer(&link),
		nats.PingInterval(100*time.Millisecond), nats.MaxPingsOutstanding(1))
	p, err := q.NewResultPublisher()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	msg := nats.NewMsg(q.Names.ResultSubject("b1", "id-0"))
	msg.Header.Set(queue.HeaderCustomID, "id-0")
	errs := make([]error, 1)
	link.Cut(url)
	p.Publish(context.Background(), []*nats.Msg{msg}, errs)
	if !errors.Is(errs[0], nats.ErrDisconnected) || !queue.StoreUnavailable(errs[0]) {
		t.Fatalf("publish on a link that died: %v; want the drop (nats.ErrDisconnected), a store unavailable now", errs[0])
	}
}

// TestAPastDropEndsNoLaterWait: a drop the connection has recovered from is not taken for one
// under the next group: published after the reconnect, the group is stored at once.
func TestAPastDropEndsNoLaterWait(t *testing.T) {
	t.Parallel()
	q := fleettest.Queue(t, fleettest.NATS(t).ClientURL(), queue.Config{})
	p, err := q.NewResultPublisher()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	nc := q.JS.Conn()
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 10*time.Second, "the reconnect", func() bool { return nc.Stats().Reconnects == 1 && nc.IsConnected() })
	msg := nats.NewMsg(q.Names.ResultSubject("b1", "id-0"))
	msg.Header.Set(queue.HeaderCustomID, "id-0")
	errs := make([]error, 1)
	if p.Publish(context.Background(), []*nats.Msg{msg}, errs); errs[0] != nil {
		t.Fatalf("publish after a reconnect: %v", errs[0])
	}
}

package queue_test

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
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

// TestALinkThatDiesWithItsBuffersFullIsDroppedWithinTheWriteTimeout: on a link that died
// silently under load, the socket's buffers fill and a write waits, holding the connection's
// lock, which the ping timer needs too. The write gives up after WriteTimeout, closing its
// socket, and the connection is dropped then: sooner than the pings could tell (they need 2-3
// intervals), and far sooner than with nats.go's default (a minute's write, and then the
// pings). Before the close, the ping timer sometimes took the lock first and waited out a
// second WriteTimeout, writing in place (a failed CI run: not dropped within 15 s).
func TestALinkThatDiesWithItsBuffersFullIsDroppedWithinTheWriteTimeout(t *testing.T) {
	t.Parallel()
	link := fleettest.Partition{SendBuffer: 1} // full after the first write
	url := fleettest.NATS(t).ClientURL()
	dropped := make(chan error, 1)
	nc, err := queue.Connect(queue.ConnectConfig{URL: url, Name: t.Name()}, nats.SetCustomDialer(&link),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			select {
			case dropped <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	link.Cut(url)
	cut := time.Now()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // a worker's steady trickle of small messages, each written by nats.go's flusher
		defer close(stopped)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			_ = nc.Publish("trickle", []byte("x"))
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { close(stop); nc.Close(); <-stopped }()
	limit := queue.WriteTimeout + queue.PingInterval/2 // the pings alone would take 2-3 intervals
	select {
	case err := <-dropped:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("dropped for %v; want the write's timeout", err)
		}
		t.Logf("dropped %v after the link died", time.Since(cut).Round(time.Millisecond))
	case <-time.After(limit):
		t.Errorf("the connection was not dropped within %v of its link's death", limit)
	}
}

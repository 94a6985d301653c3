package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// heldMsgs returns n job messages delivered by a real consumer, as a worker holds them.
func heldMsgs(t *testing.T, n int) []jetstream.Msg {
	t.Helper()
	q := fleettest.Queue(t, fleettest.NATS(t).ClientURL(), queue.Config{})
	publishJobs(t, q, "alive", tokenJobs("alive-", n))
	return take(t, q, n)
}

// TestARoundOfInProgressRenewsOnlyNewsThatHadNotLapsed: a round whose flush comes back is news
// of the jobs the server still gave this worker; a job whose news had lapsed may be another
// worker's by then, and stays stale, and so does one that lapses before the flush comes back.
// A round whose flush does not come back is no news. And a round runs at once when the link is
// back, not a period later.
func TestARoundOfInProgressRenewsOnlyNewsThatHadNotLapsed(t *testing.T) {
	t.Parallel()
	msgs := heldMsgs(t, 2)
	fresh, lapsed := msgs[0], msgs[1]
	const ackWait = 6 * time.Second
	a := aliveSet{staleAfter: staleAfter(ackWait)}
	a.add(fresh)
	a.add(lapsed)
	now := time.Now().UnixNano()
	a.mu.Lock()
	a.msgs[fresh] = now - int64(ackWait/2)
	a.msgs[lapsed] = now - int64(ackWait)
	a.mu.Unlock()
	if a.stale(fresh, time.Now()) || !a.stale(lapsed, time.Now()) {
		t.Fatal("news half an ack wait old is stale, or news an ack wait old is not")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	again := make(chan struct{})
	flushed := make(chan error)
	go a.keepAlive(ctx, time.Hour, again, func(time.Duration) error {
		select {
		case err := <-flushed:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// A round runs when the link is back (again), not a period later; once the next round
	// has begun, the one before has ended.
	linkBack := func() {
		t.Helper()
		select {
		case again <- struct{}{}:
		case <-time.After(5 * time.Second):
			t.Fatal("no round of InProgress when the link came back")
		}
	}
	answer := func(err error) {
		t.Helper()
		select {
		case flushed <- err:
		case <-time.After(5 * time.Second):
			t.Fatal("a round without a flush")
		}
	}
	linkBack()
	answer(errors.New("no pong"))
	start := time.Now()
	linkBack()
	if left := a.lapsesIn(fresh, time.Now()); left > ackWait/3 {
		t.Fatalf("a round whose flush failed renewed the news: it lapses in %v", left)
	}
	answer(nil)
	linkBack()
	if left := a.lapsesIn(fresh, time.Now()); left < time.Until(start.Add(time.Duration(a.staleAfter))) {
		t.Fatalf("a round whose flush came back did not renew the news of a job still held: it lapses in %v", left)
	}
	if !a.stale(lapsed, time.Now()) {
		t.Fatal("a round renewed the news of a job that had lapsed, which the server may have given out")
	}

	// A round whose flush comes back only after the news lapsed (its writes held by a stalled
	// link meanwhile) may have reached the server after the job was given out: no news.
	a.mu.Lock()
	a.msgs[fresh] = time.Now().UnixNano() - a.staleAfter + int64(300*time.Millisecond) // the round began before
	a.mu.Unlock()
	time.Sleep(400 * time.Millisecond)
	answer(nil)
	linkBack()
	if !a.stale(fresh, time.Now()) {
		t.Fatal("a round whose flush came back after the news had lapsed renewed it")
	}
}

// TestALinkInDoubtIsHeardAgain: a link whose flushes fail is in doubt after linkDoubtAfter;
// the first flush that comes back ends the doubt, wakes those waiting for it, and asks for a
// round of InProgress at once.
func TestALinkInDoubtIsHeardAgain(t *testing.T) {
	t.Parallel()
	l := newLink()
	l.heard.Store(time.Now().Add(-2 * linkDoubtAfter).UnixNano())
	if !l.doubtful(time.Now()) {
		t.Fatal("a link not heard for twice linkDoubtAfter is not in doubt")
	}
	back := l.next()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.probe(ctx, func(time.Duration) error { return nil })
	select {
	case <-back:
	case <-time.After(5 * time.Second):
		t.Fatal("no word that the link is back")
	}
	if l.doubtful(time.Now()) {
		t.Fatal("still in doubt after a flush came back")
	}
	select {
	case <-l.again:
	default:
		t.Fatal("no round of InProgress asked for when the link came back")
	}
}

// holds finds a held job by its stream sequence, and renews its news: the server has just
// delivered it again, to this worker.
func TestHoldsFindsAHeldJobBySequenceAndRenewsIt(t *testing.T) {
	t.Parallel()
	msgs := heldMsgs(t, 2)
	a := aliveSet{staleAfter: staleAfter(6 * time.Second)}
	a.add(msgs[0])
	a.mu.Lock()
	a.msgs[msgs[0]] = time.Now().Add(-time.Hour).UnixNano()
	a.mu.Unlock()
	held, _ := queue.StreamSeq(msgs[0])
	other, _ := queue.StreamSeq(msgs[1])
	if !a.holds(held) || a.holds(other) {
		t.Fatalf("holds(%d) = %v, holds(%d) = %v; want the held job alone", held, a.holds(held), other, a.holds(other))
	}
	if a.stale(msgs[0], time.Now()) {
		t.Fatal("a held job delivered again is still stale")
	}
}

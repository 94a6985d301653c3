package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// link knows whether the NATS server hears this worker, from a flush (a PING, answered once the
// server has read everything sent before it) every linkProbeEvery. A worker whose link is in
// doubt sends no sample: if the link is down for longer than the ack wait, the server gives
// the job to another worker, which samples it too. A job waits instead, until the link is
// back or its news has lapsed (aliveSet.stale).
//
// nats.go's own pings notice a dead link only after 20-30 s (queue.Connect), most of an ack
// wait; a flush every second notices in a few.
type link struct {
	heard atomic.Int64 // unix nanos when the last flush that came back was sent

	mu   sync.Mutex
	back chan struct{} // closed when the next flush comes back

	// again gets a value when a flush comes back while the link was in doubt: the jobs held
	// are told of at once (aliveSet.keepAlive), before the ack wait of more runs out.
	again chan struct{}
}

const (
	// linkProbeEvery is how often the link is probed.
	linkProbeEvery = time.Second
	// linkDoubtAfter is how long without a flush that came back puts the link in doubt: three
	// probes, so a server slow to answer one for a moment stops no sample.
	linkDoubtAfter = 3 * time.Second
)

// newLink returns a link heard of now, the moment its connection is known to work.
func newLink() *link {
	l := &link{back: make(chan struct{}), again: make(chan struct{}, 1)}
	l.heard.Store(time.Now().UnixNano())
	return l
}

// doubtful reports whether no flush sent within linkDoubtAfter before now has come back.
func (l *link) doubtful(now time.Time) bool {
	return now.UnixNano()-l.heard.Load() > int64(linkDoubtAfter)
}

// next returns a channel closed when the next flush comes back.
func (l *link) next() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.back
}

// probe flushes at once and then every linkProbeEvery until ctx is done, and notes each flush
// that comes back.
func (l *link) probe(ctx context.Context, flush func(timeout time.Duration) error) {
	t := time.NewTicker(linkProbeEvery)
	defer t.Stop()
	for {
		sent := time.Now()
		if flush(linkDoubtAfter) == nil {
			if l.doubtful(sent) {
				select {
				case l.again <- struct{}{}:
				default:
				}
			}
			l.heard.Store(sent.UnixNano())
			l.mu.Lock()
			close(l.back)
			l.back = make(chan struct{})
			l.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

package worker

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// aliveSet holds the messages of the jobs this worker holds, from their delivery until they
// are settled, so that one ticker can tell JetStream about all of them (InProgress) instead
// of a timer per job, and so that a job delivered again while the worker holds it is known.
//
// It also knows when the server last heard of each job from this worker: its delivery, or
// the last InProgress known to have reached the server (a round of them followed by a flush
// that came back) while the job was still this worker's. A job the server has not heard of
// for longer than its ack wait is given out again, to another worker if one asks first; one
// not heard of for staleAfter may have been (stale).
type aliveSet struct {
	mu sync.Mutex
	// msgs maps each held message to when the server last heard of its job, in unix
	// nanoseconds.
	msgs map[jetstream.Msg]int64
	// staleAfter is the ack wait less a margin, in nanoseconds; 0 takes no job for stale.
	staleAfter int64
}

// staleAfter is aliveSet.staleAfter for jobs given out again after ackWait without news of
// them: a sixth of it is left for the news on its way (a flush that comes back late, the
// server's timer, the asample about to be sent). A round of InProgress every third of it
// keeps the news of a job at most a third old while the link is up.
func staleAfter(ackWait time.Duration) int64 { return int64(ackWait - ackWait/6) }

func (a *aliveSet) add(m jetstream.Msg) {
	now := time.Now().UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.addLocked(m, now)
}

func (a *aliveSet) addLocked(m jetstream.Msg, now int64) {
	if a.msgs == nil {
		a.msgs = make(map[jetstream.Msg]int64)
	}
	a.msgs[m] = now
}

// addAgain adds m, a job delivered again, unless the set holds another delivery of the same
// job (the same stream sequence), and reports whether it did. A first delivery cannot be
// held already, and is added with add, which reads nothing: this one looks at every held
// message, which only a redelivery pays for. The delivery held is the server's news of the
// job too: the job is this worker's again.
func (a *aliveSet) addAgain(m jetstream.Msg) bool {
	seq, ok := queue.StreamSeq(m)
	now := time.Now().UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	if ok {
		for held := range a.msgs {
			if s, _ := queue.StreamSeq(held); s == seq {
				a.msgs[held] = now
				return false
			}
		}
	}
	a.addLocked(m, now)
	return true
}

// holds reports whether the set holds a delivery of the job at stream sequence seq; that
// delivery is the server's news of the job too, as in addAgain.
func (a *aliveSet) holds(seq uint64) bool {
	now := time.Now().UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	for held := range a.msgs {
		if s, ok := queue.StreamSeq(held); ok && s == seq {
			a.msgs[held] = now
			return true
		}
	}
	return false
}

func (a *aliveSet) remove(m jetstream.Msg) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.msgs, m)
}

// stale reports whether the server has not heard of m's job from this worker for staleAfter
// at now: its ack wait may have run out, and the job gone to another worker, which samples
// it. (The server takes the acks and InProgress of either delivery, by the job's stream
// sequence, so this worker cannot tell.)
func (a *aliveSet) stale(m jetstream.Msg, now time.Time) bool {
	return a.lapsesIn(m, now) <= 0
}

// lapsesIn says how long after now m's job becomes stale, if no news of it reaches the server
// meanwhile; a long time for a message not held, or with staleAfter 0.
func (a *aliveSet) lapsesIn(m jetstream.Msg, now time.Time) time.Duration {
	a.mu.Lock()
	heard, ok := a.msgs[m]
	a.mu.Unlock()
	if !ok || a.staleAfter == 0 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(heard + a.staleAfter - now.UnixNano())
}

// keepAlive sends InProgress for every held message each period, and when again gets a value
// (the link to NATS is back), until ctx is done, so a job that waits minutes on a paused queue
// or a long sample is not redelivered (AckWait). A round whose flush comes back within the
// period reached the server: its jobs were heard of at its start (the server's ack wait starts
// again no earlier), but for those whose news had lapsed by the time the flush came back: its
// InProgress may have arrived only then (written once a stalled link moved again), after the
// server gave the job out.
func (a *aliveSet) keepAlive(ctx context.Context, period time.Duration, again <-chan struct{}, flush func(timeout time.Duration) error) {
	t := time.NewTicker(period)
	defer t.Stop()
	var batch []jetstream.Msg
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-again:
		}
		start := time.Now().UnixNano()
		a.mu.Lock()
		batch = batch[:0]
		for m := range a.msgs {
			batch = append(batch, m)
		}
		a.mu.Unlock()
		for _, m := range batch {
			_ = m.InProgress()
		}
		if len(batch) == 0 || flush(period) != nil {
			continue
		}
		arrived := time.Now().UnixNano() // at the latest
		a.mu.Lock()
		for _, m := range batch {
			if heard, ok := a.msgs[m]; ok && heard < start && arrived-heard < a.staleAfter {
				a.msgs[m] = start
			}
		}
		a.mu.Unlock()
	}
}

package worker

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// aliveSet holds the messages of the jobs this worker holds, from their delivery until they
// are settled, so that one ticker can tell JetStream about all of them (InProgress) instead
// of a timer per job, and so that a job delivered again while the worker holds it is known.
type aliveSet struct {
	mu   sync.Mutex
	msgs map[jetstream.Msg]struct{}
}

func (a *aliveSet) add(m jetstream.Msg) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.addLocked(m)
}

func (a *aliveSet) addLocked(m jetstream.Msg) {
	if a.msgs == nil {
		a.msgs = make(map[jetstream.Msg]struct{})
	}
	a.msgs[m] = struct{}{}
}

// addAgain adds m, a job delivered again, unless the set holds another delivery of the same
// job (the same stream sequence), and reports whether it did. A first delivery cannot be
// held already, and is added with add, which reads nothing: this one looks at every held
// message, which only a redelivery pays for.
func (a *aliveSet) addAgain(m jetstream.Msg) bool {
	seq, ok := queue.StreamSeq(m)
	a.mu.Lock()
	defer a.mu.Unlock()
	if ok {
		for held := range a.msgs {
			if s, _ := queue.StreamSeq(held); s == seq {
				return false
			}
		}
	}
	a.addLocked(m)
	return true
}

func (a *aliveSet) remove(m jetstream.Msg) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.msgs, m)
}

// keepAlive sends InProgress for every held message each period until ctx is done, so a job
// that waits minutes on a paused queue or a long sample is not redelivered (AckWait).
func (a *aliveSet) keepAlive(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	var batch []jetstream.Msg
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		batch = batch[:0]
		for m := range a.msgs {
			batch = append(batch, m)
		}
		a.mu.Unlock()
		for _, m := range batch {
			_ = m.InProgress()
		}
	}
}

package worker

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// aliveSet holds the messages of the jobs being worked on, so that one ticker can tell
// JetStream about all of them (InProgress) instead of a timer per job.
type aliveSet struct {
	mu   sync.Mutex
	msgs map[jetstream.Msg]struct{}
}

func (a *aliveSet) add(m jetstream.Msg) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.msgs == nil {
		a.msgs = make(map[jetstream.Msg]struct{})
	}
	a.msgs[m] = struct{}{}
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

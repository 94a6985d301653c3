package tinker

import (
	"context"
	"encoding/json"
	"sync"
	"time"
)

// localDispatcher is the default gate: no limits, only the per-client backoff
// deadline of §5.1 (which, as invariant 4 of the architecture says, only moves
// forward).
type localDispatcher struct {
	clock Clock
	mu    sync.Mutex
	until time.Time
}

func (d *localDispatcher) Acquire(ctx context.Context, _ int64) (func(bool), error) {
	return func(bool) {}, ctx.Err()
}

func (d *localDispatcher) Wait(ctx context.Context) error {
	for {
		d.mu.Lock()
		wait := d.until.Sub(d.clock.Now())
		d.mu.Unlock()
		if wait <= 0 {
			return ctx.Err()
		}
		if err := d.clock.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

func (d *localDispatcher) Backoff(_ context.Context, _ string, dur time.Duration) {
	d.mu.Lock()
	if u := d.clock.Now().Add(dur); u.After(d.until) {
		d.until = u
	}
	d.mu.Unlock()
}

// byteSemaphore is the in-flight response bytes semaphore of §4.4 with the
// "may go negative" semantics of §5.2: a request waits only while the budget is
// negative; otherwise it takes its full charge.
type byteSemaphore struct {
	mu    sync.Mutex
	avail int64
	wake  chan struct{} // closed and replaced on every release
}

func newByteSemaphore(size int64) *byteSemaphore {
	return &byteSemaphore{avail: size, wake: make(chan struct{})}
}

func (s *byteSemaphore) acquire(ctx context.Context, n int64) (func(), error) {
	for {
		s.mu.Lock()
		if s.avail >= 0 {
			s.avail -= n
			s.mu.Unlock()
			var once sync.Once
			return func() { once.Do(func() { s.release(n) }) }, nil
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		}
	}
}

func (s *byteSemaphore) release(n int64) {
	s.mu.Lock()
	s.avail += n
	close(s.wake)
	s.wake = make(chan struct{})
	s.mu.Unlock()
}

// mustJSON marshals values whose types cannot fail to encode.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("tinker: marshal " + err.Error())
	}
	return b
}

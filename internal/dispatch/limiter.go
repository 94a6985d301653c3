package dispatch

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of §5.2 / §5.4, used for zero (or negative) Config fields.
const (
	// DefaultCount is the size of the count semaphore (§5.2 layer 1).
	DefaultCount = 400
	// DefaultThrottled is the size of the throttled semaphore (§5.2 layer 2).
	DefaultThrottled = 10
	// DefaultBytes is the bytes budget, the server flag
	// sample_dispatch_bytes_semaphore_size (§3.1, §5.2): 10 MiB.
	DefaultBytes int64 = 10 << 20
	// DefaultBackoffFactor multiplies the byte charge while a backoff is recent (§5.2).
	DefaultBackoffFactor int64 = 20
	// DefaultRecentWindow is how long after a backoff ends it still counts as recent (§5.2).
	DefaultRecentWindow = 10 * time.Second
)

// ErrUsed is returned by Reservation.Acquire when the reservation was already
// used or released.
var ErrUsed = errors.New("dispatch: reservation already used or released")

// Config sizes a Limiter. Zero values mean the §5.2 defaults.
type Config struct {
	// Count is the number of count permits (default 400).
	Count int
	// Throttled is the number of throttled permits, taken only while a backoff
	// is recent (default 10).
	Throttled int
	// Bytes is the bytes budget (default 10 MiB; use the server's
	// sample_dispatch_bytes_semaphore_size when it sends one).
	Bytes int64
	// BackoffFactor multiplies the charged bytes while a backoff is recent
	// (default 20).
	BackoffFactor int64
	// RecentWindow is how long after the backoff deadline a backoff still
	// counts as recent (default 10 s).
	RecentWindow time.Duration
	// BackoffUntil returns the current backoff deadline (zero = none). It is
	// called on the fast path and must be cheap and do no I/O (an atomic load,
	// e.g. backoff.Fleet.Until). Nil means "never backing off".
	BackoffUntil func() time.Time
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Limiter is the three-layer dispatch limiter of §5.2: a count semaphore, a
// throttled semaphore taken only while a backoff is recent, and a bytes budget
// that may go negative. It is safe for concurrent use; waiters on each layer
// are served first in, first out.
type Limiter struct {
	factor       int64
	window       time.Duration
	backoffUntil func() time.Time
	now          func() time.Time

	mu        sync.Mutex // guards the waiter queues and every sem.avail write
	count     sem
	throttled sem
	bytes     sem

	estimated atomic.Int64 // uncharged estimated bytes of the permits held

	tickets sync.Pool // *ticket
	waiters sync.Pool // *waiter
}

// New returns a Limiter sized by cfg (zero fields take the §5.2 defaults).
func New(cfg Config) *Limiter {
	if cfg.Count <= 0 {
		cfg.Count = DefaultCount
	}
	if cfg.Throttled <= 0 {
		cfg.Throttled = DefaultThrottled
	}
	if cfg.Bytes <= 0 {
		cfg.Bytes = DefaultBytes
	}
	if cfg.BackoffFactor <= 0 {
		cfg.BackoffFactor = DefaultBackoffFactor
	}
	if cfg.RecentWindow <= 0 {
		cfg.RecentWindow = DefaultRecentWindow
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Limiter{
		factor:       cfg.BackoffFactor,
		window:       cfg.RecentWindow,
		backoffUntil: cfg.BackoffUntil,
		now:          cfg.Now,
	}
	l.count.init(int64(cfg.Count), false)
	l.throttled.init(int64(cfg.Throttled), false)
	l.bytes.init(cfg.Bytes, true)
	return l
}

// Recent reports whether a backoff is recent: a deadline is set and
// now − deadline < RecentWindow, i.e. from the moment a backoff is set until
// RecentWindow after it expires (§5.2).
func (l *Limiter) Recent() bool {
	if l.backoffUntil == nil {
		return false
	}
	until := l.backoffUntil()
	// The clock is read only when a deadline is set (the common no-backoff
	// case costs one atomic load).
	return !until.IsZero() && l.now().Sub(until) < l.window
}

// Acquire blocks until a submission whose prompt is estimated at bytes may be
// sent (§5.2): it takes a count permit, then a throttled permit if a backoff
// is recent, then charges bytes (×BackoffFactor if a backoff is recent) to
// the bytes budget. Hold the Permit only until asample has been accepted or
// has failed (§5.1), then Release it. On error (ctx done) nothing is held.
func (l *Limiter) Acquire(ctx context.Context, bytes int64) (Permit, error) {
	r, err := l.Reserve(ctx)
	if err != nil {
		return Permit{}, err
	}
	return r.Acquire(ctx, bytes)
}

// TryAcquire is Acquire without waiting: it takes the count permit, the
// throttled permit if a backoff is recent, and the byte charge all at once,
// only if each is free now and nobody is queued for it; ok is false
// otherwise, and nothing is held. Recent is evaluated once, for both layers.
func (l *Limiter) TryAcquire(bytes int64) (p Permit, ok bool) {
	bytes = max(bytes, 0)
	recent, charge := l.charge(bytes)
	l.mu.Lock()
	if !l.count.open(1) || !l.open(recent, charge) {
		l.mu.Unlock()
		return Permit{}, false
	}
	l.count.avail.Add(-1)
	l.take(recent, charge)
	l.mu.Unlock()
	t := l.getTicket()
	t.throttled, t.estimated, t.charge = recent, bytes, charge
	l.estimated.Add(bytes)
	return Permit{t: t, gen: t.gen.Load()}, true
}

// charge returns whether a backoff is recent and what bytes charge the bytes
// budget then.
func (l *Limiter) charge(bytes int64) (recent bool, charge int64) {
	if l.Recent() {
		return true, mulClamp(bytes, l.factor)
	}
	return false, bytes
}

// open reports whether the layers after the count permit can be taken now:
// the throttled permit if recent, and charge. Caller holds mu.
func (l *Limiter) open(recent bool, charge int64) bool {
	return (!recent || l.throttled.open(1)) && l.bytes.open(charge)
}

// take takes the layers after the count permit (see open). Caller holds mu.
func (l *Limiter) take(recent bool, charge int64) {
	if recent {
		l.throttled.avail.Add(-1)
	}
	l.bytes.avail.Add(-charge)
}

// Reserve blocks (first in, first out) until a count permit is free and takes
// it, without touching the other layers. A worker calls Reserve before it
// pulls a job, so it never holds more jobs between pull and dispatch than it
// has count permits (architecture invariant 5); it then calls
// Reservation.Acquire once the job is ready to be sent, or
// Reservation.Release if no job came.
func (l *Limiter) Reserve(ctx context.Context) (Reservation, error) {
	if err := ctx.Err(); err != nil {
		return Reservation{}, err
	}
	if err := l.acquire(ctx, &l.count, 1); err != nil {
		return Reservation{}, err
	}
	t := l.getTicket()
	return Reservation{t: t, gen: t.gen.Load()}, nil
}

// TryReserve takes a count permit like Reserve, but only if one is free now and
// nobody is queued for it; ok is false otherwise and nothing is held.
func (l *Limiter) TryReserve() (r Reservation, ok bool) {
	l.mu.Lock()
	if !l.count.open(1) {
		l.mu.Unlock()
		return Reservation{}, false
	}
	l.count.avail.Add(-1)
	l.mu.Unlock()
	t := l.getTicket()
	return Reservation{t: t, gen: t.gen.Load()}, true
}

// Free returns the number of count permits not held right now (neither by a
// Permit nor by a Reservation). It is a lock-free read for metrics and
// heuristics; use Reserve to actually claim a slot.
func (l *Limiter) Free() int { return int(l.count.avail.Load()) }

// Stats is a snapshot of the limiter's occupancy, for metrics.
type Stats struct {
	// CountInUse is the number of count permits held (Permits and Reservations).
	CountInUse int
	// CountCapacity is the size of the count semaphore.
	CountCapacity int
	// CountWaiting is the number of callers waiting for a count permit.
	CountWaiting int
	// ThrottledInUse is the number of throttled permits held.
	ThrottledInUse int
	// ThrottledCapacity is the size of the throttled semaphore.
	ThrottledCapacity int
	// ThrottledWaiting is the number of callers waiting for a throttled permit.
	ThrottledWaiting int
	// BytesCharged is the bytes charged against the budget by held permits
	// (estimated bytes, ×BackoffFactor for those taken while recent); it may
	// exceed BytesCapacity (§5.2 negative budget).
	BytesCharged int64
	// BytesEstimated is the uncharged estimated prompt bytes of held permits.
	BytesEstimated int64
	// BytesCapacity is the size of the bytes budget.
	BytesCapacity int64
	// BytesWaiting is the number of callers waiting for the budget to turn
	// non-negative.
	BytesWaiting int
	// Recent reports whether a backoff is recent right now.
	Recent bool
}

// Stats returns the current occupancy. Each field is an atomic read (no lock),
// so fields may be from slightly different instants under concurrency.
func (l *Limiter) Stats() Stats {
	return Stats{
		CountInUse:        int(l.count.capacity - l.count.avail.Load()),
		CountCapacity:     int(l.count.capacity),
		CountWaiting:      int(l.count.waiting.Load()),
		ThrottledInUse:    int(l.throttled.capacity - l.throttled.avail.Load()),
		ThrottledCapacity: int(l.throttled.capacity),
		ThrottledWaiting:  int(l.throttled.waiting.Load()),
		BytesCharged:      l.bytes.capacity - l.bytes.avail.Load(),
		BytesEstimated:    l.estimated.Load(),
		BytesCapacity:     l.bytes.capacity,
		BytesWaiting:      int(l.bytes.waiting.Load()),
		Recent:            l.Recent(),
	}
}

// ticket is the pooled state behind a Reservation and a Permit. gen counts
// ownership changes; a handle acts only if its gen still matches (compare and
// swap), which makes Release idempotent even after the ticket is reused.
type ticket struct {
	gen       atomic.Uint64
	l         *Limiter
	throttled bool
	estimated int64
	charge    int64
}

func (l *Limiter) getTicket() *ticket {
	t, _ := l.tickets.Get().(*ticket)
	if t == nil {
		t = &ticket{l: l}
	}
	t.throttled, t.estimated, t.charge = false, 0, 0
	return t
}

// Reservation holds one count permit (see Limiter.Reserve). The zero value
// holds nothing. It is a small value; copies share the same reservation.
type Reservation struct {
	t   *ticket
	gen uint64
}

// Release gives the count permit back. It is idempotent, and a no-op once
// Acquire has turned the reservation into a Permit.
func (r Reservation) Release() {
	t := r.t
	if t == nil || !t.gen.CompareAndSwap(r.gen, r.gen+1) {
		return
	}
	l := t.l
	l.tickets.Put(t)
	l.mu.Lock()
	l.count.release(1)
	l.mu.Unlock()
}

// Acquire completes the reservation with the remaining §5.2 layers for a
// prompt estimated at bytes: the throttled permit if a backoff is recent
// (evaluated now), then the byte charge (recent evaluated again right before).
// The reservation is consumed either way: on error (ctx done) its count
// permit is released too, so nothing is held.
func (r Reservation) Acquire(ctx context.Context, bytes int64) (Permit, error) {
	t := r.t
	if t == nil || !t.gen.CompareAndSwap(r.gen, r.gen+1) {
		return Permit{}, ErrUsed
	}
	l := t.l
	if bytes < 0 {
		bytes = 0
	}
	fail := func(err error) (Permit, error) {
		thr := t.throttled
		l.tickets.Put(t)
		l.mu.Lock()
		if thr {
			l.throttled.release(1)
		}
		l.count.release(1)
		l.mu.Unlock()
		return Permit{}, err
	}
	if l.Recent() {
		if err := l.acquire(ctx, &l.throttled, 1); err != nil {
			return fail(err)
		}
		t.throttled = true
	}
	charge := bytes
	if l.Recent() {
		charge = mulClamp(bytes, l.factor)
	}
	if err := l.acquire(ctx, &l.bytes, charge); err != nil {
		return fail(err)
	}
	t.estimated, t.charge = bytes, charge
	l.estimated.Add(bytes)
	return Permit{t: t, gen: r.gen + 1}, nil
}

// TryAcquire is Acquire without waiting: it completes the reservation only
// if the throttled permit (if a backoff is recent) and the byte charge are
// free now and nobody is queued for them, and takes both at once. Otherwise
// ok is false and the reservation is left as it was: still held (Acquire or
// Release it), or already used or released. Recent is evaluated once, for
// both layers.
func (r Reservation) TryAcquire(bytes int64) (p Permit, ok bool) {
	t := r.t
	if t == nil || t.gen.Load() != r.gen {
		return Permit{}, false
	}
	l := t.l
	bytes = max(bytes, 0)
	recent, charge := l.charge(bytes)
	l.mu.Lock()
	// Consumed only once both layers are sure to be taken, under mu: a Release
	// (or another Acquire) racing this one either wins the reservation first, or
	// finds it consumed.
	if !l.open(recent, charge) || !t.gen.CompareAndSwap(r.gen, r.gen+1) {
		l.mu.Unlock()
		return Permit{}, false
	}
	l.take(recent, charge)
	l.mu.Unlock()
	t.throttled, t.estimated, t.charge = recent, bytes, charge
	l.estimated.Add(bytes)
	return Permit{t: t, gen: r.gen + 1}, true
}

func mulClamp(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}

// Permit is what Acquire returns: the count permit, the throttled permit if
// one was taken, and the byte charge. The zero value holds nothing. It is a
// small value; copies share the same permit.
type Permit struct {
	t   *ticket
	gen uint64
}

// Release gives back everything the permit holds and wakes waiters. It is
// idempotent (later calls, and calls on copies, are no-ops).
func (p Permit) Release() {
	t := p.t
	if t == nil || !t.gen.CompareAndSwap(p.gen, p.gen+1) {
		return
	}
	l := t.l
	thr, est, charge := t.throttled, t.estimated, t.charge
	l.tickets.Put(t)
	l.estimated.Add(-est)
	l.mu.Lock()
	l.bytes.release(charge)
	if thr {
		l.throttled.release(1)
	}
	l.count.release(1)
	l.mu.Unlock()
}

// Throttled reports whether the permit holds a throttled permit (it was
// acquired while a backoff was recent). False once released.
func (p Permit) Throttled() bool {
	t := p.t
	return t != nil && t.gen.Load() == p.gen && t.throttled
}

// sem is one FIFO layer. avail is written only under Limiter.mu and read
// lock-free for Stats. With negOK (the bytes budget) a waiter is admitted
// while avail ≥ 0 whatever its charge; otherwise only while avail ≥ charge.
type sem struct {
	capacity   int64
	avail      atomic.Int64
	negOK      bool
	head, tail *waiter
	waiting    atomic.Int64
}

func (s *sem) init(capacity int64, negOK bool) {
	s.capacity = capacity
	s.avail.Store(capacity)
	s.negOK = negOK
}

func (s *sem) fits(charge int64) bool {
	a := s.avail.Load()
	if s.negOK {
		return a >= 0
	}
	return a >= charge
}

// open reports whether charge can be taken now without waiting: it fits and
// nobody is queued before it. Caller holds mu.
func (s *sem) open(charge int64) bool { return s.head == nil && s.fits(charge) }

// release returns charge and admits waiters from the head. Caller holds mu.
func (s *sem) release(charge int64) {
	s.avail.Add(charge)
	s.grant()
}

// grant admits waiters in order while the head fits. Caller holds mu.
func (s *sem) grant() {
	for w := s.head; w != nil && s.fits(w.charge); w = s.head {
		s.avail.Add(-w.charge)
		s.remove(w)
		w.admitted = true
		w.ready <- struct{}{} // buffered 1, never blocks
	}
}

func (s *sem) push(w *waiter) {
	w.prev, w.next = s.tail, nil
	if s.tail != nil {
		s.tail.next = w
	} else {
		s.head = w
	}
	s.tail = w
	s.waiting.Add(1)
}

func (s *sem) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		s.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		s.tail = w.prev
	}
	w.prev, w.next = nil, nil
	s.waiting.Add(-1)
}

// waiter is one queued acquisition; pooled with its channel.
type waiter struct {
	prev, next *waiter
	charge     int64
	admitted   bool // set under mu together with the send on ready
	ready      chan struct{}
}

// acquire takes charge from s, waiting first in, first out. On ctx done it
// leaves s exactly as if it had never queued and returns ctx.Err().
func (l *Limiter) acquire(ctx context.Context, s *sem, charge int64) error {
	l.mu.Lock()
	if s.open(charge) {
		s.avail.Add(-charge)
		l.mu.Unlock()
		return nil
	}
	w, _ := l.waiters.Get().(*waiter)
	if w == nil {
		w = &waiter{ready: make(chan struct{}, 1)}
	}
	w.charge, w.admitted = charge, false
	s.push(w)
	l.mu.Unlock()

	select {
	case <-w.ready:
		l.waiters.Put(w)
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	if w.admitted {
		// Admitted while we were being cancelled: give it back.
		s.release(charge)
		l.mu.Unlock()
		<-w.ready
	} else {
		s.remove(w)
		s.grant() // the head may have changed
		l.mu.Unlock()
	}
	l.waiters.Put(w)
	return ctx.Err()
}

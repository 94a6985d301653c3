package dispatch

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is an injectable clock plus a backoff deadline, both atomics.
type fakeClock struct {
	now   atomic.Int64 // unix ns
	until atomic.Int64 // unix ns, 0 = none
}

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.now.Store(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time { return time.Unix(0, c.now.Load()) }
func (c *fakeClock) Until() time.Time {
	u := c.until.Load()
	if u == 0 {
		return time.Time{}
	}
	return time.Unix(0, u)
}
func (c *fakeClock) advance(d time.Duration) { c.now.Add(int64(d)) }
func (c *fakeClock) backoff(d time.Duration) { c.until.Store(c.now.Load() + int64(d)) }

func (c *fakeClock) config(cfg Config) Config {
	cfg.Now, cfg.BackoffUntil = c.Now, c.Until
	return cfg
}

// eventually polls cond until it holds or a generous timeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func assertIdle(t *testing.T, l *Limiter) {
	t.Helper()
	s := l.Stats()
	if s.CountInUse != 0 || s.CountWaiting != 0 || s.ThrottledInUse != 0 || s.ThrottledWaiting != 0 ||
		s.BytesCharged != 0 || s.BytesEstimated != 0 || s.BytesWaiting != 0 {
		t.Fatalf("limiter not idle: %+v", s)
	}
	if l.Free() != s.CountCapacity {
		t.Fatalf("Free() = %d, want %d", l.Free(), s.CountCapacity)
	}
}

func TestDefaults(t *testing.T) {
	l := New(Config{})
	s := l.Stats()
	if s.CountCapacity != 400 || s.ThrottledCapacity != 10 || s.BytesCapacity != 10485760 {
		t.Fatalf("defaults = %+v", s)
	}
	if l.factor != 20 || l.window != 10*time.Second {
		t.Fatalf("factor %d window %v", l.factor, l.window)
	}
	if l.Recent() {
		t.Fatal("Recent with no BackoffUntil")
	}
}

func TestAcquireReleaseCounts(t *testing.T) {
	l := New(Config{Count: 3, Bytes: 1000})
	ctx := context.Background()
	p1, err := l.Acquire(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := l.Acquire(ctx, 50)
	if err != nil {
		t.Fatal(err)
	}
	s := l.Stats()
	if s.CountInUse != 2 || s.BytesCharged != 150 || s.BytesEstimated != 150 || l.Free() != 1 {
		t.Fatalf("stats %+v free %d", s, l.Free())
	}
	cp := p1
	p1.Release()
	p1.Release()
	cp.Release() // copy of a released permit: no-op
	if s := l.Stats(); s.CountInUse != 1 || s.BytesCharged != 50 {
		t.Fatalf("after release: %+v", s)
	}
	// The ticket of p1 is reused by p3; the stale p1 must not release p3.
	p3, err := l.Acquire(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	p1.Release()
	if s := l.Stats(); s.CountInUse != 2 || s.BytesCharged != 57 {
		t.Fatalf("stale release changed counts: %+v", s)
	}
	p2.Release()
	p3.Release()
	Permit{}.Release()
	assertIdle(t, l)
}

func TestFIFOCount(t *testing.T) {
	l := New(Config{Count: 1})
	ctx := context.Background()
	hold, err := l.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := l.Acquire(ctx, 1)
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			p.Release()
		}()
		eventually(t, "waiter queued", func() bool { return l.Stats().CountWaiting == i+1 })
	}
	hold.Release()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("served %d, want %d (not FIFO)", got, want)
		}
		want++
	}
	assertIdle(t, l)
}

// FIFO on the bytes layer: every waiter's charge drives the budget negative,
// so exactly one is admitted per release and the order is observable.
func TestFIFOBytes(t *testing.T) {
	l := New(Config{Bytes: 100})
	ctx := context.Background()
	big, err := l.Acquire(ctx, 150) // budget 100 ≥ 0: admitted, budget now -50
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := l.Acquire(ctx, 120+int64(i%3)) // mixed sizes, all > budget
			if err != nil {
				t.Error(err)
				return
			}
			if s := l.Stats(); s.BytesCharged < 120 || s.BytesCharged > 122 {
				t.Errorf("waiter %d admitted with %d charged (more than one holder)", i, s.BytesCharged)
			}
			order <- i
			p.Release()
		}()
		eventually(t, "bytes waiter queued", func() bool { return l.Stats().BytesWaiting == i+1 })
	}
	if s := l.Stats(); s.CountInUse != n+1 {
		t.Fatalf("count in use %d: bytes waiters hold their count permits", s.CountInUse)
	}
	big.Release()
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("served %d, want %d", got, want)
		}
		want++
	}
	assertIdle(t, l)
}

func TestNegativeBudget(t *testing.T) {
	l := New(Config{Bytes: 100})
	ctx := context.Background()
	huge, err := l.Acquire(ctx, 1000) // larger than the whole budget: admitted
	if err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.BytesCharged != 1000 {
		t.Fatalf("charged %d", s.BytesCharged)
	}
	got := make(chan Permit)
	go func() {
		p, err := l.Acquire(ctx, 1)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	eventually(t, "second request waits", func() bool { return l.Stats().BytesWaiting == 1 })
	select {
	case <-got:
		t.Fatal("admitted while budget negative")
	case <-time.After(20 * time.Millisecond):
	}
	huge.Release()
	p := <-got
	p.Release()

	// Budget exactly 0 still admits (waits only while below zero).
	a, _ := l.Acquire(ctx, 100)
	b, err := l.Acquire(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.BytesCharged != 105 {
		t.Fatalf("charged %d, want 105", s.BytesCharged)
	}
	a.Release()
	b.Release()
	assertIdle(t, l)
}

func TestThrottledOnlyWhileRecent(t *testing.T) {
	c := newFakeClock()
	l := New(c.config(Config{Throttled: 2, Bytes: 1 << 20}))
	ctx := context.Background()
	check := func(name string, wantThrottled bool, wantCharge int64) {
		t.Helper()
		p, err := l.Acquire(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		s := l.Stats()
		if p.Throttled() != wantThrottled || (s.ThrottledInUse == 1) != wantThrottled {
			t.Fatalf("%s: throttled %v (in use %d), want %v", name, p.Throttled(), s.ThrottledInUse, wantThrottled)
		}
		if s.BytesCharged != wantCharge || s.BytesEstimated != 10 {
			t.Fatalf("%s: charged %d est %d, want %d", name, s.BytesCharged, s.BytesEstimated, wantCharge)
		}
		if s.Recent != wantThrottled {
			t.Fatalf("%s: Recent %v", name, s.Recent)
		}
		p.Release()
		if p.Throttled() {
			t.Fatalf("%s: Throttled after release", name)
		}
		assertIdle(t, l)
	}
	check("no backoff", false, 10)
	c.backoff(time.Second)
	check("active", true, 200)
	c.advance(time.Second + 9*time.Second + 999*time.Millisecond) // ended 9.999 s ago
	check("ended <10s ago", true, 200)
	c.advance(time.Millisecond) // ended exactly 10 s ago: no longer recent
	check("ended 10s ago", false, 10)
	c.advance(time.Hour)
	check("long ago", false, 10)
}

func TestThrottledLimitWhileRecent(t *testing.T) {
	c := newFakeClock()
	c.backoff(time.Second)
	l := New(c.config(Config{Throttled: 2}))
	ctx := context.Background()
	p1, _ := l.Acquire(ctx, 1)
	p2, _ := l.Acquire(ctx, 1)
	done := make(chan Permit)
	go func() {
		p, err := l.Acquire(ctx, 1)
		if err != nil {
			t.Error(err)
		}
		done <- p
	}()
	eventually(t, "third waits on throttled", func() bool { return l.Stats().ThrottledWaiting == 1 })
	if s := l.Stats(); s.CountInUse != 3 {
		t.Fatalf("count in use %d, want 3 (the waiter holds its count permit)", s.CountInUse)
	}
	p1.Release()
	p3 := <-done
	p2.Release()
	p3.Release()
	assertIdle(t, l)
}

// The ×20 charge is evaluated right before the bytes layer: a backoff that
// starts while a request waits for its throttled permit is charged ×20.
func TestChargeEvaluatedBeforeBytes(t *testing.T) {
	c := newFakeClock()
	l := New(c.config(Config{Count: 5}))
	r, err := l.Reserve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c.backoff(5 * time.Second)
	p, err := r.Acquire(context.Background(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.BytesCharged != 20000 || !p.Throttled() {
		t.Fatalf("stats %+v", s)
	}
	p.Release()
	assertIdle(t, l)
}

func TestReservation(t *testing.T) {
	l := New(Config{Count: 2, Bytes: 100})
	ctx := context.Background()
	r1, err := l.Reserve(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := l.Reserve(ctx)
	if l.Free() != 0 {
		t.Fatalf("Free %d", l.Free())
	}
	// A third reservation blocks until one is given back.
	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if _, err := l.Reserve(tctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Reserve on full limiter: %v", err)
	}
	cancel()
	if _, ok := l.TryReserve(); ok {
		t.Fatal("TryReserve on a full limiter took a permit")
	}
	r1.Release()
	r1.Release()
	if _, err := r1.Acquire(ctx, 1); !errors.Is(err, ErrUsed) {
		t.Fatalf("Acquire on released reservation: %v", err)
	}
	if l.Free() != 1 {
		t.Fatalf("Free %d", l.Free())
	}
	p, err := r2.Acquire(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	r2.Release() // consumed: no-op
	if _, err := r2.Acquire(ctx, 1); !errors.Is(err, ErrUsed) {
		t.Fatalf("second Acquire: %v", err)
	}
	if s := l.Stats(); s.CountInUse != 1 || s.BytesCharged != 30 {
		t.Fatalf("stats %+v", s)
	}
	p.Release()
	assertIdle(t, l)

	// TryReserve takes a free permit, and leaves it to a queued Reserve.
	r4, ok := l.TryReserve()
	if !ok || l.Free() != 1 {
		t.Fatalf("TryReserve on a free limiter: ok %v, Free %d", ok, l.Free())
	}
	r5, _ := l.Reserve(ctx)
	queued := make(chan Reservation)
	go func() { r, _ := l.Reserve(ctx); queued <- r }()
	eventually(t, "a queued Reserve", func() bool { return l.Stats().CountWaiting == 1 })
	r4.Release()
	if _, ok := l.TryReserve(); ok {
		t.Fatal("TryReserve took the permit handed to the queued Reserve")
	}
	(<-queued).Release()
	r5.Release()
	assertIdle(t, l)

	// A reservation whose Acquire is cancelled releases its count permit too.
	c := newFakeClock()
	c.backoff(time.Second)
	l2 := New(c.config(Config{Throttled: 1}))
	hold, _ := l2.Acquire(ctx, 1)
	r3, _ := l2.Reserve(ctx)
	cctx, ccancel := context.WithCancel(ctx)
	go func() {
		eventually(t, "waiting on throttled", func() bool { return l2.Stats().ThrottledWaiting == 1 })
		ccancel()
	}()
	if _, err := r3.Acquire(cctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire: %v", err)
	}
	hold.Release()
	assertIdle(t, l2)
}

// TestTryAcquire: TryAcquire, of the limiter or of a reservation, takes every
// layer a submission needs at once when each is free now, as Acquire would, and
// otherwise nothing: the limiter holds what it held, and a reservation it did
// not complete is still held, for Acquire (which then waits) or Release.
func TestTryAcquire(t *testing.T) {
	c := newFakeClock()
	l := New(c.config(Config{Count: 2, Throttled: 1, Bytes: 100}))
	ctx := context.Background()

	p, ok := l.TryAcquire(40)
	if s := l.Stats(); !ok || s.CountInUse != 1 || s.BytesCharged != 40 || s.BytesEstimated != 40 || p.Throttled() {
		t.Fatalf("TryAcquire on a free limiter: ok %v, %+v", ok, s)
	}
	p.Release()
	assertIdle(t, l)

	// The budget below zero: neither the limiter's nor a reservation's try takes anything.
	big, _ := l.Acquire(ctx, 150)
	if _, ok := l.TryAcquire(1); ok {
		t.Fatal("TryAcquire took a permit from a budget below zero")
	}
	r, _ := l.Reserve(ctx)
	if _, ok := r.TryAcquire(1); ok {
		t.Fatal("Reservation.TryAcquire took a permit from a budget below zero")
	}
	if s := l.Stats(); s.CountInUse != 2 || s.BytesCharged != 150 || s.BytesEstimated != 150 {
		t.Fatalf("after the failed tries: %+v, want the big permit and the reservation only", s)
	}
	if _, ok := l.TryAcquire(1); ok { // the count is full as well now
		t.Fatal("TryAcquire took a permit from a full count")
	}
	// The reservation is still held: Acquire waits for the budget, and completes it.
	done := make(chan Permit)
	go func() {
		p, err := r.Acquire(ctx, 10)
		if err != nil {
			t.Error(err)
		}
		done <- p
	}()
	eventually(t, "the reservation waiting for the budget", func() bool { return l.Stats().BytesWaiting == 1 })
	big.Release()
	p = <-done
	if _, ok := r.TryAcquire(1); ok {
		t.Fatal("TryAcquire of a used reservation took a permit")
	}
	p.Release()
	assertIdle(t, l)

	// A reservation left by a failed try can be released instead.
	big, _ = l.Acquire(ctx, 150)
	r, _ = l.Reserve(ctx)
	if _, ok := r.TryAcquire(1); ok {
		t.Fatal("Reservation.TryAcquire took a permit from a budget below zero")
	}
	r.Release()
	big.Release()
	assertIdle(t, l)

	// While a backoff is recent a try takes the throttled permit and the ×20 charge too, or,
	// with no throttled permit free, nothing.
	c.backoff(time.Second)
	r, _ = l.Reserve(ctx)
	p, ok = r.TryAcquire(2)
	if s := l.Stats(); !ok || !p.Throttled() || s.ThrottledInUse != 1 || s.BytesCharged != 40 || s.BytesEstimated != 2 {
		t.Fatalf("Reservation.TryAcquire while recent: ok %v, %+v", ok, s)
	}
	if _, ok := l.TryAcquire(2); ok {
		t.Fatal("TryAcquire while recent took a permit with no throttled permit free")
	}
	r2, _ := l.Reserve(ctx)
	if _, ok := r2.TryAcquire(2); ok {
		t.Fatal("Reservation.TryAcquire while recent took a permit with no throttled permit free")
	}
	if s := l.Stats(); s.CountInUse != 2 || s.ThrottledInUse != 1 || s.BytesCharged != 40 {
		t.Fatalf("after the failed tries while recent: %+v", s)
	}
	p.Release()
	r2.Release()
	p, ok = l.TryAcquire(2)
	if s := l.Stats(); !ok || !p.Throttled() || s.ThrottledInUse != 1 || s.BytesCharged != 40 {
		t.Fatalf("TryAcquire while recent: ok %v, %+v", ok, s)
	}
	p.Release()
	assertIdle(t, l)
}

// TestTryAcquireRacingRelease: a reservation's try and a Release of a copy of it, at once:
// one of them has the reservation, and nothing is held after, nor given back twice.
func TestTryAcquireRacingRelease(t *testing.T) {
	l := New(Config{Count: 1})
	ctx := context.Background()
	for range 2000 {
		r, err := l.Reserve(ctx)
		if err != nil {
			t.Fatal(err)
		}
		released := make(chan struct{})
		go func() { r.Release(); close(released) }()
		p, ok := r.TryAcquire(1)
		<-released
		if ok {
			p.Release()
		}
		assertIdle(t, l)
	}
}

// TestTryAcquireAllocatesNothing: a try that takes its permits, and one that does not,
// allocate nothing (the gate tries on every sample before it sets up a wait).
func TestTryAcquireAllocatesNothing(t *testing.T) {
	l := New(Config{Count: 2, Bytes: 100})
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		r, _ := l.Reserve(ctx)
		p, ok := r.TryAcquire(10)
		if !ok {
			t.Fatal("Reservation.TryAcquire on a free limiter failed")
		}
		p.Release()
		if p, ok = l.TryAcquire(10); !ok {
			t.Fatal("TryAcquire on a free limiter failed")
		}
		big, _ := l.Acquire(ctx, 200)
		if _, ok := l.TryAcquire(1); ok {
			t.Fatal("TryAcquire took a permit from a budget below zero")
		}
		big.Release()
		p.Release()
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per round of tries, want 0", allocs)
	}
	assertIdle(t, l)
}

func TestCancelledContext(t *testing.T) {
	l := New(Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Acquire(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	assertIdle(t, l)
}

// Random cancels at every layer, with the backoff flipping on and off; at the
// end every counter is back to zero and the full capacity is usable.
func TestCancellationStress(t *testing.T) {
	c := newFakeClock()
	l := New(c.config(Config{Count: 8, Throttled: 3, Bytes: 1000}))
	stop := make(chan struct{})
	var flipper sync.WaitGroup
	flipper.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if rand.IntN(2) == 0 {
				c.backoff(time.Second)
			} else {
				c.until.Store(0)
			}
			time.Sleep(50 * time.Microsecond)
		}
	})
	var wg sync.WaitGroup
	var ok, cancelled atomic.Int64
	for g := range 64 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					delay := time.Duration(rng.IntN(50)) * time.Microsecond
					go func() {
						time.Sleep(delay)
						cancel()
					}()
				}
				p, err := l.Acquire(ctx, int64(rng.IntN(400)))
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected error %v", err)
					}
					cancelled.Add(1)
					cancel()
					continue
				}
				ok.Add(1)
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(20)) * time.Microsecond)
				}
				p.Release()
				if rng.IntN(5) == 0 {
					p.Release() // idempotent
				}
				cancel()
			}
		})
	}
	wg.Wait()
	close(stop)
	flipper.Wait()
	t.Logf("ok %d cancelled %d", ok.Load(), cancelled.Load())
	if cancelled.Load() == 0 {
		t.Log("no cancellation happened to land; counts still checked")
	}
	assertIdle(t, l)
	// Full capacity available: all count permits at once, throttled too.
	c.backoff(time.Second)
	var ps []Permit
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p, err := l.Acquire(ctx, 1)
		cancel()
		if err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		ps = append(ps, p)
	}
	c.until.Store(0)
	for i := 3; i < 8; i++ {
		p, err := l.Acquire(context.Background(), 0)
		if err != nil {
			t.Fatalf("permit %d: %v", i, err)
		}
		ps = append(ps, p)
	}
	if l.Free() != 0 {
		t.Fatalf("Free %d", l.Free())
	}
	for _, p := range ps {
		p.Release()
	}
	assertIdle(t, l)
}

// Property: no layer is ever over its limit. Holders count themselves in
// independent atomics while they hold a permit.
func TestConcurrencyNeverExceedsLimits(t *testing.T) {
	const count, throttled, budget = 16, 4, 5000
	c := newFakeClock()
	l := New(c.config(Config{Count: count, Throttled: throttled, Bytes: budget}))
	var inCount, inThrottled, inBytes atomic.Int64
	var maxCount, maxThrottled atomic.Int64
	var violations atomic.Int64
	stop := make(chan struct{})
	var flipper sync.WaitGroup
	flipper.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if rand.IntN(3) == 0 {
				c.backoff(time.Second)
			} else {
				c.until.Store(0)
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	setMax := func(m *atomic.Int64, v int64) {
		for {
			old := m.Load()
			if v <= old || m.CompareAndSwap(old, v) {
				return
			}
		}
	}
	var wg sync.WaitGroup
	for g := range 100 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for range 150 {
				est := int64(rng.IntN(600))
				p, err := l.Acquire(context.Background(), est)
				if err != nil {
					t.Error(err)
					return
				}
				n := inCount.Add(1)
				setMax(&maxCount, n)
				if n > count {
					violations.Add(1)
				}
				thr := p.Throttled()
				if thr {
					m := inThrottled.Add(1)
					setMax(&maxThrottled, m)
					if m > throttled {
						violations.Add(1)
					}
				}
				charge := p.t.charge
				// Holders add their charge after admission and remove it
				// before release, so inBytes never exceeds what the limiter
				// has charged, which is at most budget + one charge (600×20).
				if inBytes.Add(charge) > budget+600*20 {
					violations.Add(1)
				}
				time.Sleep(time.Duration(rng.IntN(30)) * time.Microsecond)
				inBytes.Add(-charge)
				if thr {
					inThrottled.Add(-1)
				}
				inCount.Add(-1)
				p.Release()
			}
		})
	}
	// Bytes invariant, sampled from the limiter itself: charged bytes never
	// exceed budget + the largest single charge (600×20).
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := l.Stats()
			if s.BytesCharged > budget+600*20 || s.CountInUse > count || s.ThrottledInUse > throttled {
				violations.Add(1)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	wg.Wait()
	close(stop)
	flipper.Wait()
	<-sampleDone
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d limit violations", v)
	}
	if maxCount.Load() > count || maxThrottled.Load() > throttled {
		t.Fatalf("max count %d throttled %d", maxCount.Load(), maxThrottled.Load())
	}
	t.Logf("max concurrent count %d, throttled %d", maxCount.Load(), maxThrottled.Load())
	assertIdle(t, l)
}

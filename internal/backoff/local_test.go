package backoff

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestAccountKey(t *testing.T) {
	const key = "tml-supersecret.key.1234567890"
	a := AccountKey("https://tinker.example.com/", key)
	if a != AccountKey("HTTPS://tinker.example.com", key) {
		t.Fatal("trailing slash / case changed the account key")
	}
	if a == AccountKey("https://other.example.com", key) || a == AccountKey("https://tinker.example.com", key+"x") {
		t.Fatal("different accounts share a key")
	}
	if len(a) != 32 || strings.Contains(a, "tml") || strings.Contains(a, "secret") || !validKey.MatchString(a) {
		t.Fatalf("account key %q", a)
	}
}

func TestAsampleBackoff(t *testing.T) {
	if AsampleBackoff(131072) != time.Second || AsampleBackoff(131073) != 5*time.Second {
		t.Fatal("§5.1 thresholds")
	}
}

func TestLocalSignalWait(t *testing.T) {
	l := NewLocal(nil)
	ctx := context.Background()
	if l.Active() || l.Recent(10*time.Second) || !l.Until().IsZero() {
		t.Fatal("fresh Local active")
	}
	if err := l.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = l.Signal(ctx, ReasonRateLimited, 60*time.Millisecond)
	if !l.Active() || l.State().Reason != ReasonRateLimited {
		t.Fatalf("state %+v", l.State())
	}
	// A shorter signal does not shorten.
	until := l.Until()
	_ = l.Signal(ctx, "short", time.Millisecond)
	if l.Until() != until || l.State().Reason != ReasonRateLimited {
		t.Fatal("shortened")
	}
	// Extend while a waiter waits: it re-blocks until the new deadline.
	done := make(chan time.Duration)
	go func() {
		if err := l.Wait(ctx); err != nil {
			t.Error(err)
		}
		done <- time.Since(start)
	}()
	time.Sleep(10 * time.Millisecond)
	_ = l.Signal(ctx, "longer", 150*time.Millisecond)
	if el := <-done; el < 150*time.Millisecond {
		t.Fatalf("Wait returned after %v", el)
	}
	if l.Active() || !l.Recent(10*time.Second) {
		t.Fatal("after deadline: want inactive but recent")
	}
	_ = l.Signal(ctx, "hour", time.Hour)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := l.Wait(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v", err)
	}
}

func TestLocalFakeClockRecent(t *testing.T) {
	var now atomic.Int64
	now.Store(1_000_000_000_000)
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	l := NewLocal(clock)
	_ = l.Signal(context.Background(), "x", time.Second)
	now.Add(int64(10*time.Second + time.Second - time.Nanosecond))
	if !l.Recent(10 * time.Second) {
		t.Fatal("not recent 9.999 s after the end")
	}
	now.Add(1)
	if l.Recent(10 * time.Second) {
		t.Fatal("recent 10 s after the end")
	}
	if err := l.Wait(context.Background()); err != nil { // deadline passed in fake time
		t.Fatal(err)
	}
}

func TestLocalConcurrentSignals(t *testing.T) {
	l := NewLocal(nil)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { _ = l.Signal(context.Background(), "r", time.Duration(i)*time.Second) })
	}
	wg.Wait()
	if got := l.Until().Sub(start); got < 49*time.Second || got > 50*time.Second {
		t.Fatalf("until - start = %v", got)
	}
}

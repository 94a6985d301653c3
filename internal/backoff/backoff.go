package backoff

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Reasons a caller passes to Signal (they are recorded in State.Reason, in
// logs and as the worker's metric label; any string is accepted). The Tinker
// client gives the first two, the worker the queue states.
const (
	// ReasonRateLimited: asample answered 429 (§5.1, §5.3).
	ReasonRateLimited = "rate_limited"
	// ReasonBilling: asample answered 402 inside the billing window (§2.3).
	ReasonBilling = "billing"
	// ReasonPausedRateLimit: a poll reported queue_state paused_rate_limit (§4.3).
	ReasonPausedRateLimit = "paused_rate_limit"
	// ReasonPausedCapacity: a poll reported queue_state paused_capacity (§4.3).
	ReasonPausedCapacity = "paused_capacity"
)

// Default durations (§5.3 and the architecture notes).
const (
	// RateLimitBackoff is the backoff after a 429 (or 402) on asample for a
	// prompt estimated at no more than LargePromptBytes (§5.1).
	RateLimitBackoff = time.Second
	// LargePromptBackoff is the backoff for a larger prompt (§5.1).
	LargePromptBackoff = 5 * time.Second
	// LargePromptBytes is the estimate above which LargePromptBackoff applies
	// (131 072 bytes ≈ 13 107 tokens, §5.2).
	LargePromptBytes = 128 << 10
	// PausedBackoff is the default backoff on a paused queue state. The Python
	// SDK only logs paused states (§4.3); signalling on them is a fleet policy
	// the caller opts into.
	PausedBackoff = 5 * time.Second
	// MaxPause is the longest pause a worker honours, past the creation of the entry that
	// asks for it: the longest the SDK stays paused for one cause, a 402 incident's billing
	// window (billing_exception_max_pause_duration_sec, 3600 s by default, §2.3), through
	// which it retries every 5 s. A single signal is seconds long; a longer one in the bucket
	// (a client with write access to it, a bug) would otherwise pause every worker of the
	// account for ever, and each again when it restarts. Signal writes no longer one.
	MaxPause = time.Hour
)

// AsampleBackoff returns the backoff §5.1 prescribes after asample answered
// 429 (or 402 inside the billing window) for a prompt estimated at
// estimatedBytes: 1 s, or 5 s above 128 KiB.
func AsampleBackoff(estimatedBytes int64) time.Duration {
	if estimatedBytes > LargePromptBytes {
		return LargePromptBackoff
	}
	return RateLimitBackoff
}

// AccountKey names the backoff state of one Tinker account: the first 128
// bits, in hex, of SHA-256 over the normalised base URL and the API key. The
// key itself cannot be recovered from it, so the name is safe to store in KV,
// logs and metrics.
func AccountKey(baseURL, apiKey string) string {
	h := sha256.New()
	h.Write([]byte(strings.TrimRight(strings.ToLower(strings.TrimSpace(baseURL)), "/")))
	h.Write([]byte{0})
	h.Write([]byte(apiKey))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// State is a snapshot of a backoff.
type State struct {
	// Until is the deadline in the local clock's terms (zero = never set).
	Until time.Time
	// Reason is the reason given by the signal that set the deadline.
	Reason string
	// Revision is the KV revision the state was learned from (0 for Local,
	// or before the first entry).
	Revision uint64
}

// Active reports whether the deadline is after now.
func (s State) Active(now time.Time) bool { return !s.Until.IsZero() && now.Before(s.Until) }

// notifier broadcasts "the state changed" by closing a channel.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) channel() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

func (n *notifier) notify() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
}

// waitUntil blocks until until() is zero or not after now(), re-reading it
// whenever changed fires (a deadline extended while waiting re-blocks). It
// sleeps on a timer, never in a polling loop. When the call found a backoff
// active, it returns only jitter() after the deadline (drawn once per call;
// nil means none), re-checking the deadline until then.
func waitUntil(ctx context.Context, n *notifier, now func() time.Time, until func() time.Time, jitter func() time.Duration) error {
	var (
		timer  *time.Timer
		extra  time.Duration
		active bool
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		ch := n.channel() // before reading until: no lost wake-up
		u := until()
		if u.IsZero() {
			return nil
		}
		if !active {
			if !u.After(now()) {
				return nil
			}
			active = true
			if jitter != nil {
				extra = jitter()
			}
		}
		d := u.Add(extra).Sub(now())
		if d <= 0 {
			return nil
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-timer.C:
		}
	}
}

func recent(until, now time.Time, window time.Duration) bool {
	return !until.IsZero() && now.Sub(until) < window
}

// Local is the per-process backoff of the Python SDK (§5.1: one
// backoff_until per holder), with the same methods as Fleet and no NATS. Its
// deadline only moves forward (the SDK overwrites; a shorter 429 backoff never
// shortening a longer one is the fleet's rule, kept here for comparability).
// The zero value is not usable; call NewLocal.
type Local struct {
	now    func() time.Time
	until  atomic.Int64 // unix ns, 0 = none
	mu     sync.Mutex   // serialises Signal
	reason atomic.Pointer[string]
	n      notifier
}

// NewLocal returns a Local using the clock now (nil = time.Now).
func NewLocal(now func() time.Time) *Local {
	if now == nil {
		now = time.Now
	}
	return &Local{now: now}
}

// Signal extends the deadline to now+d if that is later. It never fails; the
// error is there to match Fleet.
func (l *Local) Signal(_ context.Context, reason string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	l.mu.Lock()
	target := l.now().Add(d).UnixNano()
	changed := target > l.until.Load()
	if changed {
		l.reason.Store(&reason)
		l.until.Store(target)
	}
	l.mu.Unlock()
	if changed {
		l.n.notify()
	}
	return nil
}

// Until returns the deadline (zero = never set). It is an atomic load.
func (l *Local) Until() time.Time {
	u := l.until.Load()
	if u == 0 {
		return time.Time{}
	}
	return time.Unix(0, u)
}

// Active reports whether a backoff is in force now.
func (l *Local) Active() bool { return State{Until: l.Until()}.Active(l.now()) }

// Recent reports whether a backoff is active or ended less than window ago (§5.2).
func (l *Local) Recent(window time.Duration) bool { return recent(l.Until(), l.now(), window) }

// Wait blocks until no backoff is active (see Fleet.Wait).
func (l *Local) Wait(ctx context.Context) error {
	return waitUntil(ctx, &l.n, l.now, l.Until, nil)
}

// State returns the current state.
func (l *Local) State() State {
	s := State{Until: l.Until()}
	if r := l.reason.Load(); r != nil {
		s.Reason = *r
	}
	return s
}

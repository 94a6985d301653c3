package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/dispatch"
)

// Backoff is the deadline a worker's submissions respect: backoff.Fleet (shared by the fleet
// through NATS KV) or backoff.Local (one process, as the Python SDK behaves).
type Backoff interface {
	// Until returns the current deadline, read from memory.
	Until() time.Time
	// Wait blocks while the deadline is in the future.
	Wait(ctx context.Context) error
	// Signal extends the deadline to at least now+d.
	Signal(ctx context.Context, reason string, d time.Duration) error
}

// Gate is the tinker.Dispatcher of a worker: the dispatch limiter in front of asample and the
// backoff deadline around it (§5.1).
type Gate struct {
	limiter *dispatch.Limiter
	backoff Backoff
	log     *slog.Logger
	metrics *Metrics
}

// NewGate combines a limiter and a backoff into a tinker.Dispatcher.
func NewGate(l *dispatch.Limiter, b Backoff, log *slog.Logger) *Gate {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Gate{limiter: l, backoff: b, log: log}
}

type reservationKey struct{}

// withReservation hands a count permit reserved before the job was pulled to the first
// Acquire of that job's sample, so the job does not queue for a second permit.
func withReservation(ctx context.Context, r *dispatch.Reservation) context.Context {
	return context.WithValue(ctx, reservationKey{}, r)
}

// Acquire takes the dispatch permits for one asample submission, using the job's reserved
// count permit the first time.
func (g *Gate) Acquire(ctx context.Context, estimatedBytes int64) (func(), error) {
	if r, ok := ctx.Value(reservationKey{}).(*dispatch.Reservation); ok {
		p, err := r.Acquire(ctx, estimatedBytes)
		if err == nil {
			return p.Release, nil
		}
		if err != dispatch.ErrUsed {
			return nil, err
		}
	}
	p, err := g.limiter.Acquire(ctx, estimatedBytes)
	if err != nil {
		return nil, err
	}
	return p.Release, nil
}

// Wait blocks while the backoff is active.
func (g *Gate) Wait(ctx context.Context) error { return g.backoff.Wait(ctx) }

// Backoff signals the backoff. A failed signal (NATS unreachable) is logged: the worker still
// backs off on its own copy of the deadline, which Signal extends before it writes.
func (g *Gate) Backoff(ctx context.Context, reason string, d time.Duration) {
	g.metrics.signal(reason)
	if err := g.backoff.Signal(ctx, reason, d); err != nil {
		g.log.Warn("signal fleet backoff", "reason", reason, "duration", d, "err", err)
	}
}

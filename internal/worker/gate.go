package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
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

// Gate is the tinker.Dispatcher of a worker: the dispatch limiter in front of asample, the
// backoff deadline around it (§5.1), and the learned capacity (see capacity).
type Gate struct {
	limiter  *dispatch.Limiter
	backoff  Backoff
	capacity *capacity
	// cancelled holds the cancelled batches, whose jobs waiting here are not sent (nil: none).
	cancelled *cancelSet
	// held is the worker's jobs, of which those the server may have given to another worker
	// meanwhile (aliveSet.stale) are not sent; none is sent while link is in doubt (nil:
	// neither is checked).
	held    *aliveSet
	link    *link
	log     *slog.Logger
	metrics *Metrics
}

// NewGate combines a limiter and a backoff into a tinker.Dispatcher. It learns no capacity
// limit; Open's gates do (Config.CapacityTTL).
func NewGate(l *dispatch.Limiter, b Backoff, log *slog.Logger) *Gate {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Gate{limiter: l, backoff: b, capacity: newCapacity(0), log: log}
}

// sampleState is one job's passage through the gate, carried in the context of its Sample
// call: the count permit reserved before the job was pulled (used by its first Acquire, so
// the job does not queue for a second one), its place in the capacity count, and its batch,
// which may be cancelled while the job waits.
type sampleState struct {
	reservation *dispatch.Reservation
	sample      sample
	batch       string
	msg         jetstream.Msg // the job's delivery
}

// errBatchCancelled ends a job's sample before its asample goes on the wire: its batch was
// cancelled (or deleted) while it waited at the gate.
var errBatchCancelled = errors.New("the batch was cancelled")

// batchEnd is the end of a job's batch (its cancel, or its delete) for the gate's waits: a
// job waiting for a permit, for room under the capacity, for a pause to end or for the link
// ends at once as cancelled, rather than when what it waits for comes (a slow reply freeing
// the bytes budget took 30 s, a pause up to NakAbove), with a reader waiting on the batch
// meanwhile. It is set up only when a wait is about to block, and the jobs of a batch waiting
// share the cancel set's context (endedContext): a sample that nothing holds up, nearly every
// one, pays no allocation and no lock for it. Call release once the waits are over.
type batchEnd struct {
	set   *cancelSet // nil: no batch is watched
	batch string
	// ctx is done, with cause errBatchCancelled, once the batch ends; nil until a wait needs
	// it, and forget then lets go of it.
	ctx    context.Context
	forget func()
}

// batchEnd returns the end of batch, not yet set up.
func (g *Gate) batchEnd(batch string) batchEnd {
	return batchEnd{set: g.cancelled, batch: batch}
}

// done returns a channel closed once the batch ends, set up now if it is not yet (nil, never
// ready, when no batch is watched or e is nil). Call it only where a wait blocks.
func (e *batchEnd) done() <-chan struct{} {
	if e == nil || e.set == nil {
		return nil
	}
	if e.ctx == nil {
		e.ctx, e.forget = e.set.endedContext(e.batch)
	}
	return e.ctx.Done()
}

// afterFunc runs f once the batch ends (as context.AfterFunc), and returns the func that
// stops that; it sets the end up (see done).
func (e *batchEnd) afterFunc(f func()) (stop func() bool) {
	if e.done() == nil {
		return func() bool { return false }
	}
	return context.AfterFunc(e.ctx, f)
}

// bound returns ctx ended also by the batch's end, for a wait about to block, and the func
// that lets go of it.
func (e *batchEnd) bound(ctx context.Context) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	stop := e.afterFunc(func() { cancel(errBatchCancelled) })
	return wctx, func() {
		stop()
		cancel(nil)
	}
}

// err is err, which ended a wait under bound(ctx), as the job sees it: errBatchCancelled when
// the batch's end ended it (and ctx is not done).
func (e *batchEnd) err(ctx context.Context, err error) error {
	if ctx.Err() == nil && e.ctx != nil && errors.Is(context.Cause(e.ctx), errBatchCancelled) {
		return errBatchCancelled
	}
	return err
}

// release lets go of the batch's end, if a wait set it up.
func (e *batchEnd) release() {
	if e.forget != nil {
		e.forget()
		e.ctx, e.forget = nil, nil
	}
}

// errStopping ends a job's sample before its asample goes on the wire: the worker is stopping
// and hands the job back to the fleet at once, rather than start a sample that the shutdown
// grace period may cut off (and another worker then runs again).
var errStopping = errors.New("the worker is stopping")

// errGivenOut ends a job's sample before its asample goes on the wire: the NATS server has
// not heard of the job from this worker for about its ack wait (the link to it was down, or
// the process stopped), and may have given it to another worker, which samples it. Sending
// it too would pay for the sample twice.
var errGivenOut = errors.New("the NATS server may have given the job to another worker")

type sampleStateKey struct{}

func withSampleState(ctx context.Context, st *sampleState) context.Context {
	return context.WithValue(ctx, sampleStateKey{}, st)
}

// sampleStateOf returns the state of the job whose sample ctx carries, or nil for a sample
// outside a job (not accounted for in the capacity).
func sampleStateOf(ctx context.Context) *sampleState {
	st, _ := ctx.Value(sampleStateKey{}).(*sampleState)
	return st
}

// Acquire takes the dispatch permits for one asample submission (the job's reserved count
// permit the first time), then waits for room under the learned capacity. Permits come
// first: a sample holding room must never wait for a permit that a sample waiting for room
// holds. So a sample submitted again (its future expired, §4.2 410) first gives back the
// room it held, and waits for room like a new one. The returned release also records how
// asample was answered: a sample the service accepted counts as held by it; one that failed
// or was never sent gives its room back, and teaches the capacity nothing. A job whose batch
// is cancelled meanwhile stops waiting (errBatchCancelled; see batchEnd).
func (g *Gate) Acquire(ctx context.Context, estimatedBytes int64) (func(accepted bool), error) {
	st := sampleStateOf(ctx)
	if st == nil {
		p, err := g.limiter.Acquire(ctx, estimatedBytes)
		if err != nil {
			return nil, err
		}
		return func(bool) { p.Release() }, nil
	}
	g.capacity.done(&st.sample)
	end := g.batchEnd(st.batch)
	defer end.release()
	p, err := g.permit(ctx, st, estimatedBytes, &end)
	if err != nil {
		return nil, err
	}
	if err := g.capacity.submit(ctx, &st.sample, &end); err != nil {
		p.Release()
		return nil, err
	}
	return func(accepted bool) {
		p.Release()
		if accepted {
			g.capacity.answered(&st.sample)
		} else {
			g.capacity.requeue(&st.sample)
		}
	}, nil
}

// permit takes the dispatch permits for a submission of the job st: its reserved count
// permit the first time (its first Acquire uses the reservation, whatever comes of it), a
// new one after. Only if they are not all free now does it wait for them, until the batch's
// end too.
func (g *Gate) permit(ctx context.Context, st *sampleState, estimatedBytes int64, end *batchEnd) (dispatch.Permit, error) {
	r := st.reservation
	st.reservation = nil
	if r != nil {
		if p, ok := r.TryAcquire(estimatedBytes); ok {
			return p, nil
		}
	} else if p, ok := g.limiter.TryAcquire(estimatedBytes); ok {
		return p, nil
	}
	wctx, stop := end.bound(ctx)
	defer stop()
	var (
		p   dispatch.Permit
		err error
	)
	if r != nil {
		p, err = r.Acquire(wctx, estimatedBytes)
	}
	if r == nil || err == dispatch.ErrUsed {
		p, err = g.limiter.Acquire(wctx, estimatedBytes)
	}
	if err != nil {
		return dispatch.Permit{}, end.err(ctx, err)
	}
	return p, nil
}

// Wait blocks while the backoff is active, then (after a 429) until there is room under the
// learned capacity again, and records that asample goes on the wire. A job whose batch was
// cancelled meanwhile is not sent (errBatchCancelled): a worker holds up to its concurrency
// in jobs at the gate, and each would otherwise be sampled, and billed, after the cancel; one
// still waiting stops waiting then (see batchEnd). Nor is one sent once the worker is
// stopping (errStopping, from the closed capacity), nor one the server may have given to
// another worker meanwhile (errGivenOut); none is sent while the server may not hear this
// worker (link).
func (g *Gate) Wait(ctx context.Context) error {
	st := sampleStateOf(ctx)
	if st == nil {
		return g.backoff.Wait(ctx)
	}
	end := g.batchEnd(st.batch)
	defer end.release()
	for {
		if err := g.waitBackoff(ctx, &end); err != nil {
			return err
		}
		if err := g.capacity.submit(ctx, &st.sample, &end); err != nil {
			return err
		}
		// Waiting for room may have outlasted the pause and met the next one.
		if now := time.Now(); !now.Before(g.backoff.Until()) {
			if g.cancelled != nil && g.cancelled.has(st.batch) {
				g.capacity.done(&st.sample) // its room goes to the next job, not to an answer
				return errBatchCancelled
			}
			if g.held != nil && g.held.stale(st.msg, now) {
				g.capacity.done(&st.sample)
				return errGivenOut
			}
			if g.link != nil && g.link.doubtful(now) {
				if err := g.awaitLink(ctx, st.msg, &end); err != nil {
					return err
				}
				continue // time has passed: the backoff, the room and the news are looked at again
			}
			g.capacity.send(&st.sample) // the client sends asample as soon as Wait returns
			return nil
		}
	}
}

// awaitLink waits while the link to NATS is in doubt, until it is heard again or the news of
// m's job lapses, but not once the worker is stopping (errStopping), nor once the job's batch
// ends (errBatchCancelled).
func (g *Gate) awaitLink(ctx context.Context, m jetstream.Msg, end *batchEnd) error {
	back := g.link.next()
	now := time.Now()
	if !g.link.doubtful(now) {
		return nil // heard while next was fetched
	}
	lapse := time.NewTimer(g.held.lapsesIn(m, now))
	defer lapse.Stop()
	select {
	case <-back:
	case <-lapse.C:
	case <-g.capacity.stopping.Done():
		return errStopping
	case <-end.done():
		return errBatchCancelled
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// waitBackoff waits out the backoff for a job's sample, but not once the worker is stopping
// (errStopping), nor once the job's batch ends (errBatchCancelled): the sample would not be
// sent after the pause, and its job is better handed back, or ended, at once than after a
// pause of up to NakAbove.
func (g *Gate) waitBackoff(ctx context.Context, end *batchEnd) error {
	if !time.Now().Before(g.backoff.Until()) {
		return nil // no pause (the common case): nothing to wait for, nor to set up
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(g.capacity.stopping, func() { cancel(errStopping) })()
	defer end.afterFunc(func() { cancel(errBatchCancelled) })()
	if err := g.backoff.Wait(wctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return context.Cause(wctx)
	}
	return nil
}

// Backoff signals the backoff; a 429 also teaches the capacity. A failed signal (NATS
// unreachable) is logged: the worker still backs off on its own copy of the deadline, which
// Signal extends before it writes.
func (g *Gate) Backoff(ctx context.Context, reason string, d time.Duration) {
	g.metrics.signal(reason)
	if reason == backoff.ReasonRateLimited {
		g.capacity.learn()
		if st := sampleStateOf(ctx); st != nil {
			g.capacity.requeue(&st.sample)
		}
	}
	if err := g.backoff.Signal(ctx, reason, d); err != nil {
		g.log.Warn("signal fleet backoff", "reason", reason, "duration", d, "err", err)
	}
}

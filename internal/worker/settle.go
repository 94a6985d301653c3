package worker

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// settler stores results and settles their jobs in groups (group commit): one write to the
// NATS server and one wait for its acks per group rather than per job, then the group's acks
// in one more write. A group is the jobs that finished while the previous one was out, plus
// those that finish within the linger after the first, unless lingerFull are waiting already.
//
// The linger matters where the service has latency: jobs then finish one by one, spread out,
// and without it nearly every group held one job (bench comparison 2 with 20 ms samples: 8.1
// read and write system calls per sample, against 5.8 for the client alone). A sample takes
// hundreds of milliseconds on Tinker; the linger adds at most a few to a job's settling.
//
// A job handler hands its settlement over and goes on to its next job; the settler passes
// each settlement, settled or not, to its settled function, which frees the job's slot. So
// a handler does not wait (and wake up) for every group, which it could not speed up; in
// bench comparison 2 the CPU saved was within the machine's noise.
//
// A job is acked (or termed) only after its result is stored (invariant 2). When the stream
// cannot store anything (out of room, no leader, no answer: queue.StoreUnavailable), the
// settler holds the results and tries them again, 100 ms apart and doubling up to 5 s, and at
// once when the connection is made again (the likeliest end of an outage), rather than
// handing their jobs back: a job handed back is sampled again, and paid for again, and
// its result would fail alike. Held jobs keep their job slots, so the worker takes no new
// jobs once every slot holds one, and they are kept alive (InProgress) meanwhile. A result
// the stream refuses for itself is left to the settled function, which hands its job back.
type settler struct {
	results *queue.ResultPublisher
	in      chan *settlement
	linger  time.Duration // how long a group waits for more jobs after its first
	settled func(*settlement)
	// conn's reconnects end a wait to try held results again, which retryFrom and retryUpTo
	// bound otherwise (firstRetry and lastRetry).
	conn                 *nats.Conn
	retryFrom, retryUpTo time.Duration
	// hold, if set, is told when a settlement's result is held for another try (true) and
	// when a held one is let go (false), before settled.
	hold func(s *settlement, held bool)
	log  *slog.Logger

	closed  chan struct{} // closed by close
	drainBy time.Time     // set by close: held results are tried until then

	// refusing is, while the stream refuses results, since when and why (nil: it stores
	// them); the worker reads it to answer a reader who asks what it holds.
	refusing atomic.Pointer[refusal]
}

// refusal is why the stream stores no result: since when, and its latest error.
type refusal struct {
	since time.Time
	err   error
}

const (
	// maxSettleGroup bounds one group: the results of a group are in nats.go's buffer at once.
	maxSettleGroup = 256
	// settleLinger is how long a group waits for more jobs after its first (see settler).
	settleLinger = 2 * time.Millisecond
	// lingerFull is how many waiting jobs make a group worth sending without a linger.
	lingerFull = 8
	// firstRetry and lastRetry bound the wait before held results are tried again.
	firstRetry, lastRetry = 100 * time.Millisecond, 5 * time.Second
	// heldLogEvery is how often, at most, the settler warns that results cannot be stored.
	heldLogEvery = 30 * time.Second
)

// newSettler returns a settler for up to capacity jobs at a time, which calls settled for each
// settlement once its group is through (from the goroutine that runs it).
func newSettler(q *queue.Queue, capacity int, linger time.Duration, settled func(*settlement)) (*settler, error) {
	results, err := q.NewResultPublisher()
	if err != nil {
		return nil, err
	}
	return &settler{results: results, in: make(chan *settlement, capacity), linger: linger, settled: settled,
		conn: q.JS.Conn(), retryFrom: firstRetry, retryUpTo: lastRetry,
		log: slog.New(slog.DiscardHandler), closed: make(chan struct{})}, nil
}

// settlement is one job to settle. The worker keeps the settlements of finished jobs, and
// their encode buffers and result messages, for the next ones.
type settlement struct {
	msg   jetstream.Msg
	store bool // publish result first; false when the job's result is stored already
	term  bool // Term rather than Ack: a permanent failure

	// Set by the settler before it calls settled.
	publishErr error     // the result was not stored: the message is not settled
	settleErr  error     // the result is stored, but the ack or term failed
	heldSince  time.Time // when the stream first could not store the result (zero: it never failed so)
	// another: the stream refused the result, on its first try, because the job had one
	// stored already (another worker's, which raced this one on the job). The job is
	// settled, but did not end here: its metrics are the other worker's.
	another bool
	tried   bool // the result was sent to the stream before (its ack may have been lost)

	result *nats.Msg // the job's result, reused from job to job (nil: none yet)
	buf    []byte    // the result's encoding; result.Data points into it until settled

	job finishedJob // the worker's, for when the job is settled
}

// hand gives s to the settler. It does not block while fewer than capacity settlements are
// out, which the job slots ensure (a held settlement is out until it is settled).
func (st *settler) hand(s *settlement) {
	s.publishErr, s.settleErr, s.heldSince, s.another, s.tried = nil, nil, time.Time{}, false, false
	st.in <- s
}

// close ends run once the settlements handed in so far are settled; results that the stream
// cannot store are tried until drainBy, then their jobs are handed back. Call it when no
// handler can call hand any more.
func (st *settler) close(drainBy time.Time) {
	st.drainBy = drainBy
	close(st.closed)
	close(st.in)
}

// run settles groups until close and returns how many it sent. ctx bounds the waits for the
// stream's acks; once it is done, held results are let go.
func (st *settler) run(ctx context.Context) (groups int) {
	defer func() { _ = st.results.Close() }()
	reconnected := st.conn.StatusChanged(nats.CONNECTED)
	defer st.conn.RemoveStatusListener(reconnected)
	group := make([]*settlement, 0, maxSettleGroup)
	msgs := make([]*nats.Msg, 0, maxSettleGroup)
	errs := make([]error, maxSettleGroup)
	existed := make([]bool, maxSettleGroup)
	var (
		held   []*settlement // results the stream could not store yet, oldest first
		retry  = st.retryFrom
		outage time.Time // since when the stream stores nothing (zero: it does)
		warned time.Time // the last warning; at most one per heldLogEvery, as room comes and goes
		in     = st.in   // nil once closed and drained
		// unavailable is the last error that said the stream could not store anything.
		unavailable error
	)
	for {
		group = group[:0]
		if len(held) > 0 {
			// Jobs handed in meanwhile wait with the held ones, and are kept alive with them.
		waiting:
			for in != nil {
				select {
				case s, ok := <-in:
					if !ok {
						in = nil
						break waiting
					}
					held = append(held, st.holdOn(s))
				default:
					break waiting
				}
			}
			if !st.waitToRetry(ctx, retry, reconnected) {
				st.letGo(held, unavailable)
				held = held[:0]
				continue
			}
			retry = min(2*retry, st.retryUpTo)
			n := min(len(held), maxSettleGroup)
			group = append(group, held[:n]...)
			held = append(held[:0], held[n:]...)
		} else {
			if in == nil {
				return groups
			}
			first, ok := <-in
			if !ok {
				return groups
			}
			if st.linger > 0 && len(in) < lingerFull-1 {
				// A sleep, not a wait on the channel: jobs arriving meanwhile wake nobody.
				time.Sleep(st.linger)
			}
			group = append(group, first)
		}
		groups++
	fill:
		for in != nil && len(group) < maxSettleGroup {
			select {
			case s, ok := <-in:
				if !ok {
					in = nil
					break fill
				}
				group = append(group, s)
			default:
				break fill
			}
		}
		msgs = msgs[:0]
		for _, s := range group {
			if s.store {
				msgs = append(msgs, s.result)
			}
		}
		st.results.PublishNoting(ctx, msgs, errs[:len(msgs)], existed[:len(msgs)])
		k, stored, refused := 0, false, false
		through := group[:0] // the group's settlements not held
		for _, s := range group {
			if s.store {
				s.publishErr = errs[k]
				// A result tried before may have been stored then, its ack lost: the one
				// the stream has may be this one.
				s.another = existed[k] && !s.tried
				s.tried = true
				k++
				if s.publishErr != nil {
					if queue.StoreUnavailable(s.publishErr) && ctx.Err() == nil {
						unavailable, refused = s.publishErr, true
						held = append(held, st.holdOn(s))
						continue
					}
					through = append(through, s)
					continue
				}
				stored = true
			}
			// The result is stored; a lost ack only means a redelivery, which finds it.
			if s.term {
				s.settleErr = s.msg.Term()
			} else {
				s.settleErr = s.msg.Ack()
			}
			through = append(through, s)
		}
		now := time.Now()
		switch {
		case stored && !outage.IsZero():
			if !warned.Before(outage) { // said for this outage
				st.log.Info("results are stored again", "after", now.Sub(outage).Round(time.Millisecond), "still_held", len(held))
			}
			outage, retry = time.Time{}, st.retryFrom
			st.refusing.Store(nil)
		case refused && now.Sub(warned) >= heldLogEvery:
			if outage.IsZero() {
				outage = now
			}
			warned = now
			st.log.Warn("results cannot be stored: holding them and trying again; no new jobs are taken while every job slot holds one",
				"held", len(held), "for", now.Sub(outage).Round(time.Second), "err", unavailable)
		case refused && outage.IsZero():
			outage = now
		}
		if refused && !outage.IsZero() {
			st.refusing.Store(&refusal{since: outage, err: unavailable})
		}
		for i, s := range through {
			st.pass(s)
			through[i] = nil
		}
		clear(group[len(through):])
	}
}

// waitToRetry waits d before held results are tried again, or until reconnected says the
// connection was made again, and reports false when they are to be let go instead: ctx is
// done, or the settler is closed and its drainBy has passed.
func (st *settler) waitToRetry(ctx context.Context, d time.Duration, reconnected <-chan nats.Status) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	closed := st.closed
	var drained <-chan time.Time // fires at drainBy, once closed
	for {
		select {
		case <-t.C:
			return true
		case <-reconnected:
			return true
		case <-ctx.Done():
			return false
		case <-closed:
			if !time.Now().Before(st.drainBy) {
				return false
			}
			closed, drained = nil, time.After(time.Until(st.drainBy))
		case <-drained:
			return false
		}
	}
}

// letGo passes on, at shutdown, held settlements whose results will not be tried again:
// their jobs are handed back for another delivery. cause is why the stream stored none; it is
// the publish error of those that waited behind the held ones and were never tried.
func (st *settler) letGo(held []*settlement, cause error) {
	st.log.Warn("results not stored before shutdown: their jobs will be delivered again", "held", len(held), "err", cause)
	for i, s := range held {
		if s.publishErr == nil {
			s.publishErr = fmt.Errorf("not stored before shutdown: %w", cause)
		}
		st.pass(s)
		held[i] = nil
	}
}

// holdOn marks s held, if it is not yet, and returns it.
func (st *settler) holdOn(s *settlement) *settlement {
	if s.heldSince.IsZero() {
		s.heldSince = time.Now()
		if st.hold != nil {
			st.hold(s, true)
		}
	}
	return s
}

// pass hands s, which the settler is through with, to settled.
func (st *settler) pass(s *settlement) {
	if !s.heldSince.IsZero() && st.hold != nil {
		st.hold(s, false)
	}
	st.settled(s)
}

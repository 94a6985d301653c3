package worker

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/share"
)

// capacity learns how many samples the account runs at once and keeps this worker's share
// under it. The wire protocol gives no number: the service answers 429 when it is full
// (X-Tinker-Sampling-Backpressure, §3.6), and every 429 pauses the fleet for a second
// (§5.3). A fleet that simply refills after each pause hits the ceiling again at once, so a
// capacity-bound batch ran at capacity per second instead of capacity per sample latency
// (bench comparison 1: 0.2 of the ideal for 200 ms samples).
//
// So a 429, seen here or anywhere in the fleet through the backoff key, starts a measure:
// the number of this worker's samples the service holds. It cannot be read at the moment of
// the 429, because the answers to the worker's other submissions are still on the wire, and
// some of them say "accepted"; counting only the answers already read made four workers
// learn 58 of 64 slots between them. So the measure stays open until every submission that
// was on the wire has been answered, or for measureMax (the fleet is paused meanwhile, so
// nothing new goes out), and its result is the most samples the service held for this
// worker during it.
// Together the workers' limits are then what the service held when it said full.
//
// The measure is only sound while the submissions racing the 429 are few against the
// capacity: a worker that sends all its job slots at once (the SDK's 400) meets the 429 with
// hundreds on the wire, their answers take longer than a sample, and acceptances of slots
// freed meanwhile count twice (two workers learned 22 of 8 under the race detector). So,
// until a limit is learned, a window caps what the worker holds: initialWindow, plus one
// per acceptance (TCP's slow start, doubling per asample round trip, a few milliseconds to
// reach any job-slot count). The burst that meets the first 429 is then about the capacity,
// not the job slots.
//
// A limit is held for the ttl only once a measure has confirmed it: a first measure, or one
// that differs from the last by more than a quarter, holds for ttl/4 (15 s), and the window
// then probes past it. The service's 429 does not say whether it was about capacity: a lone
// 429 early in the slow start (a rate limit, another client's load for a moment) held a
// worker at 7 samples of 32 for the whole ttl. The probe costs one more 429 when the limit was
// right, and finds the capacity a quarter of the ttl on when it was not.
//
// Samples are admitted, in arrival order, while admitted + on the wire + accepted stays under
// the limit, or without one under the window. The limit is forgotten ttl after the measure
// that set it (ttl/4 on probation), so a capacity that grows costs at most ttl; the window
// then grows on from the old limit, and relearning costs one more 429.
//
// While a limit is in force, a measure can raise it but does not renew it, and lowers it only
// within a sixteenth of the capacity measured (share's fullSlack). The service held the limit
// before without complaint, and a fleet that keeps under its limits never fills the service
// itself; so a 429 then was about a rate, or another client, or a capacity that shrank, and
// the measure says nothing sure. Most such 429s come with some samples still waiting to be
// sent (the refill after a pause, or a dispatch permit), so taking each measure as the limit
// ratcheted it down 429 by 429, to 1 sample (2 % random 429s: a quarter of the speed of no
// learning), and renewing the limit with measures at it kept a limit learned too low, in the
// slow start, for good. (The slack is for a capacity measured a place or two too high, which
// otherwise paused the fleet at every refill.) So every limit expires ttl after it was
// learned and the window probes on from it, one 429 per ttl. The price is paid when the
// capacity really shrinks: the fleet refills into 429s, as the SDK does, until the limit
// expires, at most ttl.
type capacity struct {
	ttl time.Duration // 0: never learn (no limit)
	now func() time.Time

	mu       sync.Mutex
	admitted int // admitted, not yet on the wire (waiting for the backoff or a permit)
	sending  int // asample on the wire, not yet answered
	accepted int // asample accepted, result not yet back
	// acceptedSince counts acceptances since the last measure began or ended, of samples sent
	// since the last one ended (see learn).
	acceptedSince int
	limit         int       // 0: none
	learnedAt     time.Time // when the capacity limit is a part of was measured (see hold)
	// partOf is the capacity measured that limit is a part of: a round's (share.Share's
	// Measured), or this worker's own peak.
	partOf int
	// lastPeak and lastCapacity are the latest peak this worker measured and the latest
	// capacity the fleet measured (in a share round, or before one whose part it took), kept
	// after their limits expire: a new measure that repeats one confirms it (see hold).
	lastPeak, lastCapacity int
	// window caps the samples held while no limit is in force (0: no cap, learning off). It
	// starts at initialWindow and grows by one with every acceptance, so the samples on the
	// wire are at most about those already accepted: the burst that meets the first 429 is
	// bounded by what the service holds, not by the job slots (see capacity).
	window    int
	measuring bool        // a 429 was seen and submissions it raced are still on the wire
	cut       *time.Timer // ends a measure that outlasts measureMax (nil: none armed)
	peak      int         // the most accepted during the measure
	waiters   []waiter    // first come, first admitted
	round     int         // measures settled and leaves seen so far (share adopts the latest only)
	// stopping is done once close was called: the worker is stopping, and admits no more.
	stopping context.Context
	stop     context.CancelFunc
	// settled, if not nil, receives the latest settled measure for the fleet's share board
	// (the worker's splitShares); an older one not yet taken is dropped.
	settled chan measure
}

// measure is a settled measure of this worker's share: the round it ends, its peak, and the
// limit in force before it (0: none) with the capacity that limit is a part of and its age.
type measure struct {
	round, peak, limit, limitOf int
	limitAge                    time.Duration
}

// waiter is a sample waiting for room; admitting it sets its phase and closes ready.
type waiter struct {
	sample *sample
	ready  chan struct{}
}

// sample is one job's sample as the capacity counts it: its phase, and the round (c.round:
// the measures settled and leaves seen so far) it was last admitted or sent in. An answer to
// a sample sent in an earlier round answers a submission that raced the last measure.
type sample struct {
	phase samplePhase
	round int
}

// samplePhase is where one job's sample stands for capacity accounting.
type samplePhase int

const (
	phaseIdle     samplePhase = iota // not admitted
	phaseAdmitted                    // admitted, not yet on the wire
	phaseSending                     // asample on the wire
	phaseAccepted                    // accepted by the service
)

// initialWindow is how many samples a worker holds before the service has accepted any.
const initialWindow = 8

// measureMax is the longest a measure stays open. The answers racing a 429 come within a
// round trip; a submission still unanswered after this is being tried again (a 5xx, a dropped
// connection: the client's submission loop sleeps between tries) and says nothing about the
// capacity. Left open, such a measure settled a second or more later, after the others had
// split the capacity without it: the worker then kept a peak measured apart from theirs, and
// two workers' limits added up to 79 of 64 (mixed faults, 1 % 5xx on asample). The share
// board's default Gather waits longer than this, so every worker's measure is in the round.
const measureMax = 250 * time.Millisecond

func newCapacity(ttl time.Duration) *capacity {
	c := &capacity{ttl: ttl, now: time.Now}
	c.stopping, c.stop = context.WithCancel(context.Background())
	if ttl > 0 {
		c.window = initialWindow
	}
	return c
}

// room reports whether one more sample fits under the limit, or the window without one.
// Call with mu held.
func (c *capacity) room() bool {
	bound := c.limit
	if bound == 0 {
		bound = c.window
	}
	return bound == 0 || c.held() < bound
}

// held is the number of samples that count against the limit. Call with mu held.
func (c *capacity) held() int { return c.admitted + c.sending + c.accepted }

// atService is the number of this worker's samples the service holds or is being asked to
// take: on the wire, or accepted with their result not back yet.
func (c *capacity) atService() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sending + c.accepted
}

// expire forgets a limit older than ttl and admits the waiters it held back. Call with mu
// held.
func (c *capacity) expire() {
	if c.limit > 0 && c.now().Sub(c.learnedAt) > c.ttl {
		c.limit = 0
		c.admitWaiters()
	}
}

// admitWaiters admits waiters in arrival order while there is room. Call with mu held.
func (c *capacity) admitWaiters() {
	for len(c.waiters) > 0 && c.room() {
		w := c.waiters[0]
		c.waiters[0] = waiter{}
		c.waiters = c.waiters[1:]
		w.sample.phase, w.sample.round = phaseAdmitted, c.round
		c.admitted++
		close(w.ready)
	}
}

// submit admits a job's sample before it goes on the wire. A new sample waits for room
// under the limit; so does a sample submitted again (its future expired, §4.2 410), which
// gives back the room it had (Gate.Acquire does so before it takes permits); a sample
// admitted before a limit was learned gives its room back if the worker now holds more than
// the limit, and waits like a new one. A wait ends with ctx, with the worker's stop
// (errStopping), and with the end of the job's batch (errBatchCancelled; end may be nil),
// which is set up only then.
func (c *capacity) submit(ctx context.Context, s *sample, end *batchEnd) error {
	c.mu.Lock()
	select {
	case <-c.stopping.Done():
		if s.phase != phaseIdle {
			c.leave(s)
		}
		c.mu.Unlock()
		return errStopping
	default:
	}
	c.expire()
	switch s.phase {
	case phaseSending:
		c.mu.Unlock()
		return nil
	case phaseAdmitted:
		c.admitted-- // does it still fit, counting itself out?
		fits := c.room()
		c.admitted++
		if fits {
			c.mu.Unlock()
			return nil
		}
		c.leave(s)
	case phaseAccepted:
		c.leave(s)
	}
	if len(c.waiters) == 0 && c.room() {
		c.admitted++
		s.phase, s.round = phaseAdmitted, c.round
		c.mu.Unlock()
		return nil
	}
	w := waiter{sample: s, ready: make(chan struct{})}
	c.waiters = append(c.waiters, w)
	for {
		var (
			t      *time.Timer
			expiry <-chan time.Time
		)
		if c.limit > 0 { // the limit's expiry admits waiters
			t = time.NewTimer(c.ttl - c.now().Sub(c.learnedAt))
			expiry = t.C
		}
		stop := func() {
			if t != nil {
				t.Stop()
			}
		}
		c.mu.Unlock()
		ended := end.done() // outside mu: it takes the cancel set's lock
		var err error
		select {
		case <-w.ready:
			stop()
			return nil
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.stopping.Done():
			err = errStopping
		case <-ended:
			err = errBatchCancelled
		case <-expiry:
		}
		if err != nil {
			stop()
			c.mu.Lock()
			if s.phase == phaseAdmitted { // admitted as the wait ended: pass the room on
				c.leave(s)
			} else {
				c.waiters = slices.DeleteFunc(c.waiters, func(o waiter) bool { return o.ready == w.ready })
			}
			c.mu.Unlock()
			return err
		}
		c.mu.Lock()
		c.expire()
		if s.phase == phaseAdmitted {
			c.mu.Unlock()
			return nil
		}
	}
}

// close admits no more samples, for good: the worker is stopping. Samples waiting for room,
// and any that would wait, get errStopping; those on the wire or accepted run on.
func (c *capacity) close() { c.stop() }

// send records that an admitted sample's asample is going on the wire.
func (c *capacity) send(s *sample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.phase == phaseAdmitted {
		c.admitted--
		c.sending++
		s.phase, s.round = phaseSending, c.round
	}
}

// answered records that asample accepted a sample.
func (c *capacity) answered(s *sample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.unanswered(s.phase) {
		return
	}
	c.uncount(s.phase)
	c.accepted++
	if s.round == c.round { // not an answer read late to the last measure's burst (see learn)
		c.acceptedSince++
	}
	s.phase = phaseAccepted
	if c.limit == 0 && c.window > 0 {
		c.window++
		c.admitWaiters()
	}
	if c.measuring {
		c.peak = max(c.peak, c.accepted)
		c.settle()
	}
}

// requeue takes a sample that the service did not take (a 429, a failed submission, or one
// never sent) out of the count, so that it waits for room again like a new one rather than
// holding a place it does not have.
func (c *capacity) requeue(s *sample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unanswered(s.phase) {
		c.leave(s)
	}
}

// done records that a job's sample is over, whatever its phase.
func (c *capacity) done(s *sample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.phase != phaseIdle {
		c.leave(s)
	}
}

// unanswered reports whether a sample in phase is admitted or on the wire.
func (c *capacity) unanswered(phase samplePhase) bool {
	return phase == phaseAdmitted || phase == phaseSending
}

// uncount takes a sample out of the count of its phase. Call with mu held.
func (c *capacity) uncount(phase samplePhase) {
	switch phase {
	case phaseAdmitted:
		c.admitted--
	case phaseSending:
		c.sending--
	case phaseAccepted:
		c.accepted--
	}
}

// leave makes a counted sample idle and passes its room on. Call with mu held.
func (c *capacity) leave(s *sample) {
	c.uncount(s.phase)
	s.phase = phaseIdle
	c.settle()
	c.admitWaiters()
}

// learn starts measuring this worker's share: a 429 says the service is full. With a limit
// already in force, a 429 is learned from only if the service accepted a sample of this
// worker since the last measure began: 429 after 429 with nothing accepted in between is a
// storm (a rate limit, or a pause), not a new measure of the share, and lowering on each
// would leave the worker crawling long after the storm. A worker that holds no sample and
// has none on the wire learns nothing.
//
// Nor do acceptances read after the last measure ended count, of samples sent before it
// (answered checks each sample's round): on a starved machine answers are read later than
// measureMax, and a 429 read with them, this worker's or another's through the fleet's
// backoff, answers the same burst, with the fleet paused since. Taken as new, it started a
// second measure, whose round made the share board's division of the first stale (share
// adopts the latest round only), and the workers kept their own peaks: four learned 30 of
// 60 between them.
func (c *capacity) learn() {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire()
	if c.measuring || c.accepted+c.sending == 0 || (c.limit > 0 && c.acceptedSince == 0) {
		return
	}
	c.measuring, c.peak, c.acceptedSince = true, c.accepted, 0
	c.settle()
	if c.measuring {
		var cut *time.Timer
		cut = time.AfterFunc(measureMax, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.measuring && c.cut == cut { // this measure's: a later one stays
				c.end()
			}
		})
		c.cut = cut
	}
}

// settle ends the measure once nothing it raced is on the wire (see end). Call with mu held.
func (c *capacity) settle() {
	if c.measuring && c.sending == 0 {
		c.end()
	}
}

// dropMeasure closes the measure, if one is open, with nothing learned: its cut timer is
// stopped. Call with mu held.
func (c *capacity) dropMeasure() {
	c.measuring = false
	if c.cut != nil { // armed only while a measure is open
		c.cut.Stop()
		c.cut = nil
	}
}

// end ends the measure: the peak becomes the limit, unless a limit at least as large is in
// force (see capacity). Call with mu held.
func (c *capacity) end() {
	c.dropMeasure()
	c.round++
	c.expire()
	m := measure{round: c.round, peak: c.peak}
	if c.limit > 0 {
		m.limit, m.limitOf, m.limitAge = c.limit, c.partOf, c.now().Sub(c.learnedAt)
	}
	if c.peak > 0 {
		c.acceptedSince = 0
		if c.peak > c.limit {
			c.limit, c.window, c.learnedAt = c.peak, c.peak, c.hold(c.peak, c.lastPeak)
			c.partOf = c.peak // measured alone, until a round makes it a part
			c.lastPeak = c.peak
			c.admitWaiters()
		}
	}
	if c.settled != nil {
		select { // newest wins
		case <-c.settled:
		default:
		}
		c.settled <- m
	}
}

// share adopts this worker's part of the capacity the fleet knows after round (see package
// share), unless a newer measure has begun or settled since.
func (c *capacity) share(round int, s share.Share) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if round != c.round || c.measuring || s.Part <= 0 {
		return
	}
	learnedAt := c.now().Add(-s.Age)
	if s.Age == 0 { // this round measured the capacity
		last := c.lastCapacity
		if last == 0 {
			// A worker that joins confirms it against the fleet's measure before, as the
			// others do: on probation, its part expired a quarter of the ttl on and it probed
			// into one more 429 and fleet pause, whose round could lower every part.
			last = s.Before
		}
		learnedAt = c.hold(s.Capacity, last)
	}
	// Also a capacity measured before: a worker that took no part in the round that measured
	// it (its samples were not sent yet, or it joined later) confirms it with the next round
	// as the others do, rather than hold its part on probation and probe into one more 429.
	c.lastCapacity = s.Measured
	c.limit, c.window, c.learnedAt, c.partOf = s.Part, s.Part, learnedAt, s.Measured
	c.expire()
	c.admitWaiters()
}

// hold returns the time to take a limit measured now as learned at: now if the measure
// confirms the last one (within a quarter of it), so that the limit holds for the ttl;
// otherwise earlier by all of the ttl but a quarter, so that the window probes past it then
// (see capacity). Limits and their ages travel through the share board, so a part of a
// capacity on probation expires with it on every worker.
func (c *capacity) hold(measured, last int) time.Time {
	now := c.now()
	if last > 0 && 4*abs(measured-last) <= last {
		return now
	}
	return now.Add(-(c.ttl - c.ttl/4))
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// forget drops the limit in force: a worker that held a part of the capacity left the fleet
// (share.Board.WatchLeaves), so the parts of those that stay add up to less than the
// capacity. The window then grows on from the old limit, and the next 429 measures the
// capacity again: one pause, where the limit held the worker at its old part until it
// expired (15 s, or the whole ttl once confirmed).
//
// A measure or share round under way when the leave is seen is dropped (its round is
// stale): it measured a fleet that still held the leaver, or read the board after its report
// was taken off, and either way its outcome is a part too small for the fleet that stays. A
// worker that left during the pause after a 429 otherwise had the others adopt such a part
// right after they forgot theirs, and run below the capacity until it expired.
//
// It reports whether a limit was in force.
func (c *capacity) forget() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.round++ // share ignores a round that is not the latest
	c.dropMeasure()
	if c.limit == 0 {
		return false
	}
	c.limit = 0
	c.admitWaiters()
	return true
}

// current returns the limit in force (0: none), for metrics.
func (c *capacity) current() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire()
	return c.limit
}

// splitShares takes each settled measure to the fleet's share board and adopts this
// worker's part of the capacity that the round measured, so that a worker whose requests
// all came too late gets a part without another pause. If the board cannot be read, the
// worker keeps its own peak.
func (w *Worker) splitShares(ctx context.Context) {
	c := w.gate.capacity
	for {
		var m measure
		select {
		case <-ctx.Done():
			return
		case m = <-c.settled:
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := w.board.Split(rctx, share.Report{Peak: m.peak, Want: max(len(w.slots), m.peak), Limit: m.limit, LimitAge: m.limitAge, Capacity: m.limitOf})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("split the learned capacity with the fleet", "err", err)
			}
			continue
		}
		w.log.Debug("capacity share round", "peak", m.peak, "limit_before", m.limit, "limit_age", m.limitAge, "part", s.Part, "fleet_capacity", s.Capacity, "measured", s.Measured, "capacity_age", s.Age)
		c.share(m.round, s)
	}
}

package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/dispatch"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/share"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

func TestCapacityLearnsFromA429AndAdmitsUnderIt(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newCapacity(time.Minute)
	c.now = func() time.Time { return now }
	ctx := context.Background()

	// Three samples accepted, one refused: the service is full at three.
	phases := make([]sample, 4)
	for i := range phases {
		if err := c.submit(ctx, &phases[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		c.answered(&phases[i])
	}
	c.learn()
	c.requeue(&phases[3])
	if got := c.current(); got != 3 {
		t.Fatalf("limit = %d, want the 3 accepted samples", got)
	}

	// The refused sample waits for room; a finished sample makes it.
	admitted := make(chan error, 1)
	go func() { admitted <- c.submit(ctx, &phases[3], nil) }()
	select {
	case err := <-admitted:
		t.Fatalf("admitted over the limit (err %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.done(&phases[0])
	if err := <-admitted; err != nil {
		t.Fatal(err)
	}

	// A sample submitted again after its future expired is counted once, as admitted.
	if err := c.submit(ctx, &phases[1], nil); err != nil || phases[1].phase != phaseAdmitted || c.held() != 3 {
		t.Fatalf("resubmission: %v, phase %v, %d held", err, phases[1], c.held())
	}

	// The limit is forgotten after the ttl.
	now = now.Add(2 * time.Minute)
	if got := c.current(); got != 0 {
		t.Fatalf("limit after the ttl = %d, want none", got)
	}
}

func TestCapacityWithNothingAcceptedLearnsNothing(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	c.learn()
	if got := c.current(); got != 0 {
		t.Fatalf("a worker with no sample in flight learned a limit of %d", got)
	}
	off := newCapacity(0)
	var p sample
	_ = off.submit(context.Background(), &p, nil)
	off.answered(&p)
	off.learn()
	if got := off.current(); got != 0 {
		t.Fatalf("learning is off, yet a limit of %d", got)
	}
}

func TestCapacityWaitEndsWithTheContext(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	var a, b sample
	_ = c.submit(context.Background(), &a, nil)
	c.answered(&a)
	c.learn()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.submit(ctx, &b, nil); err == nil {
		t.Fatal("admitted over the limit")
	}
	if b.phase != phaseIdle || c.admitted != 0 || c.accepted != 1 || len(c.waiters) != 0 {
		t.Fatalf("counts after a cancelled wait: phase %v, admitted %d, accepted %d, waiters %d", b, c.admitted, c.accepted, len(c.waiters))
	}
}

// TestCapacityAdmitsNoMoreOnceClosed: close (the worker is stopping) sends a sample waiting
// for room away at once, and one admitted but not yet sent at its next submit; the samples
// accepted keep their places, and nothing is left counted.
func TestCapacityAdmitsNoMoreOnceClosed(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	phases := sendN(t, c, initialWindow-1)
	c.answered(&phases[0]) // accepted: it runs on; the window grows by one
	var admitted, waiting sample
	if err := c.submit(context.Background(), &admitted, nil); err != nil {
		t.Fatal(err)
	}
	phases = append(phases, sendN(t, c, 1)...) // the window is full
	waited := make(chan error, 1)
	go func() { waited <- c.submit(context.Background(), &waiting, nil) }()
	fleettest.Eventually(t, 5*time.Second, "the sample to wait for room", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.waiters) == 1
	})
	c.close()
	select {
	case err := <-waited:
		if !errors.Is(err, errStopping) {
			t.Fatalf("the waiting sample got %v, want errStopping", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting sample still waits after close")
	}
	if err := c.submit(context.Background(), &admitted, nil); !errors.Is(err, errStopping) {
		t.Fatalf("the admitted sample's next submit: %v, want errStopping", err)
	}
	var late sample
	if err := c.submit(context.Background(), &late, nil); !errors.Is(err, errStopping) {
		t.Fatalf("a sample after close: %v, want errStopping", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if admitted.phase != phaseIdle || waiting.phase != phaseIdle || late.phase != phaseIdle || phases[0].phase != phaseAccepted ||
		c.admitted != 0 || c.accepted != 1 || c.sending != initialWindow-1 || len(c.waiters) != 0 {
		t.Fatalf("after close: phases %v %v %v, admitted %d, sending %d, accepted %d, waiters %d",
			admitted, waiting, late, c.admitted, c.sending, c.accepted, len(c.waiters))
	}
}

func TestCapacityLearnsOnlyFromA429AfterNewWork(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	ctx := context.Background()
	phases := make([]sample, 10)
	for i := range phases {
		_ = c.submit(ctx, &phases[i], nil)
		c.answered(&phases[i])
	}
	c.learn()
	if got := c.current(); got != 10 {
		t.Fatalf("limit = %d, want 10", got)
	}
	// A 429 storm: samples finish, 429s keep coming, nothing is accepted: no new measure
	// (each would cost the fleet a share round).
	round := c.round
	for i := range 8 {
		c.done(&phases[i])
		c.learn()
	}
	if got := c.current(); got != 10 || c.round != round {
		t.Fatalf("after a storm of 429s: limit %d, %d measures; want 10 kept, none", got, c.round-round)
	}
	// New work accepted, then a 429: a measure.
	for i := range 3 {
		_ = c.submit(ctx, &phases[i], nil)
		c.answered(&phases[i])
	}
	c.learn()
	if c.round != round+1 {
		t.Fatalf("a 429 following new work made %d measures, want 1", c.round-round)
	}
}

// TestCapacityKeepsItsLimitThroughLowerMeasures: a 429 that comes while the service holds
// fewer samples than it took before is no proof of a smaller capacity (a rate-type 429, or
// one during the refill after a pause). Such a measure keeps the limit but does not renew
// it: a capacity that really shrank is learned when the limit expires.
func TestCapacityKeepsItsLimitThroughLowerMeasures(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newCapacity(time.Minute)
	c.now = func() time.Time { return now }
	c.settled = make(chan measure, 1)
	// A sample that finds no room fails the test rather than waiting for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var phases []sample
	for _, n := range []int{initialWindow, 10 - initialWindow} { // the window grows as they are accepted
		sent := sendN(t, c, n)
		for i := range sent {
			c.answered(&sent[i])
		}
		phases = append(phases, sent...)
	}
	c.learn()
	if got, m := c.current(), settled(t, c); got != 10 || m.peak != 10 || m.limit != 0 {
		t.Fatalf("first measure: limit %d, %+v; want 10, and no limit before it", got, m)
	}
	// A first measure is on probation (TestCapacityHoldsALimitForItsTTLOnceConfirmed); the
	// same measure a quarter of the ttl on confirms it.
	now = now.Add(16 * time.Second)
	c.learn()
	if got, m := c.current(), settled(t, c); got != 10 || m.limit != 0 {
		t.Fatalf("second measure: limit %d, %+v; want 10, and the first expired", got, m)
	}

	accept := func(p *sample) { // a new sample, admitted, sent and accepted
		if err := c.submit(ctx, p, nil); err != nil {
			t.Fatal(err)
		}
		c.send(p)
		c.answered(p)
	}

	// Half a ttl on, 4 samples are done and 2 new ones accepted when a 429 comes: 8 held.
	now = now.Add(30 * time.Second)
	for i := range 4 {
		c.done(&phases[i])
	}
	accept(&phases[0])
	accept(&phases[1])
	c.learn()
	m := settled(t, c)
	if got := c.current(); got != 10 {
		t.Fatalf("limit after a measure of 8 = %d, want the 10 the service held before", got)
	}
	if m.peak != 8 || m.limit != 10 || m.limitOf != 10 || m.limitAge != 30*time.Second {
		t.Fatalf("measure for the fleet = %+v, want peak 8, limit 10 of its own capacity of 10, measured 30s before", m)
	}

	// The lower measure did not renew the limit: it expires a ttl after the measure of 10.
	now = now.Add(31 * time.Second)
	if got := c.current(); got != 0 {
		t.Fatalf("limit a ttl after it was measured = %d, want none", got)
	}

	// With no limit in force, a 429 with 7 held is learned, though below the old 10, on
	// probation: it is not the 10 measured before.
	c.done(&phases[0])
	c.done(&phases[1])
	accept(&phases[0])
	c.learn()
	if got := c.current(); got != 7 {
		t.Fatalf("limit learned with none in force = %d, want the 7 held", got)
	}

	// Nor does a measure at the limit renew it: a limit learned too low is probed past.
	now = now.Add(10 * time.Second)
	c.done(&phases[4])
	accept(&phases[1])
	c.learn()
	if got := c.current(); got != 7 {
		t.Fatalf("limit after a measure of 7 at a limit of 7 = %d, want 7", got)
	}
	now = now.Add(6 * time.Second)
	if got := c.current(); got != 0 {
		t.Fatalf("limit past its probation, with a measure at it since = %d, want none", got)
	}

	// A part of a capacity the fleet measured earlier expires when that capacity does.
	c.share(c.round, share.Share{Part: 6, Capacity: 12, Measured: 12, Age: 50 * time.Second})
	if got := c.current(); got != 6 {
		t.Fatalf("limit after a share of 6 = %d", got)
	}
	now = now.Add(11 * time.Second)
	if got := c.current(); got != 0 {
		t.Fatalf("limit 61s after the capacity it is a part of was measured = %d, want none", got)
	}
}

// TestCapacityHoldsALimitForItsTTLOnceConfirmed: a 429 does not say whether it was about
// capacity, so a measure that does not repeat the last one holds for a quarter of the ttl,
// and the window then probes past it; one that repeats it (within a quarter) holds for the
// ttl. Shared capacities measured by a round follow the same rule.
func TestCapacityHoldsALimitForItsTTLOnceConfirmed(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newCapacity(time.Minute)
	c.now = func() time.Time { return now }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // no room: fail, not hang
	defer cancel()
	var phases []sample
	learnAt := func(held int) { // the samples before are done; held new ones accepted, a 429
		t.Helper()
		for i := range phases {
			c.done(&phases[i])
		}
		phases = make([]sample, held)
		for i := range phases {
			if err := c.submit(ctx, &phases[i], nil); err != nil {
				t.Fatal(err)
			}
			c.send(&phases[i])
			c.answered(&phases[i])
		}
		c.learn()
		if got := c.current(); got != held {
			t.Fatalf("limit %d after a measure of %d", got, held)
		}
	}
	expect := func(after time.Duration, want int) {
		t.Helper()
		now = now.Add(after)
		if got := c.current(); got != want {
			t.Fatalf("limit %d %v on, want %d", got, after, want)
		}
	}

	learnAt(10) // a first measure: on probation
	expect(14*time.Second, 10)
	expect(2*time.Second, 0)
	learnAt(12) // within a quarter of the 10: confirmed
	expect(59*time.Second, 12)
	expect(2*time.Second, 0)
	learnAt(20) // more than a quarter above the 12: on probation
	expect(16*time.Second, 0)

	// A round's capacity: the first on probation, one that repeats it confirmed; a part of a
	// capacity measured before keeps that capacity's age.
	round := c.round
	c.share(round, share.Share{Part: 20, Capacity: 40, Measured: 40})
	expect(14*time.Second, 20)
	expect(2*time.Second, 0)
	c.share(round, share.Share{Part: 21, Capacity: 42, Measured: 42})
	expect(59*time.Second, 21)
	expect(2*time.Second, 0)
	c.share(round, share.Share{Part: 5, Capacity: 10, Measured: 10, Age: 50 * time.Second})
	expect(9*time.Second, 5)
	expect(2*time.Second, 0)
	// A round that repeats that capacity confirms it, though this worker did not measure it.
	c.share(round, share.Share{Part: 6, Capacity: 11, Measured: 11})
	expect(59*time.Second, 6)
	expect(2*time.Second, 0)
}

// A worker that starts while the fleet runs takes its first part in a round that may measure
// the capacity afresh (the fleet's peaks came over its limits). The others confirm it against
// the capacity they measured before; so does the newcomer, by the capacity the round's limits
// were parts of. On probation instead, its part expired 15 s later, it probed past it into one
// more 429 and 1 s fleet pause, and that round's peaks (61 of 64, in a run of the real
// binaries) held the whole fleet under the capacity for a minute.
func TestCapacityJoiningARoundThatRepeatsTheFleetsCapacityConfirmsIt(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newCapacity(time.Minute)
	c.now = func() time.Time { return now }
	c.share(c.round, share.Share{Part: 13, Capacity: 64, Measured: 64, Before: 64})
	for _, step := range []struct {
		after time.Duration
		want  int
	}{{14 * time.Second, 13}, {45 * time.Second, 13}, {2 * time.Second, 0}} {
		now = now.Add(step.after)
		if got := c.current(); got != step.want {
			t.Fatalf("limit %d %v on, want %d", got, step.after, step.want)
		}
	}

	// A capacity the round measured far from the fleet's before is on probation, as ever.
	c = newCapacity(time.Minute)
	c.now = func() time.Time { return now }
	c.share(c.round, share.Share{Part: 20, Capacity: 100, Measured: 100, Before: 64})
	now = now.Add(16 * time.Second)
	if got := c.current(); got != 0 {
		t.Fatalf("limit %d 16s after a part of a capacity far from the fleet's before, want none (probation)", got)
	}
}

// settled returns the measure c settled last, failing the test if none did.
func settled(t *testing.T, c *capacity) measure {
	t.Helper()
	select {
	case m := <-c.settled:
		return m
	default:
		t.Fatal("no measure settled")
		return measure{}
	}
}

// sendN admits and sends n samples, as the gate does before asample.
func sendN(t *testing.T, c *capacity, n int) []sample {
	t.Helper()
	phases := make([]sample, n)
	for i := range phases {
		if err := c.submit(context.Background(), &phases[i], nil); err != nil {
			t.Fatal(err)
		}
		c.send(&phases[i])
	}
	return phases
}

// sendAgain ends the sample s and sends the worker's next one in its place, as the gate does.
func sendAgain(t *testing.T, c *capacity, s *sample) {
	t.Helper()
	c.done(s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.submit(ctx, s, nil); err != nil {
		t.Fatal(err)
	}
	c.send(s)
}

func TestCapacityMeasuresUntilTheRacingSubmissionsAreAnswered(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	phases := sendN(t, c, 8)
	// The 429 is read while six answers are still on the wire; four of them are acceptances.
	c.answered(&phases[0])
	c.answered(&phases[1])
	c.learn()
	c.requeue(&phases[2]) // the 429 itself
	if got := c.current(); got != 0 {
		t.Fatalf("limit = %d while answers are still on the wire, want none yet", got)
	}
	for i := 3; i < 7; i++ {
		c.answered(&phases[i])
	}
	c.learn() // the fleet's copy of the same 429: already measuring
	c.requeue(&phases[7])
	if got := c.current(); got != 6 {
		t.Fatalf("limit = %d, want the 6 samples the service held", got)
	}
}

// TestCapacityEndsAMeasureThatOutlastsMeasureMax: a submission unanswered for measureMax is
// being tried again (a 5xx: the client sleeps between tries), and does not hold the measure
// open past the fleet's share round.
func TestCapacityEndsAMeasureThatOutlastsMeasureMax(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	phases := sendN(t, c, 3)
	c.answered(&phases[0])
	c.answered(&phases[1])
	c.learn() // phases[2] stays on the wire
	start := time.Now()
	for {
		c.mu.Lock()
		measuring, limit := c.measuring, c.limit
		c.mu.Unlock()
		if !measuring {
			if limit != 2 {
				t.Fatalf("limit %d after the measure was cut, want the 2 accepted", limit)
			}
			break
		}
		if time.Since(start) > 10*measureMax {
			t.Fatalf("the measure is still open %v on", time.Since(start))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if waited := time.Since(start); waited < measureMax {
		t.Fatalf("the measure was cut after %v, before measureMax", waited)
	}
	// The late answer counts as an acceptance, and does not reopen anything.
	c.answered(&phases[2])
	c.mu.Lock()
	accepted, measuring := c.accepted, c.measuring
	c.mu.Unlock()
	if accepted != 3 || measuring || c.current() != 2 {
		t.Fatalf("after the late answer: %d accepted, measuring %v, limit %d", accepted, measuring, c.current())
	}
}

// TestCapacityALate429OfTheLastMeasureStartsNoOther: on a starved machine the answers to a
// burst are read late, some after measureMax has cut the measure. A 429 read then (this
// worker's, or another's through the fleet's backoff) answers a submission sent before the
// measure ended, as do the acceptances read with it: it is the same burst, and the fleet has
// been paused since. Taken as a new 429, it started a second measure whose round made the
// share board's division of the first stale, and the fleet ran at its workers' own peaks
// (four workers learned 30 of 60 between them).
func TestCapacityALate429OfTheLastMeasureStartsNoOther(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	c.settled = make(chan measure, 1)
	phases := sendN(t, c, 5)
	c.answered(&phases[0])
	c.answered(&phases[1])
	c.learn() // the 429 of phases[4]; phases[2] and phases[3] are still on the wire
	c.requeue(&phases[4])
	var m measure
	select { // cut at measureMax
	case m = <-c.settled:
	case <-time.After(10 * time.Second):
		t.Fatal("the measure was not cut")
	}
	if m.peak != 2 || c.current() != 2 {
		t.Fatalf("measure %+v, limit %d; want the 2 accepted", m, c.current())
	}

	// Read late: phases[2] was accepted, phases[3] was refused.
	c.answered(&phases[2])
	c.learn()
	c.requeue(&phases[3])
	c.mu.Lock()
	measuring, round := c.measuring, c.round
	c.mu.Unlock()
	if measuring || round != m.round {
		t.Fatalf("a 429 answering a submission of the last measure: measuring %v, round %d; want no new measure (round %d)", measuring, round, m.round)
	}
	c.share(m.round, share.Share{Part: 15, Capacity: 60, Measured: 60})
	if got := c.current(); got != 15 {
		t.Fatalf("limit %d after the round of the measure, want its part 15", got)
	}

	// A sample sent after the measure and accepted is new work: the next 429 measures.
	sendAgain(t, c, &phases[0])
	c.answered(&phases[0])
	c.learn()
	if m := settled(t, c); m.round != round+1 || m.limit != 15 {
		t.Fatalf("measure after new work %+v, want round %d with the limit 15 before it", m, round+1)
	}
}

func TestCapacityMeasureKeepsThePeak(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	phases := sendN(t, c, 4)
	c.answered(&phases[0])
	c.answered(&phases[1])
	c.learn()
	c.answered(&phases[2])
	c.done(&phases[0]) // finishes while the measure is open
	c.requeue(&phases[3])
	if got := c.current(); got != 3 {
		t.Fatalf("limit = %d, want the peak of 3", got)
	}
}

func TestCapacityAdmitsWaitersInOrderOnePerFreedPlace(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	held := sendN(t, c, 2)
	c.answered(&held[0])
	c.answered(&held[1])
	c.learn()
	if got := c.current(); got != 2 {
		t.Fatalf("limit = %d, want 2", got)
	}
	const n = 5
	waiting := make([]sample, n)
	admitted := make(chan int, n)
	for i := range n {
		go func() {
			if err := c.submit(context.Background(), &waiting[i], nil); err == nil {
				admitted <- i
			}
		}()
		// Arrival order is the order of the waiters list.
		deadline := time.Now().Add(5 * time.Second)
		for {
			c.mu.Lock()
			queued := len(c.waiters)
			c.mu.Unlock()
			if queued == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d never queued", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	c.done(&held[0])
	if got := <-admitted; got != 0 {
		t.Fatalf("first admitted waiter = %d, want 0", got)
	}
	select {
	case got := <-admitted:
		t.Fatalf("waiter %d admitted with no room", got)
	case <-time.After(20 * time.Millisecond):
	}
	c.done(&held[1])
	if got := <-admitted; got != 1 {
		t.Fatalf("second admitted waiter = %d, want 1", got)
	}
	// A larger part from the fleet admits as many as it has room for, still in order.
	c.share(c.round, share.Share{Part: 4, Capacity: 4, Measured: 4})
	a, b := <-admitted, <-admitted
	if min(a, b) != 2 || max(a, b) != 3 || waiting[4].phase != phaseIdle {
		t.Fatalf("admitted waiters %d and %d (waiter 4 in phase %v), want 2 and 3", a, b, waiting[4])
	}
	// When the limit expires, the window carries on from it: no room yet, and then every
	// acceptance adds a place.
	c.mu.Lock()
	c.learnedAt = c.learnedAt.Add(-2 * time.Minute)
	c.expire()
	c.mu.Unlock()
	select {
	case got := <-admitted:
		t.Fatalf("waiter %d admitted past the window the old limit left", got)
	case <-time.After(20 * time.Millisecond):
	}
	if got := c.current(); got != 0 {
		t.Fatalf("limit after the ttl = %d, want none", got)
	}
	c.send(&waiting[0])
	c.answered(&waiting[0])
	if got := <-admitted; got != 4 {
		t.Fatalf("admitted waiter = %d, want 4", got)
	}
}

func TestCapacityWindowBoundsTheFirstBurst(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	// Before anything is accepted, only initialWindow samples go out.
	first := sendN(t, c, initialWindow)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	var extra sample
	if err := c.submit(ctx, &extra, nil); err == nil {
		t.Fatal("admitted past the initial window with nothing accepted")
	}
	// Each acceptance adds a place: the window doubles per round trip, like TCP slow start.
	for i := range first {
		c.answered(&first[i])
	}
	sendN(t, c, initialWindow)
	if c.held() != 2*initialWindow {
		t.Fatalf("held %d after %d acceptances, want %d", c.held(), initialWindow, 2*initialWindow)
	}
	// Learning off (the SDK's way): no window at all.
	off := newCapacity(0)
	sendN(t, off, 10*initialWindow)
}

func TestCapacitySampleAdmittedBeforeTheLimitGivesItsPlaceBack(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	sent := sendN(t, c, 3)
	var early sample // admitted in the first burst, still waiting for the backoff
	if err := c.submit(context.Background(), &early, nil); err != nil {
		t.Fatal(err)
	}
	c.answered(&sent[0])
	c.answered(&sent[1])
	c.learn()
	c.requeue(&sent[2])
	if got := c.current(); got != 2 {
		t.Fatalf("limit = %d, want 2", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.submit(ctx, &early, nil); err == nil {
		t.Fatal("a sample admitted before the limit went over it")
	}
	if early.phase != phaseIdle || c.held() != 2 {
		t.Fatalf("after giving its place back: phase %v, held %d", early, c.held())
	}
}

// TestCapacityALeaveMakesTheRoundUnderWayStale: a worker that leaves while a measure is open,
// or while its share round is out on the board, makes that outcome stale. The worker forgets
// its limit and adopts nothing from the round: its part would be of a fleet that still held
// the leaver (or of a board it had left), too small for the workers that stay.
func TestCapacityALeaveMakesTheRoundUnderWayStale(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	c.settled = make(chan measure, 1)

	// A measure settles (the limit is this worker's own peak) and goes to the board; the leave
	// is seen before the round comes back.
	phases := sendN(t, c, 3)
	c.answered(&phases[0])
	c.answered(&phases[1])
	c.answered(&phases[2])
	c.learn()
	m := <-c.settled
	if got := c.current(); got != 3 {
		t.Fatalf("limit after the measure = %d, want the 3 accepted", got)
	}
	c.forget()
	c.share(m.round, share.Share{Part: 3, Capacity: 3, Measured: 3})
	if got := c.current(); got != 0 {
		t.Fatalf("limit after a leave and then the round under way = %d, want none", got)
	}

	// A measure still open when the leave is seen ends with nothing learned or sent.
	sendAgain(t, c, &phases[0]) // on the wire: the measure waits for its answer
	c.learn()
	c.mu.Lock()
	measuring := c.measuring
	c.mu.Unlock()
	if !measuring {
		t.Fatal("the 429 started no measure")
	}
	c.forget()
	c.answered(&phases[0])
	c.mu.Lock()
	measuring = c.measuring
	c.mu.Unlock()
	select {
	case m := <-c.settled:
		t.Fatalf("a measure open at the leave was sent to the board: %+v", m)
	default:
	}
	if measuring || c.current() != 0 {
		t.Fatalf("after a leave during a measure: measuring %v, limit %d; want neither", measuring, c.current())
	}
}

// A limit taken from a share round is reported, with the next measure, as a part of the
// round's capacity, so that the next round can tell parts of one division from parts of
// several (share.capacityOf).
func TestCapacityReportsTheCapacityItsLimitIsAPartOf(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	c.settled = make(chan measure, 1)
	sent := sendN(t, c, 4)
	for i := range sent {
		c.answered(&sent[i])
	}
	c.learn()
	if m := settled(t, c); m.peak != 4 || m.limit != 0 {
		t.Fatalf("first measure %+v, want peak 4 and no limit before it", m)
	}
	c.share(c.round, share.Share{Part: 21, Capacity: 64, Measured: 64})
	sendAgain(t, c, &sent[0])
	c.answered(&sent[0])
	c.learn()
	if m := settled(t, c); m.limit != 21 || m.limitOf != 64 {
		t.Fatalf("measure after a share of 21 of 64: %+v, want limit 21 of 64", m)
	}

	// A round that found the fleet full just under its limits gave parts of 62, still of the
	// 66 measured: the limit is reported as a part of 66, so that the next round counts its
	// slack from 66 and not from 62 (no ratchet).
	c.share(c.round, share.Share{Part: 20, Capacity: 62, Measured: 66})
	sendAgain(t, c, &sent[0])
	c.answered(&sent[0])
	c.learn()
	if m := settled(t, c); m.limit != 20 || m.limitOf != 66 {
		t.Fatalf("measure after a share of 20 of a lowered division of 66: %+v, want limit 20 of 66", m)
	}
}

// Limits that add up to more than the service holds are what fills it, so the fleet would
// pause about every second until they expired (up to the ttl). The next round divides the
// capacity again instead, and the fleet runs under it:
//   - limits from different divisions (a worker restarted, and rounds that read different
//     reports gave three workers 32 of 64 each);
//   - limits of one division measured a little too high (a measure counted a sample or two
//     whose results were on their way back: 22 each of 66).
func TestLimitsOverTheCapacityAreDividedAgain(t *testing.T) {
	t.Parallel()
	const capacity = 64
	for _, tc := range []struct {
		name          string
		part, ofWhole int
	}{
		{"parts of different divisions", 32, capacity},
		{"one division measured too high", 22, 66},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Samples of half a second: the workers fill the capacity even on a busy machine
			// under the race detector (with 100 ms samples and the package's other tests
			// beside it, they did not, and no 429 came).
			b := setup(t, queue.Config{}, tinkersim.Config{Capacity: capacity, BaseLatency: 500 * time.Millisecond})
			workers := make([]*Worker, 3)
			for i := range workers {
				workers[i] = b.open(t, b.connect(t), Config{Concurrency: capacity})
				c := workers[i].gate.capacity
				c.share(c.round, share.Share{Part: tc.part, Capacity: tc.ofWhole, Measured: tc.ofWhole, Age: time.Second})
			}
			limits := func() (sum int, each []int) {
				for _, w := range workers {
					l := w.gate.capacity.current()
					sum, each = sum+l, append(each, l)
				}
				return sum, each
			}
			if sum, each := limits(); sum != 3*tc.part {
				t.Fatalf("limits %v before the run, want %d each", each, tc.part)
			}
			for _, w := range workers {
				run(t, w)
			}
			publishJobs(t, b.results, "over", tokenJobs("o", 20*capacity)) // 10 s of work at capacity
			deadline := time.Now().Add(15 * time.Second)
			for {
				sum, each := limits()
				if sum > 0 && sum <= capacity {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("limits %v (%d in all) 15s into the run, want them divided again within the capacity of %d", each, sum, capacity)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestGateCountsOnlyAcceptedSubmissions: a submission that failed (a 5xx after its retries, a
// dropped connection) or was never sent is not a sample the service holds. Counted as one, it
// grew the slow-start window and raised the measure racing a 429 above what the service held.
func TestGateCountsOnlyAcceptedSubmissions(t *testing.T) {
	t.Parallel()
	g := NewGate(dispatch.New(dispatch.Config{}), backoff.NewLocal(nil), nil)
	g.capacity = newCapacity(time.Minute)
	ctx := context.Background()
	release := make([]func(bool), 4)
	for i := range release {
		sctx := withSampleState(ctx, &sampleState{})
		r, err := g.Acquire(sctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Wait(sctx); err != nil {
			t.Fatal(err)
		}
		release[i] = r
	}
	release[0](true)
	g.capacity.learn() // a 429 elsewhere in the fleet, with three submissions on the wire
	release[1](false)
	release[2](true)
	release[3](false)
	if got := g.capacity.current(); got != 2 {
		t.Fatalf("limit = %d, want the 2 samples the service accepted", got)
	}
	c := g.capacity
	c.mu.Lock()
	held, window := c.held(), c.window
	c.mu.Unlock()
	if held != 2 || window != 2 {
		t.Fatalf("%d held, window %d; want the 2 accepted, and the window at the limit", held, window)
	}
}

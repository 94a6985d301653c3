package worker

import (
	"context"
	"sync"
	"time"
)

// capacity learns how many samples the account runs at once and keeps this worker's share
// under it. The wire protocol gives no number: the service answers 429 when it is full
// (X-Tinker-Sampling-Backpressure, §3.6), and every 429 pauses the fleet for a second
// (§5.3). A fleet that simply refills after each pause hits the ceiling again at once, so a
// capacity-bound batch ran at capacity per second instead of capacity per sample latency
// (bench comparison 1: 0.2 of the ideal for 200 ms samples).
//
// So when a 429 is seen (here, or anywhere in the fleet through the backoff key), the number
// of this worker's samples that the service has accepted and not yet finished becomes its
// limit: together the workers' limits are about what the service held when it said full.
// Samples are admitted while accepted + submitting stays under the limit. The limit is
// forgotten after ttl without a new 429, so a capacity that grows, or a 429 that was about
// a rate rather than capacity, costs at most ttl; relearning costs one more 429.
type capacity struct {
	ttl time.Duration // 0: never learn (no limit)
	now func() time.Time

	mu         sync.Mutex
	submitting int // admitted, asample not yet answered
	accepted   int // asample accepted, result not yet back
	// acceptedSince counts acceptances since the limit was last learned.
	acceptedSince int
	limit         int       // 0: none
	learnedAt     time.Time // when limit was set
	changed       chan struct{}
}

// samplePhase is where one job's sample stands for capacity accounting.
type samplePhase int

const (
	phaseIdle       samplePhase = iota // not admitted
	phaseSubmitting                    // admitted, submitting
	phaseAccepted                      // accepted by the service
)

func newCapacity(ttl time.Duration) *capacity {
	return &capacity{ttl: ttl, now: time.Now, changed: make(chan struct{})}
}

// limitNow returns the limit in force (0: none), forgetting an expired one. Call with mu held.
func (c *capacity) limitNow() int {
	if c.limit > 0 && c.now().Sub(c.learnedAt) > c.ttl {
		c.limit = 0
		c.wake()
	}
	return c.limit
}

// wake tells waiters that the counts or the limit changed. Call with mu held.
func (c *capacity) wake() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// submit moves a job's sample to submitting: a new sample waits for room under the limit; a
// sample submitted again (its future expired, §4.2 410) keeps the room it had.
func (c *capacity) submit(ctx context.Context, phase *samplePhase) error {
	for {
		c.mu.Lock()
		switch *phase {
		case phaseSubmitting:
			c.mu.Unlock()
			return nil
		case phaseAccepted:
			c.accepted--
			c.submitting++
			*phase = phaseSubmitting
			c.mu.Unlock()
			return nil
		}
		limit := c.limitNow()
		if limit == 0 || c.accepted+c.submitting < limit {
			c.submitting++
			*phase = phaseSubmitting
			c.mu.Unlock()
			return nil
		}
		ch, left := c.changed, c.ttl-c.now().Sub(c.learnedAt)
		c.mu.Unlock()
		t := time.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// answered records that asample was answered for a submitting sample (accepted, or failed:
// then done follows at once).
func (c *capacity) answered(phase *samplePhase) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if *phase == phaseSubmitting {
		c.submitting--
		c.accepted++
		c.acceptedSince++
		*phase = phaseAccepted
	}
}

// done records that a job's sample is over, whatever its phase.
func (c *capacity) done(phase *samplePhase) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch *phase {
	case phaseSubmitting:
		c.submitting--
	case phaseAccepted:
		c.accepted--
	default:
		return
	}
	*phase = phaseIdle
	c.wake()
}

// learn takes the samples the service holds for this worker now as its limit (a 429 says
// the service is full). With a limit already in force, a 429 is learned from only if the
// service accepted a sample of this worker since the last one: 429 after 429 with nothing
// accepted in between is a storm (a rate limit, or a pause), not a new measure of the share,
// and lowering on each would leave the worker crawling long after the storm. A worker
// holding no sample learns nothing.
func (c *capacity) learn() {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.accepted == 0 {
		return
	}
	if c.limitNow() > 0 && c.acceptedSince == 0 {
		return
	}
	c.limit, c.acceptedSince = c.accepted, 0
	c.learnedAt = c.now()
	c.wake()
}

// current returns the limit in force (0: none), for metrics.
func (c *capacity) current() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.limitNow()
}

// requeue takes a submitting sample that the service refused (429) out of the count, so that
// it waits for room again like a new one rather than holding a place it does not have.
func (c *capacity) requeue(phase *samplePhase) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if *phase == phaseSubmitting {
		c.submitting--
		*phase = phaseIdle
		c.wake()
	}
}

package worker

import (
	"context"
	"testing"
	"time"
)

func TestCapacityLearnsFromA429AndAdmitsUnderIt(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newCapacity(time.Minute)
	c.now = func() time.Time { return now }
	ctx := context.Background()

	// Three samples accepted, one refused: the service is full at three.
	phases := make([]samplePhase, 4)
	for i := range phases {
		if err := c.submit(ctx, &phases[i]); err != nil {
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
	go func() { admitted <- c.submit(ctx, &phases[3]) }()
	select {
	case err := <-admitted:
		t.Fatalf("admitted over the limit (err %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.done(&phases[0])
	if err := <-admitted; err != nil {
		t.Fatal(err)
	}

	// A sample submitted again after its future expired keeps its place.
	if err := c.submit(ctx, &phases[1]); err != nil || phases[1] != phaseSubmitting {
		t.Fatalf("resubmission: %v, phase %v", err, phases[1])
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
	var p samplePhase
	_ = off.submit(context.Background(), &p)
	off.answered(&p)
	off.learn()
	if got := off.current(); got != 0 {
		t.Fatalf("learning is off, yet a limit of %d", got)
	}
}

func TestCapacityWaitEndsWithTheContext(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	var a, b samplePhase
	_ = c.submit(context.Background(), &a)
	c.answered(&a)
	c.learn()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.submit(ctx, &b); err == nil {
		t.Fatal("admitted over the limit")
	}
	if b != phaseIdle || c.submitting != 0 || c.accepted != 1 {
		t.Fatalf("counts after a cancelled wait: phase %v, submitting %d, accepted %d", b, c.submitting, c.accepted)
	}
}

func TestCapacityLearnsOnlyFromA429AfterNewWork(t *testing.T) {
	t.Parallel()
	c := newCapacity(time.Minute)
	ctx := context.Background()
	phases := make([]samplePhase, 10)
	for i := range phases {
		_ = c.submit(ctx, &phases[i])
		c.answered(&phases[i])
	}
	c.learn()
	if got := c.current(); got != 10 {
		t.Fatalf("limit = %d, want 10", got)
	}
	// A 429 storm: samples finish, 429s keep coming, nothing is accepted: no ratchet down.
	for i := range 8 {
		c.done(&phases[i])
		c.learn()
	}
	if got := c.current(); got != 10 {
		t.Fatalf("limit after a storm of 429s = %d, want it kept at 10", got)
	}
	// New work accepted, then full again at 5: the share is 5.
	for i := range 3 {
		_ = c.submit(ctx, &phases[i])
		c.answered(&phases[i])
	}
	c.learn()
	if got := c.current(); got != 5 {
		t.Fatalf("limit after a 429 following new work = %d, want 5", got)
	}
}

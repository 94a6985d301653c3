package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// reserveAsync reserves n in a goroutine; the returned channel gets the charge once reserved.
func reserveAsync(t *testing.T, m *resultMemory, stopping context.Context, n int64) <-chan charge {
	t.Helper()
	got := make(chan charge, 1)
	go func() {
		c, err := m.reserve(context.Background(), stopping, nil, n)
		if err != nil {
			t.Error(err)
			return
		}
		got <- c
	}()
	return got
}

// stillWaiting fails the test if ch delivers within 50 ms: what it waits for must still wait.
// (The converse, that it goes on once it may, is received's, with a generous bound.)
func stillWaiting[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s went on", what)
	case <-time.After(50 * time.Millisecond):
	}
}

// received returns what ch delivers, failing the test if it has not within 5 s.
func received[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("%s still waits", what)
		panic("unreachable")
	}
}

func TestResultMemoryHoldsSamplesBackWhileResultsFillIt(t *testing.T) {
	t.Parallel()
	m := &resultMemory{limit: 100}
	bg := context.Background()

	big, err := m.reserve(bg, bg, nil, 150) // more than the limit: goes while the charges are under it
	if err != nil {
		t.Fatal(err)
	}
	next := reserveAsync(t, m, bg, 0) // a job whose request makes nothing certain still waits
	stillWaiting(t, next, "a sample sent while the charges are over the limit")
	if err := big.grow(bg, 180); err != nil { // its reply is back: the peak, without waiting
		t.Fatal(err)
	}
	big.resize(120) // encoded: its stored message
	stillWaiting(t, next, "a sample sent while the charges are still over the limit")
	big.release()
	c := received(t, next, "a sample once the charges are under the limit")
	if got := m.charged(); got != 0 {
		t.Fatalf("charged %d, want 0", got)
	}
	c.release()

	// A worker that stops ends the wait: the job goes back to the fleet.
	full, _ := m.reserve(bg, bg, nil, 100)
	stopping, stop := context.WithCancel(bg)
	errc := make(chan error, 1)
	go func() { _, err := m.reserve(bg, stopping, nil, 1); errc <- err }()
	stillWaiting(t, errc, "a sample sent over the limit")
	stop()
	if err := received(t, errc, "a stopping worker's sample"); !errors.Is(err, errStopping) {
		t.Fatalf("reserve of a stopping worker: %v, want errStopping", err)
	}
	full.release()
	if got := m.charged(); got != 0 {
		t.Fatalf("charged %d after every charge ended, want 0", got)
	}
}

func TestResultMemoryLetsOneReplyGrowWhenOnlyRepliesHoldIt(t *testing.T) {
	t.Parallel()
	m := &resultMemory{limit: 100}
	bg := context.Background()
	grow := func(c *charge, n int64) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			if err := c.grow(bg, n); err != nil {
				t.Error(err)
			}
			close(done)
		}()
		return done
	}

	// Three samples sent under the limit; the last one takes the charges past it.
	a, _ := m.reserve(bg, bg, nil, 10)
	b, _ := m.reserve(bg, bg, nil, 50)
	c, _ := m.reserve(bg, bg, nil, 50)

	// a's reply is back while nothing else is made or stored: it grows past the limit, or
	// no reply would ever grow.
	received(t, grow(&a, 90), "a reply while only replies hold the memory")
	// b's must wait while a's result is made and stored.
	bGrown := grow(&b, 90)
	stillWaiting(t, bGrown, "a reply that grows past the limit while another result is made")
	a.resize(10) // encoded: 110 charged, 100 of them pending
	stillWaiting(t, bGrown, "a reply that grows past the limit while another result is stored")
	a.release() // stored: only b and c, pending, hold memory, as much as the limit
	received(t, bGrown, "a reply once only replies hold the memory")

	// Under the limit, a reply grows at once.
	b.release()
	received(t, grow(&c, 50), "a reply under the limit")
	c.release()
	if got := m.charged(); got != 0 {
		t.Fatalf("charged %d after every charge ended, want 0", got)
	}

	// A charge released before its reply came (the sample failed) is no longer pending: were
	// it still, f's reply would take e's result, being made, for a reply, and grow past the
	// limit beside it.
	d, _ := m.reserve(bg, bg, nil, 99)
	e, _ := m.reserve(bg, bg, nil, 1)
	d.release()
	f, _ := m.reserve(bg, bg, nil, 1)
	received(t, grow(&e, 99), "a reply under the limit") // 100 charged, f's 1 pending
	fGrown := grow(&f, 50)
	stillWaiting(t, fGrown, "a reply that grows past the limit while another result is made, after a sample failed")
	e.release()
	received(t, fGrown, "a reply under the limit")
	f.release()
	if got := m.charged(); got != 0 {
		t.Fatalf("charged %d, want 0", got)
	}
}

func TestResultMemoryWithoutALimitChargesNothing(t *testing.T) {
	t.Parallel()
	m := &resultMemory{}
	bg := context.Background()
	for range 3 {
		c, err := m.reserve(bg, bg, nil, 1<<40)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.grow(bg, 1<<41); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.charged(); got != 0 {
		t.Fatalf("charged %d without a limit", got)
	}
}

// The settlements a worker keeps for its next jobs hold none of the results they stored: a
// result's memory is charged until it is stored, and nothing of it stays after, compressed
// results (a buffer of their own) included.
func TestKeptSettlementsHoldNoResultOnceItIsStored(t *testing.T) {
	t.Parallel()
	const slots, limit = 8, 1 << 20
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 64, BaseLatency: 50 * time.Millisecond})
	w := b.open(t, b.connect(t), Config{Concurrency: slots, ResultMemory: limit})
	stop := run(t, w)
	prompt := make([]int, 2000)
	for i := range prompt {
		prompt[i] = 1000 + i
	}
	js := make([]jobs.Job, 2*slots)
	for i := range js { // top-20 prompt logprobs of 2,000 tokens: about 170 KB compressed a result
		js[i] = jobs.Job{CustomID: fmt.Sprintf("lp%d", i), Model: "Qwen/Qwen3-8B", PromptTokens: prompt, NumSamples: 1,
			Params: jobs.SamplingParams{MaxTokens: intp(4)}, PromptLogprobs: true, TopKPromptLogprobs: 20}
	}
	publishJobs(t, b.results, "lp", js)
	for id, r := range waitResults(t, b.results, "lp", len(js), 3*time.Minute) {
		if r.Status != jobs.StatusOK {
			t.Fatalf("%s: %+v", id, r.Error)
		}
	}
	fleettest.Eventually(t, 5*time.Second, "every charge to end", func() bool { return w.memory.charged() == 0 })
	stop()
	kept := 0
	for len(w.settlements) > 0 {
		s := <-w.settlements
		if kept++; s.result != nil && len(s.result.Data) > 0 {
			t.Fatalf("a kept settlement holds %d bytes of the result it stored, uncharged", len(s.result.Data))
		}
	}
	if kept == 0 {
		t.Fatal("the worker kept no settlement")
	}
}

// A reply that is back holds its decoded numbers while it waits to grow to its peak, and is
// charged them meanwhile: uncharged, every job slot's reply could sit decoded beside a full
// budget (16 samples of 8,192 tokens each are 2 MB decoded; 400 slots of them, 840 MB), and
// the budget's metric would not show it.
func TestAReplyWaitingToGrowIsChargedWhatItHolds(t *testing.T) {
	t.Parallel()
	const slots, limit, samples, tokens = 4, 1 << 20, 16, 256
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 64, BaseLatency: 500 * time.Millisecond,
		MinGenTokens: tokens, StopTokenProbability: -1})
	w := b.open(t, b.connect(t), Config{Concurrency: slots, ResultMemory: limit})
	back := make(chan struct{}, slots)
	w.sampled = func(jobs.Job) { back <- struct{}{} }
	run(t, w)
	js := make([]jobs.Job, slots) // sampled tokens only: their requests make nothing certain
	for i := range js {
		js[i] = jobs.Job{CustomID: fmt.Sprintf("long%d", i), Model: "Qwen/Qwen3-8B", PromptTokens: []int{1, 2, 3},
			NumSamples: samples, Params: jobs.SamplingParams{MaxTokens: intp(tokens)}}
	}
	publishJobs(t, b.results, "long", js)
	// Once their samples are sent, a result being stored takes the whole budget.
	fleettest.Eventually(t, 5*time.Second, "the samples to be sent", func() bool { return b.sim.Stats().SamplesAccepted == slots })
	bg := context.Background()
	stored, err := w.memory.reserve(bg, bg, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := stored.grow(bg, limit); err != nil {
		t.Fatal(err)
	}
	for range slots {
		received(t, back, "a reply")
	}
	want := int64(limit + slots*samples*tokens*decodedCellBytes)
	fleettest.Eventually(t, 5*time.Second, "the replies back to be charged", func() bool { return w.memory.charged() >= want })
	stored.release()
	waitResults(t, b.results, "long", slots, 30*time.Second)
	fleettest.Eventually(t, 5*time.Second, "every charge to end", func() bool { return w.memory.charged() == 0 })
}

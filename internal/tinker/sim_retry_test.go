package tinker_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// sampleThrough injects f into a fresh simulator, samples once and returns the result, the
// error and the environment.
func sampleThrough(t *testing.T, f tinkersim.Fault, mod func(*tinker.Config)) (*tinker.SampleResult, error, *simEnv) {
	t.Helper()
	e := newSimEnv(t, tinkersim.Config{}, mod)
	s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if _, err := e.sim.Inject(f); err != nil {
		t.Fatal(err)
	}
	res, err := s.Sample(e.ctx, simRequest(21))
	return res, err, e
}

// TestSimRetryLayers checks, against the simulator, the retry classes of §4.2 and §6.2 that
// the scripted fake covers: which layer retries what, with which seq_id, and how long.
func TestSimRetryLayers(t *testing.T) {
	t.Parallel()
	// §4.2: a 429 on a poll sleeps min(2^n, 30)·base, per future; no new attempt.
	t.Run("429 on polls", func(t *testing.T) {
		t.Parallel()
		res, err, e := sampleThrough(t, tinkersim.Fault{Kind: tinkersim.FaultRateLimit, Endpoints: []string{"retrieve_future"}, Count: 3}, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkSequences(t, res.Response, 1, 16)
		var delays []time.Duration
		for _, ev := range e.eventsOf(tinker.EventRateLimited) {
			if ev.Endpoint == "retrieve_future" {
				delays = append(delays, ev.Delay)
			}
		}
		want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond}
		if res.Attempts != 1 || res.Submissions != 1 || len(delays) != 3 || delays[0] != want[0] || delays[1] != want[1] || delays[2] != want[2] {
			t.Fatalf("%d attempts, %d submissions, poll 429 delays %v: want one attempt and %v", res.Attempts, res.Submissions, delays, want)
		}
	})
	// §4.2: a connection error on a poll is the 429 class: backoff, same future.
	t.Run("dropped polls", func(t *testing.T) {
		t.Parallel()
		res, err, e := sampleThrough(t, tinkersim.Fault{Kind: tinkersim.FaultDrop, Endpoints: []string{"retrieve_future"}, Count: 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st := e.sim.Stats()
		if res.Attempts != 1 || st.SamplesAccepted != 1 || st.Requests["retrieve_future"][0] != 2 {
			t.Fatalf("%d attempts, %d futures, %d dropped polls: want one future polled through", res.Attempts, st.SamplesAccepted, st.Requests["retrieve_future"][0])
		}
	})
	// §6.2, §8: 5xx and 408 on asample are retried by the submission loop with the same
	// seq_id; the service makes one future.
	for _, f := range []tinkersim.Fault{
		{Kind: tinkersim.FaultServerError, Status: 503, Endpoints: []string{"asample"}, Count: 2},
		{Kind: tinkersim.FaultTimeout, Endpoints: []string{"asample"}, Count: 2},
		{Kind: tinkersim.FaultRateLimit, Count: 2},
	} {
		t.Run(string(f.Kind)+" on asample", func(t *testing.T) {
			t.Parallel()
			res, err, e := sampleThrough(t, f, nil)
			if err != nil {
				t.Fatal(err)
			}
			st := e.sim.Stats()
			if res.Attempts != 1 || res.Submissions != 3 || st.SamplesAccepted != 1 ||
				!strings.HasSuffix(res.RequestID, ":"+strconv.FormatInt(res.SeqID, 10)) {
				t.Fatalf("%d attempts, %d submissions, %d futures, request %s seq %d: want one seq_id sent three times",
					res.Attempts, res.Submissions, st.SamplesAccepted, res.RequestID, res.SeqID)
			}
		})
	}
	// §6.2: the submission loop gives up after its deadline; then the sample layer (§6.3)
	// retries the whole attempt with a new seq_id.
	t.Run("5xx on asample past the submission deadline", func(t *testing.T) {
		t.Parallel()
		res, err, e := sampleThrough(t, tinkersim.Fault{Kind: tinkersim.FaultServerError, Endpoints: []string{"asample"}, Duration: 700 * time.Millisecond},
			func(c *tinker.Config) { c.Timing.SubmitRetryDeadline = 200 * time.Millisecond })
		if err != nil {
			t.Fatal(err)
		}
		if res.Attempts < 2 || e.sim.Stats().SamplesAccepted != 1 {
			t.Fatalf("%d attempts, %d futures: want the attempt retried after the 200 ms loop", res.Attempts, e.sim.Stats().SamplesAccepted)
		}
	})
	// §7.2: a failed future keeps its category and is not retried.
	for _, cat := range []tinker.Category{tinker.CategoryServer, tinker.CategoryUnknown} {
		t.Run("failed future "+string(cat), func(t *testing.T) {
			t.Parallel()
			_, err, e := sampleThrough(t, tinkersim.Fault{Kind: tinkersim.FaultFailed, Category: string(cat)}, nil)
			var rf *tinker.RequestFailedError
			if !errors.As(err, &rf) || rf.Category != cat || tinker.IsRetryable(err) || e.sim.Stats().SamplesAccepted != 1 {
				t.Fatalf("err %v, %d futures: want a %s RequestFailedError, not retried", err, e.sim.Stats().SamplesAccepted, cat)
			}
		})
	}
	// §6.3: a future that never completes ends at the no-progress timeout, not retried.
	t.Run("never complete", func(t *testing.T) {
		t.Parallel()
		start := time.Now()
		_, err, e := sampleThrough(t, tinkersim.Fault{Kind: tinkersim.FaultNeverComplete},
			func(c *tinker.Config) { c.Timing.ProgressTimeout = 500 * time.Millisecond })
		if !errors.Is(err, tinker.ErrProgressTimeout) || tinker.IsRetryable(err) || e.sim.Stats().SamplesAccepted != 1 {
			t.Fatalf("err %v, %d futures: want ErrProgressTimeout on the one future", err, e.sim.Stats().SamplesAccepted)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("the stuck sample ended after %s", took)
		}
	})
	// §1.3, §4.2: a poll that outlives its own timeout is polled again after a backoff.
	t.Run("poll timeout", func(t *testing.T) {
		t.Parallel()
		e := newSimEnv(t, tinkersim.Config{LongPollWait: 2 * time.Second, BaseLatency: 600 * time.Millisecond},
			func(c *tinker.Config) { c.Timing.PollTimeout = 200 * time.Millisecond })
		s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
		res, err := s.Sample(e.ctx, simRequest(22))
		if err != nil {
			t.Fatal(err)
		}
		if res.Attempts != 1 || e.sim.Stats().SamplesAccepted != 1 {
			t.Fatalf("%d attempts, %d futures", res.Attempts, e.sim.Stats().SamplesAccepted)
		}
		var timeouts int
		for _, ev := range e.eventsOf(tinker.EventRetry) {
			var ce *tinker.ConnectionError
			if ev.Layer == tinker.LayerPoll && errors.As(ev.Err, &ce) && ce.Timeout {
				timeouts++
			}
		}
		if timeouts == 0 {
			t.Fatal("no poll timed out")
		}
	})
}

// TestSimHeartbeatTimeout: a heartbeat the service does not answer within its own timeout
// (§1.3, §3.4: 10 s, no retries) fails as a timeout and the next one goes out on schedule;
// sampling goes on meanwhile.
func TestSimHeartbeatTimeout(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{Faults: []tinkersim.Fault{{Kind: tinkersim.FaultSlowHeartbeat, Delay: 2 * time.Second}}},
		func(c *tinker.Config) {
			c.Timing.HeartbeatInterval = 50 * time.Millisecond
			c.Timing.HeartbeatTimeout = 100 * time.Millisecond
		})
	s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if _, err := s.Sample(e.ctx, simRequest(23)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(e.eventsOf(tinker.EventHeartbeatFailed)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("heartbeat failures %v", e.eventsOf(tinker.EventHeartbeatFailed))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, ev := range e.eventsOf(tinker.EventHeartbeatFailed) {
		var ce *tinker.ConnectionError
		if !errors.As(ev.Err, &ce) || !ce.Timeout {
			t.Fatalf("heartbeat failure %v, want its own timeout", ev.Err)
		}
	}
	for _, ev := range e.eventsOf(tinker.EventRetry) {
		if ev.Endpoint == "session_heartbeat" {
			t.Fatalf("a heartbeat was retried: %+v", ev)
		}
	}
}

// TestPollServerErrorsBackOff: §4.2 polls again at once after a 5xx, which against a proxy
// that answers 503 at once for an outage is a request storm: about 19,000 polls a second
// for one sample on loopback. The first 5xx in a row is still polled again at once; those
// after it wait 10 ms, doubling up to 1 s (§11.6's floor for servers that do not long-poll).
func TestPollServerErrorsBackOff(t *testing.T) {
	t.Parallel()
	res, err, e := sampleThrough(t, tinkersim.Fault{Kind: tinkersim.FaultServerError, Status: 503,
		Endpoints: []string{"retrieve_future"}, Duration: 500 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkSequences(t, res.Response, 1, 16)
	// 0, 10, 20, 40, 80, 160 and 320 ms: seven polls fit in 500 ms, eight with the one after.
	if n := e.sim.Stats().Requests["retrieve_future"][503]; res.Attempts != 1 || n < 2 || n > 10 {
		t.Fatalf("%d attempts, %d polls answered 503 in a 500 ms outage: want one attempt and 2-10 polls", res.Attempts, n)
	}
}

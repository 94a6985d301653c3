package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

// The workers of the 429-window runs: windowConcurrency job slots each, against samples that
// take windowBaseLatency plus windowTokenLatency per generated token (1 to benchMaxTokens,
// uniformly): 112-300 ms. With one fixed latency the samples moved in lockstep waves, and a
// run's count hung on the size of the first wave after the window opened (8 to 32 calls
// together, about 125 ms in, under either backoff), not on the backoff.
const (
	windowBaseLatency  = 100 * time.Millisecond
	windowTokenLatency = 12500 * time.Microsecond
	// windowLatency is the mean sample latency (about 206 ms), which sizes a run's jobs.
	windowLatency     = windowBaseLatency + windowTokenLatency*(benchMaxTokens+1)/2
	windowConcurrency = 32
	windowWarmup      = 500 * time.Millisecond
	// oneWorkerWindows is how many runs the rows of one worker (alone, the baseline, and as a
	// fleet of one) are the median of.
	oneWorkerWindows = 3
)

// runFleet is comparison 3: how fast a backoff reaches every worker, and how many asample
// calls reach the service during a 429 window with the fleet backoff and with local ones.
func runFleet(ctx context.Context, s settings, log io.Writer) (*table, error) {
	t := &table{ID: 3, Title: "fleet backoff: propagation and 429 window"}
	for _, n := range []int{2, 4} {
		fmt.Fprintf(log, "bench:   propagation, %d fleets\n", n)
		fl, raw, err := propagation(ctx, n, s.PropagationTrials)
		if err != nil {
			return t, fmt.Errorf("propagation, %d fleets: %w", n, err)
		}
		for _, q := range []struct {
			name string
			p    float64
		}{{"p50", 0.50}, {"p99", 0.99}} {
			m, b := quantile(fl, q.p), quantile(raw, q.p)
			t.add(row{Case: fmt.Sprintf("propagation %s, Signal on 1 -> all %d others moved", q.name, n-1),
				Measured: fmt.Sprintf("%.2f ms", ms(m)), Baseline: fmt.Sprintf("%.2f ms raw NATS fan-out", ms(b)),
				Ratio: ratio(float64(m), float64(b)), Verdict: verdictInfo})
		}
	}

	type wcase struct {
		n     int
		local bool
	}
	cases := []wcase{{1, true}, {1, false}, {2, false}, {4, false}, {2, true}, {4, true}}
	tokens := tokenizer.NewRegistry(tokenizer.Options{Offline: true}) // loaded once, not per run
	var alone int64
	for _, c := range cases {
		mode := "fleet"
		if c.local {
			mode = "local"
		}
		// One worker's rows are medians of oneWorkerWindows runs. With one fixed latency a run's
		// count moved with where the window fell among the samples' waves (5 to 64 calls alone,
		// 2 to 33 as a fleet of one, in quick runs), and two like rows were a coin toss. Varied
		// latencies took the waves away; the counts are steadier but small (2 to 14 alone in
		// quick runs), so the baseline and its like stay medians.
		runs := 1
		if c.n == 1 {
			runs = oneWorkerWindows
		}
		var counts []float64
		for range runs {
			fmt.Fprintf(log, "bench:   429 window, %d workers, %s backoff\n", c.n, mode)
			calls, err := windowCalls(ctx, c.n, c.local, s.Window, tokens)
			if err != nil {
				return t, fmt.Errorf("429 window, %d workers, %s: %w", c.n, mode, err)
			}
			counts = append(counts, float64(calls))
		}
		calls := int64(medianOf(counts))
		r := row{Measured: fmt.Sprintf("%d calls", calls)}
		of := ""
		if runs > 1 {
			of = fmt.Sprintf(", median of %v", counts)
		}
		switch {
		case c.n == 1 && c.local:
			alone = calls
			r.Case = fmt.Sprintf("asample calls in the 429 window: 1 worker alone (baseline%s)", of)
			r.Baseline, r.Ratio, r.Verdict = fmt.Sprintf("%d calls", alone), 1, verdictInfo
		case c.local:
			r.Case = fmt.Sprintf("asample calls in the 429 window: %d workers, each backing off alone", c.n)
			r.Baseline, r.Ratio, r.Verdict = fmt.Sprintf("%d calls", alone), ratio(float64(calls), float64(alone)), verdictInfo
		default:
			r.Case = fmt.Sprintf("asample calls in the 429 window: %d workers, fleet backoff%s", c.n, of)
			r.Baseline, r.Ratio = fmt.Sprintf("%d calls", alone), ratio(float64(calls), float64(alone))
			r.Aim, r.Verdict = atMost(r.Ratio, 1.10)
		}
		t.add(r)
	}
	t.note("propagation: N backoff.Fleet on separate connections to one embedded server; time from Signal's call to the last other fleet's OnChange with the new deadline; %d signals", s.PropagationTrials)
	t.note("raw NATS fan-out: one core publish to N-1 subscribers on separate connections, time until the last received it (the floor)")
	t.note("429 window: %s injected on asample after %s of steady state; workers x %d slots, simulator latency %s + %s per token (%s-%s); calls counted by the simulator inside the window",
		s.Window, windowWarmup, windowConcurrency, windowBaseLatency, windowTokenLatency,
		windowBaseLatency+windowTokenLatency, windowBaseLatency+windowTokenLatency*benchMaxTokens)
	t.note("aim: the fleet sends no more than one worker alone would (ratio <= 1, with 10 %% allowed for noise)")
	return t, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(0, int(math.Ceil(q*float64(len(s))))-1)] // nearest rank
}

// The pause of propagation's first signal, and how much longer each next one is.
const (
	propagationFirst = time.Minute
	propagationStep  = time.Second
)

// propagation signals on one of n fleets trials times and times how long until all the others
// hold the new deadline; it does the same with a raw core NATS fan-out.
func propagation(ctx context.Context, n, trials int) (fleet, raw []time.Duration, err error) {
	r, err := newRig(ctx, rigConfig{})
	if err != nil {
		return nil, nil, err
	}
	defer r.close()
	conn := func(name string) (*nats.Conn, jetstream.JetStream, error) {
		q, err := r.connect(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		return q.JS.Conn(), q.JS, nil
	}

	// The fleets: 0 signals, the others record when they learn a new deadline, and which. (The
	// deadline a fleet holds moves before its OnChange runs: waiting on it, and then reading
	// the time recorded, read the previous signal's now and then.)
	type learned struct {
		at, until time.Time
	}
	seen := make([]atomic.Pointer[learned], n)
	wake := make([]chan struct{}, n)
	fs := make([]*backoff.Fleet, n)
	defer func() {
		for _, f := range fs {
			if f != nil {
				_ = f.Close()
			}
		}
	}()
	for i := range n {
		wake[i] = make(chan struct{}, 1)
		_, js, err := conn(fmt.Sprintf("bench-fleet-%d", i))
		if err != nil {
			return nil, nil, err
		}
		cfg := backoff.Config{Bucket: "bench_backoff", Account: fmt.Sprintf("bench-%d", n), Logger: slog.New(slog.DiscardHandler)}
		if i > 0 {
			cfg.OnChange = func(st backoff.State) {
				seen[i].Store(&learned{at: time.Now(), until: st.Until})
				select {
				case wake[i] <- struct{}{}:
				default:
				}
			}
		}
		if fs[i], err = backoff.Open(ctx, js, cfg); err != nil {
			return nil, nil, err
		}
	}
	// Each signal is propagationStep longer than the last, so it always extends the deadline,
	// by far more than any clock-offset bound and than Signal's slack (a deadline within 250
	// ms of the new one is kept, unwritten); and none is longer than backoff.MaxPause, at which
	// Signal cuts it: signals of an hour and more all came out at one hour, the later ones
	// wrote nothing, and each trial read the previous signal's arrival (times of zero or less).
	if last := propagationFirst + time.Duration(trials-1)*propagationStep; last > backoff.MaxPause {
		return nil, nil, fmt.Errorf("%d signals would reach %s, longer than backoff.MaxPause (%s): at most %d",
			trials, last, backoff.MaxPause, int((backoff.MaxPause-propagationFirst)/propagationStep)+1)
	}
	for k := range trials {
		d := propagationFirst + time.Duration(k)*propagationStep
		t0 := time.Now()
		if err := fs[0].Signal(ctx, "bench", d); err != nil {
			return nil, nil, err
		}
		target := fs[0].Until().Add(-500 * time.Millisecond)
		var last time.Time
		for i := 1; i < n; i++ {
			for {
				l := seen[i].Load()
				if l != nil && !l.until.Before(target) {
					if l.at.After(last) {
						last = l.at
					}
					break
				}
				select {
				case <-wake[i]:
				case <-time.After(10 * time.Second):
					return nil, nil, fmt.Errorf("fleet %d did not learn signal %d", i, k)
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
		}
		fleet = append(fleet, last.Sub(t0))
	}

	// Raw fan-out on core NATS.
	pub, _, err := conn("bench-raw-pub")
	if err != nil {
		return nil, nil, err
	}
	got := make(chan time.Time, n*trials)
	for i := 1; i < n; i++ {
		sub, _, err := conn(fmt.Sprintf("bench-raw-sub-%d", i))
		if err != nil {
			return nil, nil, err
		}
		if _, err := sub.Subscribe("bench.fanout", func(*nats.Msg) { got <- time.Now() }); err != nil {
			return nil, nil, fmt.Errorf("subscribe: %w", err)
		}
		if err := sub.Flush(); err != nil {
			return nil, nil, fmt.Errorf("flush: %w", err)
		}
	}
	for range trials {
		t0 := time.Now()
		if err := pub.Publish("bench.fanout", []byte("x")); err != nil {
			return nil, nil, fmt.Errorf("publish: %w", err)
		}
		var last time.Time
		for i := 1; i < n; i++ {
			select {
			case at := <-got:
				if at.After(last) {
					last = at
				}
			case <-time.After(10 * time.Second):
				return nil, nil, fmt.Errorf("raw fan-out lost a message")
			}
		}
		raw = append(raw, last.Sub(t0))
	}
	return fleet, raw, nil
}

// windowCalls runs n workers to steady state, injects a 429 window on asample and returns
// the asample calls the simulator saw inside it.
func windowCalls(ctx context.Context, n int, local bool, window time.Duration, tokens *tokenizer.Registry) (int64, error) {
	r, err := newRig(ctx, rigConfig{
		Sim:    &tinkersim.Config{Capacity: 100_000, BaseLatency: windowBaseLatency, PerTokenLatency: windowTokenLatency},
		Queue:  queue.Config{MaxAckPending: n*windowConcurrency + 1000},
		Tokens: tokens,
	})
	if err != nil {
		return 0, err
	}
	defer r.close()
	pub, err := r.connect(ctx, "bench-publisher")
	if err != nil {
		return 0, err
	}
	perWorker := float64(windowConcurrency) / windowLatency.Seconds()
	need := int(perWorker*float64(n)*(windowWarmup+window+time.Second).Seconds()) + 500
	if err := publishJobs(ctx, pub, "win", 0, need, benchMaxTokens); err != nil {
		return 0, err
	}
	ws, err := r.openWorkers(ctx, n, windowConcurrency, local)
	if err != nil {
		return 0, err
	}
	run := start(ctx, ws)
	err = waitFor(ctx, 60*time.Second, "the first completed sample", func() bool { return r.sim.Stats().SamplesCompleted > 0 })
	if err == nil {
		err = sleepCtx(ctx, windowWarmup)
	}
	if err == nil {
		_, err = r.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultRateLimit, Duration: window})
	}
	if err == nil {
		err = sleepCtx(ctx, window+300*time.Millisecond)
	}
	st := r.sim.Stats()
	if serr := run.stop(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return 0, err
	}
	if len(st.Windows) != 1 {
		return 0, fmt.Errorf("simulator reports %d windows, want 1", len(st.Windows))
	}
	return st.Windows[0].AsampleCalls, nil
}

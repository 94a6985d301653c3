package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// Sizes of comparison 5: samples held long enough that 400 are in flight at once.
const (
	memLatency     = 2 * time.Second
	memConcurrency = 400
	memSmall       = 1000
)

// memResult is one child worker's memory under a backlog.
type memResult struct {
	hwm, rss     int64 // kB
	peakInFlight int
	backlog      uint64 // jobs waiting in the stream when measured
}

// runMemory is comparison 5: the worker's peak RSS with a big backlog against a small one.
func runMemory(ctx context.Context, s settings, log io.Writer) (*table, error) {
	t := &table{ID: 5, Title: "worker peak RSS: big backlog vs small"}
	fmt.Fprintf(log, "bench:   backlog %d\n", memSmall)
	small, err := measureMemory(ctx, s.ChildProfile, memSmall, s.MemHold)
	if err != nil {
		return t, fmt.Errorf("backlog %d: %w", memSmall, err)
	}
	fmt.Fprintf(log, "bench:   backlog %d\n", s.MemBacklog)
	big, err := measureMemory(ctx, s.ChildProfile, s.MemBacklog, s.MemHold)
	if err != nil {
		return t, fmt.Errorf("backlog %d: %w", s.MemBacklog, err)
	}
	r := ratio(float64(big.hwm), float64(small.hwm))
	aim, v := atMost(r, 1.10)
	t.add(row{Case: fmt.Sprintf("VmHWM, %d jobs waiting vs %d", s.MemBacklog, memSmall),
		Measured: fmt.Sprintf("%.1f MiB", float64(big.hwm)/1024), Baseline: fmt.Sprintf("%.1f MiB", float64(small.hwm)/1024),
		Ratio: r, Aim: aim, Verdict: v})
	t.add(row{Case: "VmRSS at the end of the hold",
		Measured: fmt.Sprintf("%.1f MiB", float64(big.rss)/1024), Baseline: fmt.Sprintf("%.1f MiB", float64(small.rss)/1024),
		Ratio: ratio(float64(big.rss), float64(small.rss)), Verdict: verdictInfo})
	t.add(row{Case: "samples in flight at the simulator (peak)",
		Measured: strconv.Itoa(big.peakInFlight), Baseline: strconv.Itoa(small.peakInFlight),
		Ratio: ratio(float64(big.peakInFlight), float64(small.peakInFlight)), Verdict: verdictInfo})
	t.note("the worker runs alone in a child process (this program re-executed), %d job slots, connected to the embedded server of this process; VmHWM/VmRSS from /proc/<pid>/status", memConcurrency)
	t.note("simulator latency %s so that %d samples are in flight; measured after %s of hold; jobs waiting at that moment: %d vs %d",
		memLatency, memConcurrency, s.MemHold, big.backlog, small.backlog)
	t.note("aim: no growth with the backlog (ratio <= 1.10 leaves 10 %% for GC timing noise)")
	return t, nil
}

// measureMemory fills the stream with backlog jobs (plus what the hold consumes), runs a child
// worker until 400 samples are in flight and the hold has passed, and reads its memory. A
// profile prefix has the worker profile itself (bench -cpuprofile).
func measureMemory(ctx context.Context, profile string, backlog int, hold time.Duration) (memResult, error) {
	r, err := newRig(ctx, rigConfig{
		Sim:   &tinkersim.Config{Capacity: 10_000, BaseLatency: memLatency},
		Queue: queue.Config{MaxAckPending: 1000},
	})
	if err != nil {
		return memResult{}, err
	}
	defer r.close()
	q, err := r.connect(ctx, "bench-publisher")
	if err != nil {
		return memResult{}, err
	}
	// The hold consumes about slots x (hold/latency + 1) jobs; publish those on top.
	extra := memConcurrency * (int(hold/memLatency) + 2)
	if err := publishJobs(ctx, q, "mem", 0, backlog+extra, benchMaxTokens); err != nil {
		return memResult{}, err
	}
	w, err := startChild(ctx, profile, "-role", "worker", "-nats", r.natsURL, "-sim", r.simURL,
		"-concurrency", strconv.Itoa(memConcurrency), "-max-ack-pending", "1000")
	if err != nil {
		return memResult{}, err
	}
	defer func() { _ = w.stop() }()
	err = waitFor(ctx, 60*time.Second, "samples in flight", func() bool {
		return r.sim.Stats().Concurrent >= memConcurrency*9/10
	})
	if err == nil {
		err = sleepCtx(ctx, hold)
	}
	if err != nil {
		return memResult{}, err
	}
	st, err := procStatus(w.cmd.Process.Pid, "VmHWM", "VmRSS")
	if err != nil {
		return memResult{}, err
	}
	info, err := q.Jobs.Info(ctx)
	if err != nil {
		return memResult{}, fmt.Errorf("stream info: %w", err)
	}
	if err := w.stop(); err != nil {
		return memResult{}, fmt.Errorf("child worker: %w", err)
	}
	return memResult{hwm: st["VmHWM"], rss: st["VmRSS"], peakInFlight: r.sim.Stats().PeakConcurrent,
		backlog: info.State.Msgs - uint64(min(info.State.Msgs, memConcurrency))}, nil
}

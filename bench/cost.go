package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// costConcurrency is the samples in flight in both halves of comparison 2.
const costConcurrency = 64

// usage is a snapshot of this process's CPU time and allocations.
type usage struct {
	cpu      time.Duration
	bytes    uint64
	allocs   uint64
	syscalls uint64 // read and write system calls (/proc/self/io), sockets included
}

func snapshot() usage {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return usage{cpu: cpuTime(), bytes: ms.TotalAlloc, allocs: ms.Mallocs, syscalls: readWriteSyscalls()}
}

// readWriteSyscalls is this process's count of read and write system calls so far (syscr +
// syscw of /proc/self/io); 0 where that file does not exist.
func readWriteSyscalls() uint64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	var n uint64
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if ok && (k == "syscr" || k == "syscw") {
			c, _ := strconv.ParseUint(v, 10, 64)
			n += c
		}
	}
	return n
}

// perSample is the cost of one sample over a measured stretch.
type perSample struct {
	cpu    time.Duration
	bytes  float64
	allocs float64
	// syscalls is read and write system calls per sample.
	syscalls float64
	n        int64
	simCPU   time.Duration // the simulator child's CPU per sample (not in cpu)

	fetches, pulled float64 // the worker's pull requests and jobs pulled, whole run
}

// cheaper keeps, figure by figure, the lower of two measurements of the same variant.
func (p perSample) cheaper(q perSample) perSample {
	return perSample{
		cpu:      min(p.cpu, q.cpu),
		bytes:    min(p.bytes, q.bytes),
		allocs:   min(p.allocs, q.allocs),
		syscalls: min(p.syscalls, q.syscalls),
		n:        p.n + q.n,
		simCPU:   min(p.simCPU, q.simCPU),
		fetches:  p.fetches + q.fetches,
		pulled:   p.pulled + q.pulled,
	}
}

func (a usage) per(b usage, n int64) perSample {
	return perSample{
		cpu:      (b.cpu - a.cpu) / time.Duration(n),
		bytes:    float64(b.bytes-a.bytes) / float64(n),
		allocs:   float64(b.allocs-a.allocs) / float64(n),
		syscalls: float64(b.syscalls-a.syscalls) / float64(n),
		n:        n,
	}
}

// runCost is comparison 2: CPU and allocation per sample in the worker (end to end through
// JetStream) against the Tinker client alone doing the same samples.
func runCost(ctx context.Context, s settings, log io.Writer) (*table, error) {
	t := &table{ID: 2, Title: "per-sample cost: worker vs Tinker client alone"}
	sim, err := startChild(ctx, "-role", "sim")
	if err != nil {
		return t, err
	}
	defer func() { _ = sim.stop() }()
	simURL := sim.first

	nats, err := startChild(ctx, "-role", "nats")
	if err != nil {
		return t, err
	}
	defer func() { _ = nats.stop() }()

	// The cores are shared with other work: each variant runs CostRounds times, alternated,
	// and keeps its cheapest round.
	var base, meas, alone perSample
	var natsPer time.Duration
	for k := range max(s.CostRounds, 1) {
		fmt.Fprintf(log, "bench:   round %d: client alone\n", k+1)
		b, err := clientCost(ctx, simURL, sim.cmd.Process.Pid, s.CostWarmup, s.CostSamples)
		if err != nil {
			return t, fmt.Errorf("client alone: %w", err)
		}
		fmt.Fprintf(log, "bench:   round %d: worker\n", k+1)
		m, err := workerCost(ctx, "", simURL, fmt.Sprintf("cost-%d", k), sim.cmd.Process.Pid, s.CostWarmup, s.CostSamples)
		if err != nil {
			return t, fmt.Errorf("worker: %w", err)
		}
		fmt.Fprintf(log, "bench:   round %d: worker, NATS server in a child process\n", k+1)
		natsBefore, _ := procCPU(nats.cmd.Process.Pid)
		a, err := workerCost(ctx, nats.first, simURL, fmt.Sprintf("cost-%d", k), sim.cmd.Process.Pid, s.CostWarmup, s.CostSamples)
		if err != nil {
			return t, fmt.Errorf("worker, external NATS: %w", err)
		}
		natsAfter, _ := procCPU(nats.cmd.Process.Pid)
		np := (natsAfter - natsBefore) / time.Duration(s.CostWarmup+s.CostSamples)
		if k == 0 {
			base, meas, alone, natsPer = b, m, a, np
			continue
		}
		base, meas, alone, natsPer = base.cheaper(b), meas.cheaper(m), alone.cheaper(a), min(natsPer, np)
	}

	r := ratio(float64(meas.cpu), float64(base.cpu))
	aim, v := atMost(r, 1.25)
	t.add(row{Case: "CPU per sample (user+sys, getrusage)", Measured: fmt.Sprintf("%.0f µs", us(meas.cpu)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.cpu)), Ratio: r, Aim: aim, Verdict: v})
	r = ratio(meas.bytes, base.bytes)
	aim, v = atMost(r, 1.25)
	t.add(row{Case: "bytes allocated per sample (MemStats.TotalAlloc)", Measured: fmt.Sprintf("%.1f KiB", meas.bytes/1024),
		Baseline: fmt.Sprintf("%.1f KiB", base.bytes/1024), Ratio: r, Aim: aim, Verdict: v})
	t.add(row{Case: "allocations per sample (MemStats.Mallocs)", Measured: fmt.Sprintf("%.0f", meas.allocs),
		Baseline: fmt.Sprintf("%.0f", base.allocs), Ratio: ratio(meas.allocs, base.allocs), Verdict: verdictInfo})
	t.add(row{Case: "CPU per sample, worker alone (NATS server in a child process)", Measured: fmt.Sprintf("%.0f µs", us(alone.cpu)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.cpu)), Ratio: ratio(float64(alone.cpu), float64(base.cpu)), Verdict: verdictInfo})
	t.add(row{Case: "bytes allocated per sample, worker alone", Measured: fmt.Sprintf("%.1f KiB", alone.bytes/1024),
		Baseline: fmt.Sprintf("%.1f KiB", base.bytes/1024), Ratio: ratio(alone.bytes, base.bytes), Verdict: verdictInfo})
	t.add(row{Case: "NATS server CPU per sample (that child, whole run incl. publishing)", Measured: fmt.Sprintf("%.0f µs", us(natsPer)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.cpu)), Ratio: ratio(float64(natsPer), float64(base.cpu)), Verdict: verdictInfo})
	t.add(row{Case: "simulator CPU per sample (child process, not counted above)", Measured: fmt.Sprintf("%.0f µs", us(meas.simCPU)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.simCPU)), Ratio: ratio(float64(meas.simCPU), float64(base.simCPU)), Verdict: verdictInfo})
	t.add(row{Case: "read+write system calls per sample, worker alone", Measured: fmt.Sprintf("%.1f", alone.syscalls),
		Baseline: fmt.Sprintf("%.1f", base.syscalls), Ratio: ratio(alone.syscalls, base.syscalls), Verdict: verdictInfo})
	t.add(row{Case: "jobs per pull request (worker, all rounds)", Measured: fmt.Sprintf("%.2f", alone.pulled/max(alone.fetches, 1)),
		Baseline: "-", Ratio: math.NaN(), Verdict: verdictInfo})
	t.note("measured: 1 worker, %d job slots: dequeue, decode+validate, result lookup, tokenize, dispatch, asample, poll, decode, publish result, ack", costConcurrency)
	t.note("baseline: tinker.Dial + Sampler.Sample in %d goroutines: tokenize the same prompts, asample, poll, decode text", costConcurrency)
	t.note("the simulator (zero latency) runs in a child process, so neither figure includes it: nothing to subtract")
	t.note("the worker figure includes the embedded NATS server (same process): the queue's cost is the client's and the server's")
	t.note("%d samples measured after %d warm-up samples, per side; simulator CPU from /proc/<pid>/stat (10 ms ticks)", s.CostSamples, s.CostWarmup)
	t.note("best of %d alternated rounds per variant and figure (shared cores)", max(s.CostRounds, 1))
	return t, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// clientCost samples warmup+n jobs' prompts with the client alone and measures the last n.
func clientCost(ctx context.Context, simURL string, simPID, warmup, n int) (perSample, error) {
	c, err := tinker.Dial(ctx, tinker.Config{BaseURL: simURL, APIKey: benchKey})
	if err != nil {
		return perSample{}, err
	}
	defer c.Close()
	sampler, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: benchModel})
	if err != nil {
		return perSample{}, err
	}
	tok, err := newTokenizer(ctx)
	if err != nil {
		return perSample{}, err
	}
	var (
		next, done atomic.Int64
		first      error
		mu         sync.Mutex
		wg         sync.WaitGroup
		mark       = make(chan struct{})
		before     usage
		simBefore  time.Duration
	)
	warmup = max(warmup, 1)
	total := int64(warmup + n)
	for range costConcurrency {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				j := benchJob(int(i))
				mt := *j.Params.MaxTokens
				res, err := sampler.Sample(ctx, tinker.SampleRequest{
					Prompt: tinker.EncodedText(tok.Encode(j.Prompt)), NumSamples: 1,
					Params: tinker.SamplingParams{MaxTokens: &mt},
				})
				if err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
				for _, seq := range res.Response.Sequences {
					_ = tok.Decode(seq.Tokens)
				}
				if done.Add(1) == int64(warmup) {
					simBefore, _ = procCPU(simPID)
					before = snapshot()
					close(mark)
				}
			}
		})
	}
	wg.Wait()
	after := snapshot()
	simAfter, _ := procCPU(simPID)
	if first != nil {
		return perSample{}, first
	}
	<-mark
	p := before.per(after, done.Load()-int64(warmup))
	p.simCPU = (simAfter - simBefore) / time.Duration(p.n)
	return p, nil
}

// workerCost runs warmup+n jobs through one worker and measures the stretch between warmup
// and warmup+n results stored.
// batch names the jobs: rounds on one server (the child process) each need their own.
func workerCost(ctx context.Context, natsURL, simURL, batch string, simPID, warmup, n int) (perSample, error) {
	r, err := newRig(ctx, rigConfig{NatsURL: natsURL, SimURL: simURL, Queue: queue.Config{MaxAckPending: 2000}})
	if err != nil {
		return perSample{}, err
	}
	defer r.close()
	q, err := r.connect(ctx, "bench-publisher")
	if err != nil {
		return perSample{}, err
	}
	stored := func() int64 {
		info, err := q.Results.Info(ctx)
		if err != nil {
			return -1
		}
		return int64(info.State.Msgs)
	}
	// Results of earlier rounds on the same server count from here.
	earlier := stored()
	if earlier < 0 {
		return perSample{}, errors.New("results stream info")
	}
	warmup += int(earlier)
	if err := publishJobs(ctx, q, batch, 0, warmup+n-int(earlier)); err != nil {
		return perSample{}, err
	}
	reg := prometheus.NewRegistry()
	r.registry = reg
	w, err := r.openWorker(ctx, "bench-worker", costConcurrency, false)
	if err != nil {
		return perSample{}, err
	}
	run := start(ctx, []*worker.Worker{w})
	var before usage
	var simBefore time.Duration
	var k0 int64
	err = waitFor(ctx, 5*time.Minute, "the warm-up results", func() bool { k0 = stored(); return k0 >= int64(warmup) })
	if err == nil {
		simBefore, _ = procCPU(simPID)
		before = snapshot()
		err = waitFor(ctx, 10*time.Minute, "the measured results", func() bool { return stored() >= int64(warmup+n) })
	}
	after := snapshot()
	simAfter, _ := procCPU(simPID)
	k1 := stored()
	if serr := run.stop(); err == nil && serr != nil {
		err = serr
	}
	if err != nil {
		return perSample{}, err
	}
	p := before.per(after, k1-k0)
	p.simCPU = (simAfter - simBefore) / time.Duration(p.n)
	p.fetches = counterSum(reg, "tinkerfleet_fetches_total")
	p.pulled = counterSum(reg, "tinkerfleet_jobs_pulled_total")
	return p, nil
}

// counterSum is the total of a counter (over its labels) in reg; 0 when absent.
func counterSum(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// costLatency is the sample latency of comparison 2's rows "with latency".
const costLatency = 20 * time.Millisecond

// costConcurrency is the samples in flight in both halves of comparison 2.
const costConcurrency = 64

// usage is a snapshot of this process's CPU time and allocations.
type usage struct {
	cpu      time.Duration
	bytes    uint64
	allocs   uint64
	syscalls uint64        // read and write system calls (/proc/self/io), sockets included
	switches uint64        // context switches of the process's threads, voluntary and involuntary
	sys      time.Duration // the part of cpu spent in the kernel
}

func snapshot() usage {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	u := usage{cpu: cpuTime(), bytes: ms.TotalAlloc, allocs: ms.Mallocs, syscalls: readWriteSyscalls()}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		u.switches = uint64(ru.Nvcsw + ru.Nivcsw)
		u.sys = time.Duration(ru.Stime.Nano())
	}
	return u
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
	// switches is context switches per sample: a thread that parks for want of work (a
	// goroutine hand-off to a sleeping thread, a wait on the network) switches out.
	switches float64
	sys      time.Duration // the part of cpu spent in the kernel
	n        int64
	simCPU   time.Duration // the simulator child's CPU per sample (not in cpu)
	// calls is HTTP requests the simulator answered per sample, by endpoint.
	calls map[string]float64

	fetches, pulled float64 // the worker's pull requests and jobs pulled, whole run
}

// cheaper keeps, figure by figure, the lower of two measurements of the same variant.
func (p perSample) cheaper(q perSample) perSample {
	return perSample{
		cpu:      min(p.cpu, q.cpu),
		bytes:    min(p.bytes, q.bytes),
		allocs:   min(p.allocs, q.allocs),
		syscalls: min(p.syscalls, q.syscalls),
		switches: min(p.switches, q.switches),
		sys:      min(p.sys, q.sys),
		n:        p.n + q.n,
		simCPU:   min(p.simCPU, q.simCPU),
		calls:    p.calls, // the same in every round: one asample and one poll per sample
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
		switches: float64(b.switches-a.switches) / float64(n),
		sys:      (b.sys - a.sys) / time.Duration(n),
		n:        n,
	}
}

// simTarget is a simulator child the samples go to.
type simTarget struct {
	url   string
	pid   int
	roots *x509.CertPool // non-nil: HTTPS with HTTP/2, trusting these roots
}

// runCost is comparison 2: CPU and allocation per sample in the worker (end to end through
// JetStream) against the Tinker client alone doing the same samples, over cleartext HTTP/1.1
// (the simulator's default), and over HTTPS with HTTP/2 with samples that take costLatency
// (as against the real service, §1.4).
func runCost(ctx context.Context, s settings, log io.Writer) (*table, error) {
	t := &table{ID: 2, Title: "per-sample cost: worker vs Tinker client alone"}
	dir, err := os.MkdirTemp("", "tinkerfleet-bench-cost-*")
	if err != nil {
		return t, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	sim, err := startChild(ctx, s.ChildProfile, "-role", "sim")
	if err != nil {
		return t, err
	}
	defer func() { _ = sim.stop() }()
	plain := simTarget{url: sim.first, pid: sim.cmd.Process.Pid}
	slowSim, err := startChild(ctx, s.ChildProfile, "-role", "sim", "-latency", costLatency.String())
	if err != nil {
		return t, err
	}
	defer func() { _ = slowSim.stop() }()
	slow := simTarget{url: slowSim.first, pid: slowSim.cmd.Process.Pid}
	tlsSim, roots, err := startTLSSim(ctx, s.ChildProfile, dir, "-latency", costLatency.String())
	if err != nil {
		return t, err
	}
	defer func() { _ = tlsSim.stop() }()
	secure := simTarget{url: tlsSim.first, pid: tlsSim.cmd.Process.Pid, roots: roots}
	nats, err := startChild(ctx, s.ChildProfile, "-role", "nats")
	if err != nil {
		return t, err
	}
	defer func() { _ = nats.stop() }()

	// One tokenizer for every variant: loading one takes about half a CPU-second.
	tokens := tokenizer.NewRegistry(tokenizer.Options{Offline: true})
	plan := costPlan{warmup: s.CostWarmup, n: s.CostSamples, maxTokens: s.CostMaxTokens}
	// The variants, in the order they run in each round.
	const (
		vClient = iota
		vWorker
		vEmbedded
		vFloor
		vClientTLS
		vWorkerTLS
		vClientSlow
		vWorkerSlow
	)
	var natsPer time.Duration
	variants := []struct {
		name  string
		label string // pprof label "variant" (-cpuprofile; pprof -tagfocus=variant=LABEL)
		run   func(round int) (perSample, error)
	}{
		// The worker process comes right after the client alone: the two figures of one
		// round are measured as close together as they can be, and make the aim's ratio.
		{"client alone", "client", func(int) (perSample, error) { return clientCost(ctx, plain, tokens, plan) }},
		{"worker, NATS server in a child process", "worker", func(k int) (perSample, error) {
			natsBefore, _ := procCPU(nats.cmd.Process.Pid)
			p, err := workerCost(ctx, nats.first, plain, tokens, fmt.Sprintf("cost-%d", k), plan)
			natsAfter, _ := procCPU(nats.cmd.Process.Pid)
			np := (natsAfter - natsBefore) / time.Duration(plan.warmup+plan.n)
			if k == 0 || np < natsPer {
				natsPer = np
			}
			return p, err
		}},
		{"worker + embedded NATS server", "worker-embedded", func(k int) (perSample, error) {
			return workerCost(ctx, "", plain, tokens, fmt.Sprintf("cost-embedded-%d", k), plan)
		}},
		{"JetStream floor", "floor", func(k int) (perSample, error) {
			return floorCost(ctx, nats.first, fmt.Sprintf("floor-%d", k), plan)
		}},
		{"client alone, HTTPS, samples with latency", "client-tls", func(int) (perSample, error) { return clientCost(ctx, secure, tokens, plan) }},
		{"worker, NATS server in a child process, HTTPS, samples with latency", "worker-tls", func(k int) (perSample, error) {
			return workerCost(ctx, nats.first, secure, tokens, fmt.Sprintf("cost-tls-%d", k), plan)
		}},
		{"client alone, samples with latency", "client-latency", func(int) (perSample, error) {
			return clientCost(ctx, slow, tokens, plan)
		}},
		{"worker, NATS server in a child process, samples with latency", "worker-latency", func(k int) (perSample, error) {
			return workerCost(ctx, nats.first, slow, tokens, fmt.Sprintf("cost-latency-%d", k), plan)
		}},
	}
	// The cores are shared with other work, which moves a round's figures by tens of per cent.
	// Each variant runs CostRounds times, alternated. The aim rows take the median over the
	// rounds of the worker's figure over the client's in the same round; the info rows keep
	// each variant's cheapest figures.
	rounds := make([][]perSample, len(variants))
	for k := range max(s.CostRounds, 1) {
		for i, v := range variants {
			fmt.Fprintf(log, "bench:   round %d: %s\n", k+1, v.name)
			var p perSample
			var err error
			// Labelled, so that a -cpuprofile of the run splits by variant (pprof -tagfocus).
			pprof.Do(ctx, pprof.Labels("variant", v.label), func(context.Context) { p, err = v.run(k) })
			if err != nil {
				return t, fmt.Errorf("%s: %w", v.name, err)
			}
			fmt.Fprintf(log, "bench:   round %d: %s: %.0f µs CPU (%.0f in the kernel), %.0f allocations per sample\n", k+1, v.name, us(p.cpu), us(p.sys), p.allocs)
			rounds[i] = append(rounds[i], p)
		}
	}
	best := make([]perSample, len(variants))
	for i, ps := range rounds {
		best[i] = ps[0]
		for _, p := range ps[1:] {
			best[i] = best[i].cheaper(p)
		}
	}
	base, alone, meas, floor := best[vClient], best[vWorker], best[vEmbedded], best[vFloor]
	baseTLS, aloneTLS, baseSlow, aloneSlow := best[vClientTLS], best[vWorkerTLS], best[vClientSlow], best[vWorkerSlow]
	paired := func(clients, workers []perSample, figure func(perSample) float64) (median, worker, client float64, each []float64) {
		var ws, cs []float64
		for k := range clients {
			w, c := figure(workers[k]), figure(clients[k])
			each = append(each, ratio(w, c))
			ws, cs = append(ws, w), append(cs, c)
		}
		return medianOf(each), medianOf(ws), medianOf(cs), each
	}

	// The aim is on the worker process as a fleet runs it (cmd/worker against a NATS server
	// elsewhere); the embedded server of `submit --local` works in the same process, shown below.
	r, w, c, each := paired(rounds[vClient], rounds[vWorker], func(p perSample) float64 { return float64(p.cpu) })
	aim, v := costVerdict(s.CostMaxTokens, r)
	t.add(row{Case: "CPU per sample (user+sys, getrusage), worker process", Measured: fmt.Sprintf("%.0f µs", w/1e3),
		Baseline: fmt.Sprintf("%.0f µs", c/1e3), Ratio: r, Aim: aim, Verdict: v})
	var eachText []string
	for _, x := range each {
		eachText = append(eachText, fmt.Sprintf("%.2f", x))
	}
	r, w, c, _ = paired(rounds[vClient], rounds[vWorker], func(p perSample) float64 { return p.bytes })
	aim, v = costVerdict(s.CostMaxTokens, r)
	t.add(row{Case: "bytes allocated per sample (MemStats.TotalAlloc), worker process", Measured: fmt.Sprintf("%.1f KiB", w/1024),
		Baseline: fmt.Sprintf("%.1f KiB", c/1024), Ratio: r, Aim: aim, Verdict: v})
	r, w, c, _ = paired(rounds[vClient], rounds[vWorker], func(p perSample) float64 { return p.allocs })
	t.add(row{Case: "allocations per sample (MemStats.Mallocs), worker process", Measured: fmt.Sprintf("%.0f", w),
		Baseline: fmt.Sprintf("%.0f", c), Ratio: r, Verdict: verdictInfo})
	t.add(row{Case: "CPU ratio in each round (worker process / the client alone just before it)", Measured: strings.Join(eachText, " "),
		Baseline: "-", Ratio: math.NaN(), Verdict: verdictInfo})
	r, w, c, _ = paired(rounds[vClient], rounds[vWorker], func(p perSample) float64 { return float64(p.sys) })
	t.add(row{Case: "CPU per sample in the kernel (getrusage sys), worker process, median ratio", Measured: fmt.Sprintf("%.0f µs", w/1e3),
		Baseline: fmt.Sprintf("%.0f µs", c/1e3), Ratio: r, Verdict: verdictInfo})
	t.add(row{Case: "CPU per sample, cheapest round of each side, worker process", Measured: fmt.Sprintf("%.0f µs", us(alone.cpu)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.cpu)), Ratio: ratio(float64(alone.cpu), float64(base.cpu)), Verdict: verdictInfo})
	t.add(row{Case: "CPU per sample, worker + embedded NATS server in one process (submit --local)", Measured: fmt.Sprintf("%.0f µs", us(meas.cpu)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.cpu)), Ratio: ratio(float64(meas.cpu), float64(base.cpu)), Verdict: verdictInfo})
	t.add(row{Case: "bytes allocated per sample, worker + embedded NATS server", Measured: fmt.Sprintf("%.1f KiB", meas.bytes/1024),
		Baseline: fmt.Sprintf("%.1f KiB", base.bytes/1024), Ratio: ratio(meas.bytes, base.bytes), Verdict: verdictInfo})
	t.add(row{Case: "JetStream floor: fetch + store results in groups + ack, nothing else (nats.go)", Measured: fmt.Sprintf("%.0f µs", us(floor.cpu)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.cpu)), Ratio: ratio(float64(floor.cpu), float64(base.cpu)), Verdict: verdictInfo})
	r, w, c, _ = paired(rounds[vClientTLS], rounds[vWorkerTLS], func(p perSample) float64 { return float64(p.cpu) })
	t.add(row{Case: fmt.Sprintf("CPU per sample over HTTPS + HTTP/2, %s samples (as against the real service), worker process, median ratio", costLatency), Measured: fmt.Sprintf("%.0f µs", w/1e3),
		Baseline: fmt.Sprintf("%.0f µs", c/1e3), Ratio: r, Verdict: verdictInfo})
	t.add(row{Case: fmt.Sprintf("bytes allocated per sample over HTTPS + HTTP/2, %s samples, worker process", costLatency), Measured: fmt.Sprintf("%.1f KiB", aloneTLS.bytes/1024),
		Baseline: fmt.Sprintf("%.1f KiB", baseTLS.bytes/1024), Ratio: ratio(aloneTLS.bytes, baseTLS.bytes), Verdict: verdictInfo})
	r, w, c, _ = paired(rounds[vClientSlow], rounds[vWorkerSlow], func(p perSample) float64 { return float64(p.cpu) })
	t.add(row{Case: fmt.Sprintf("CPU per sample, %s samples (a service with latency), worker process, median ratio", costLatency), Measured: fmt.Sprintf("%.0f µs", w/1e3),
		Baseline: fmt.Sprintf("%.0f µs", c/1e3), Ratio: r, Verdict: verdictInfo})
	t.add(row{Case: fmt.Sprintf("read+write system calls per sample, %s samples, worker process", costLatency), Measured: fmt.Sprintf("%.1f", aloneSlow.syscalls),
		Baseline: fmt.Sprintf("%.1f", baseSlow.syscalls), Ratio: ratio(aloneSlow.syscalls, baseSlow.syscalls), Verdict: verdictInfo})
	t.add(row{Case: fmt.Sprintf("context switches per sample, %s samples, worker process", costLatency), Measured: fmt.Sprintf("%.1f", aloneSlow.switches),
		Baseline: fmt.Sprintf("%.1f", baseSlow.switches), Ratio: ratio(aloneSlow.switches, baseSlow.switches), Verdict: verdictInfo})
	t.add(row{Case: fmt.Sprintf("jobs per pull request, %s samples (worker, all rounds)", costLatency), Measured: fmt.Sprintf("%.2f", aloneSlow.pulled/max(aloneSlow.fetches, 1)),
		Baseline: "-", Ratio: math.NaN(), Verdict: verdictInfo})
	t.add(row{Case: "NATS server CPU per sample (that child, whole run incl. publishing)", Measured: fmt.Sprintf("%.0f µs", us(natsPer)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.cpu)), Ratio: ratio(float64(natsPer), float64(base.cpu)), Verdict: verdictInfo})
	// The simulator answers the same requests for either side: what its CPU per sample moves
	// by is the run around it, not its own work.
	t.add(row{Case: "simulator CPU per sample (child process, not counted above; the same requests either side)", Measured: fmt.Sprintf("%.0f µs", us(alone.simCPU)),
		Baseline: fmt.Sprintf("%.0f µs", us(base.simCPU)), Ratio: ratio(float64(alone.simCPU), float64(base.simCPU)), Verdict: verdictInfo})
	t.add(row{Case: "HTTP requests the simulator answered per sample (asample, retrieve_future)", Measured: callsText(alone.calls),
		Baseline: callsText(base.calls), Ratio: ratio(sumOf(alone.calls), sumOf(base.calls)), Verdict: verdictInfo})
	t.add(row{Case: "read+write system calls per sample, worker process", Measured: fmt.Sprintf("%.1f", alone.syscalls),
		Baseline: fmt.Sprintf("%.1f", base.syscalls), Ratio: ratio(alone.syscalls, base.syscalls), Verdict: verdictInfo})
	t.add(row{Case: "context switches per sample (getrusage, voluntary + involuntary), worker process", Measured: fmt.Sprintf("%.1f", alone.switches),
		Baseline: fmt.Sprintf("%.1f", base.switches), Ratio: ratio(alone.switches, base.switches), Verdict: verdictInfo})
	t.add(row{Case: "jobs per pull request (worker, all rounds)", Measured: fmt.Sprintf("%.2f", alone.pulled/max(alone.fetches, 1)),
		Baseline: "-", Ratio: math.NaN(), Verdict: verdictInfo})
	t.note("measured: 1 worker, %d job slots: dequeue, decode+validate, tokenize, dispatch, asample, poll, decode, publish result, ack (results stored and jobs acked in groups); max_tokens %d", costConcurrency, s.CostMaxTokens)
	t.note("baseline: tinker.Dial + Sampler.Sample in %d goroutines: tokenize the same prompts, asample, poll, decode text", costConcurrency)
	t.note("the simulators (zero latency unless a row says otherwise) run in child processes, so neither figure includes them: nothing to subtract")
	t.note("the aim rows are the worker process, its NATS server in a child process (as cmd/worker runs against a server elsewhere); the NATS server's own CPU is shown apart, and the embedded rows count it in")
	t.note("JetStream floor: the worker process's queue traffic (fetch, results stored in groups, acks) with no work at all; the aim leaves 0.25 x the client's cost for everything the queue adds")
	t.note("%s rows: a simulator whose samples take %s, so that jobs finish one by one as against a real service (the worker's lingers then form its groups); idle cores make every hand-off between goroutines cost a wake-up, on both sides", costLatency, costLatency)
	t.note("HTTPS rows: the simulator on a self-signed certificate (tinker.Config.RootCAs), HTTP/2 negotiated as with the real service (§1.4), samples of %s (zero-latency HTTPS rows until session 9 read 1.19-1.47)", costLatency)
	t.note("%d samples measured after %d warm-up samples, per side; simulator CPU from /proc/<pid>/stat (10 ms ticks)", s.CostSamples, s.CostWarmup)
	t.note("CPU in the kernel: Linux splits a process's CPU time into user and sys by scheduler ticks, so that row is coarse (tens of ticks a round)")
	t.note("%d alternated rounds; aim rows and those that say median ratio: the median over the rounds of the worker's figure / the client's in the same round (the medians of each side are shown); other rows: each variant's cheapest round", max(s.CostRounds, 1))
	return t, nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// medianOf returns the median of xs (the mean of the middle two for an even count).
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// costVerdict judges a ratio of comparison 2's aim rows: against 1.25 for samples of
// benchMaxTokens, where the aim is set; for others (-max-tokens) it is information.
func costVerdict(maxTokens int, ratio float64) (string, verdict) {
	if maxTokens != benchMaxTokens {
		return "", verdictInfo
	}
	return atMost(ratio, 1.25)
}

// costPlan is how many samples one variant of comparison 2 runs: warmup, then n measured.
type costPlan struct {
	warmup, n int
	maxTokens int // of every sample
	// setupOnly stops a variant once it is set up, as it would be for warmup+n samples (jobs
	// published, tokenizer loaded), so that set-up can be subtracted (-instructions).
	setupOnly bool
}

// clientCost samples warmup+n jobs' prompts with the client alone and measures the last n.
func clientCost(ctx context.Context, sim simTarget, tokens *tokenizer.Registry, plan costPlan) (perSample, error) {
	simPID := sim.pid
	c, err := tinker.Dial(ctx, tinker.Config{BaseURL: sim.url, APIKey: benchKey, RootCAs: sim.roots})
	if err != nil {
		return perSample{}, err
	}
	defer c.Close()
	sampler, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: benchModel})
	if err != nil {
		return perSample{}, err
	}
	tok, err := tokens.ForModel(ctx, benchModel)
	if err != nil {
		return perSample{}, fmt.Errorf("%s tokenizer: %w", benchModel, err)
	}
	warmup := max(plan.warmup, 1)
	total := int64(warmup + plan.n)
	// The jobs are made before, as the worker's are published before: making one is not the
	// client's work (fmt.Sprintf, about 2,000 instructions a job).
	prompts := make([]string, total)
	for i := range prompts {
		prompts[i] = benchJob(i, plan.maxTokens).Prompt
	}
	runtime.GC() // set-up's garbage is not the samples' (and -instructions' two runs match)
	if plan.setupOnly {
		return perSample{}, nil
	}
	var (
		next, done  atomic.Int64
		first       error
		mu          sync.Mutex
		wg          sync.WaitGroup
		mark        = make(chan struct{})
		before      usage
		simBefore   time.Duration
		callsBefore map[string]int64
	)
	for range costConcurrency {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				mt := plan.maxTokens
				res, err := sampler.Sample(ctx, tinker.SampleRequest{
					Prompt: tinker.EncodedText(tok.Encode(prompts[i])), NumSamples: 1,
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
					callsBefore, _ = simRequests(ctx, sim)
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
	p.calls = callsPer(ctx, sim, callsBefore, p.n)
	return p, nil
}

// workerCost runs warmup+n jobs through one worker and measures the stretch between warmup
// and warmup+n results stored.
// batch names the jobs: rounds on one server (the child process) each need their own.
func workerCost(ctx context.Context, natsURL string, sim simTarget, tokens *tokenizer.Registry, batch string, plan costPlan) (perSample, error) {
	simPID := sim.pid
	r, err := newRig(ctx, rigConfig{NatsURL: natsURL, SimURL: sim.url, SimRoots: sim.roots, Queue: queue.Config{MaxAckPending: 2000}, Tokens: tokens})
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
	warmup, n := plan.warmup+int(earlier), plan.n
	if err := publishJobs(ctx, q, batch, 0, warmup+n-int(earlier), plan.maxTokens); err != nil {
		return perSample{}, err
	}
	// Loaded here rather than for the worker's first job, so that set-up's garbage (the
	// parse's above all) is collected before the samples, and -instructions' two runs match.
	if _, err := tokens.ForModel(ctx, benchModel); err != nil {
		return perSample{}, fmt.Errorf("%s tokenizer: %w", benchModel, err)
	}
	runtime.GC()
	if plan.setupOnly {
		return perSample{}, nil
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
	var callsBefore map[string]int64
	// Polled sparsely: the stream info requests are this process's CPU too (and, for
	// -instructions, its count, which takes in the warm-up).
	k0, err := waitForCount(ctx, 5*time.Minute, "the warm-up results", int64(warmup), stored)
	if err == nil {
		simBefore, _ = procCPU(simPID)
		callsBefore, _ = simRequests(ctx, sim)
		before = snapshot()
		_, err = waitForCount(ctx, 10*time.Minute, "the measured results", int64(warmup+n), stored)
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
	p.calls = callsPer(ctx, sim, callsBefore, p.n)
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

// floorCost is the least a JetStream worker can spend per job with nats.go, settling as the
// worker does: jobs pulled in batches of up to 64 (queue.JobPuller), each batch's typical results stored as one
// group (queue.ResultPublisher) and its jobs acked after that. No decoding, no sampling, nothing
// of the worker's own.
func floorCost(ctx context.Context, natsURL, batch string, plan costPlan) (perSample, error) {
	warmup, n := plan.warmup, plan.n
	r, err := newRig(ctx, rigConfig{NatsURL: natsURL, Queue: queue.Config{MaxAckPending: 2000}})
	if err != nil {
		return perSample{}, err
	}
	defer r.close()
	q, err := r.connect(ctx, "bench-floor")
	if err != nil {
		return perSample{}, err
	}
	if err := publishJobs(ctx, q, batch, 0, warmup+n, plan.maxTokens); err != nil {
		return perSample{}, err
	}
	puller, err := q.NewJobPuller(ctx)
	if err != nil {
		return perSample{}, err
	}
	defer func() { _ = puller.Close(nil) }()
	codec, err := queue.NewCodec(0)
	if err != nil {
		return perSample{}, err
	}
	defer codec.Close()
	results, err := q.NewResultPublisher()
	if err != nil {
		return perSample{}, err
	}
	defer results.Close()
	mt := plan.maxTokens
	res := jobs.Result{CustomID: "job-00000000", BatchID: batch, Status: jobs.StatusOK, Model: benchModel, Attempts: 1,
		Samples: []jobs.Sample{{Text: "a completion of sixteen tokens or so, as the simulator writes", Tokens: make([]int, mt), StopReason: jobs.StopReasonLength}},
		Usage:   &jobs.Usage{PromptTokens: 24, CompletionTokens: mt}}
	data, err := res.Encode()
	if err != nil {
		return perSample{}, err
	}
	tokens := queue.Tokens{Prompt: res.Usage.PromptTokens, Completion: res.Usage.CompletionTokens}
	const fetchMax = 64
	var (
		before  usage
		settled int
		jobMsgs = make([]jetstream.Msg, 0, fetchMax)
		outs    = make([]*nats.Msg, fetchMax) // reused, as a worker reuses the result messages of its kept settlements
		group   = make([]*nats.Msg, 0, fetchMax)
		errs    = make([]error, fetchMax)
	)
	total, from := warmup+n, 0 // from: jobs settled when the measure began
	for settled < total && ctx.Err() == nil {
		jobMsgs, group = jobMsgs[:0], group[:0]
		var encodeErr error
		_, err := puller.Pull(ctx, fetchMax, time.Second, func(msg jetstream.Msg) {
			id := queue.CustomID(msg.Headers())
			out, err := q.ResultMsg(outs[len(group)], codec, batch, id, string(jobs.StatusOK), tokens, data, 0)
			if err != nil {
				encodeErr = err
				return
			}
			outs[len(group)] = out
			jobMsgs, group = append(jobMsgs, msg), append(group, out)
		})
		if err = cmp.Or(err, encodeErr); err != nil {
			return perSample{}, fmt.Errorf("pull: %w", err)
		}
		results.Publish(ctx, group, errs[:len(group)])
		for i, msg := range jobMsgs {
			if errs[i] != nil {
				return perSample{}, errs[i]
			}
			_ = msg.Ack()
		}
		settled += len(jobMsgs)
		if from == 0 && settled >= warmup {
			before, from = snapshot(), settled
		}
	}
	if nc := q.JS.Conn(); nc != nil {
		_ = nc.Flush()
	}
	if err := ctx.Err(); err != nil {
		return perSample{}, err
	}
	if settled == from {
		return perSample{}, errors.New("no jobs left to measure after the warm-up")
	}
	return before.per(snapshot(), int64(settled-from)), nil
}

// simStats is the simulator's admin stats.
func simStats(ctx context.Context, sim simTarget) (tinkersim.Stats, error) {
	hc := http.DefaultClient
	if sim.roots != nil {
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: sim.roots}}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(sim.url, "/")+"/admin/stats", nil)
	if err != nil {
		return tinkersim.Stats{}, err
	}
	req.Header.Set("X-API-Key", string(benchKey))
	resp, err := hc.Do(req)
	if err != nil {
		return tinkersim.Stats{}, fmt.Errorf("simulator stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return tinkersim.Stats{}, fmt.Errorf("simulator stats: %s", resp.Status)
	}
	var st tinkersim.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return tinkersim.Stats{}, fmt.Errorf("simulator stats: %w", err)
	}
	return st, nil
}

// simRequests is the simulator's count of replies so far, by endpoint (its admin stats).
func simRequests(ctx context.Context, sim simTarget) (map[string]int64, error) {
	st, err := simStats(ctx, sim)
	if err != nil {
		return nil, err
	}
	n := map[string]int64{}
	for endpoint, byStatus := range st.Requests {
		for _, c := range byStatus {
			n[endpoint] += c
		}
	}
	return n, nil
}

// callsPer is the simulator's replies since before, by endpoint, per sample of n.
func callsPer(ctx context.Context, sim simTarget, before map[string]int64, n int64) map[string]float64 {
	after, err := simRequests(ctx, sim)
	if err != nil || before == nil {
		return nil
	}
	per := map[string]float64{}
	for endpoint, c := range after {
		per[endpoint] = float64(c-before[endpoint]) / float64(n)
	}
	return per
}

// callsText shows the sampling calls of a callsPer map: "0.99 + 1.00".
func callsText(calls map[string]float64) string {
	if calls == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f + %.2f", calls["asample"], calls["retrieve_future"])
}

// sumOf is the sampling calls of a callsPer map (asample and retrieve_future).
func sumOf(calls map[string]float64) float64 {
	if calls == nil {
		return math.NaN()
	}
	return calls["asample"] + calls["retrieve_future"]
}

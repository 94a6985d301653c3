package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
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

// benchKey is the Tinker key of the simulated account; the simulator accepts only it. It is
// a made-up key for a local simulator, not a credential.
const benchKey = tinker.APIKey("tml-bench.not-a-real-key")

// benchModel is the model of every job: its tokenizer (Qwen3) is built into the program.
const benchModel = "Qwen/Qwen3-8B"

// benchMaxTokens is the max_tokens of every job: small and fixed, so latency does not depend
// on it when PerTokenLatency is zero. Comparison 2 and -instructions can take others
// (-max-tokens), to show what a sample's length costs.
const benchMaxTokens = 16

// rig is one embedded NATS server with the queue set up, and optionally an in-process
// simulator listening on loopback. Every comparison builds its own and closes it.
type rig struct {
	dir     string
	emb     *queue.Embedded // nil when the server runs elsewhere
	natsURL string
	sim     *tinkersim.Server // nil when the simulator runs elsewhere
	simURL  string
	roots   *x509.CertPool
	qcfg    queue.Config
	tokens  *tokenizer.Registry
	// registry, when set, receives the metrics of the next worker opened (one at a time).
	registry *prometheus.Registry

	mu    sync.Mutex
	conns []*nats.Conn
}

// rigConfig says what a rig holds.
type rigConfig struct {
	// Sim configures the in-process simulator; nil means none (SimURL is used instead).
	Sim *tinkersim.Config
	// SimURL is a simulator running elsewhere (a child process).
	SimURL string
	// SimRoots trusts the certificate of an HTTPS SimURL.
	SimRoots *x509.CertPool
	// NatsURL is a NATS server running elsewhere (a child process); "" starts one in-process.
	NatsURL string
	// Queue sizes the streams and the consumer.
	Queue queue.Config
	// Tokens is the workers' tokenizer registry, shared so that a tokenizer is loaded once
	// across rigs; nil means a fresh one.
	Tokens *tokenizer.Registry
}

// newRig starts the embedded server (data in a fresh temp dir) and the simulator.
func newRig(ctx context.Context, cfg rigConfig) (_ *rig, err error) {
	dir, err := os.MkdirTemp("", "tinkerfleet-bench-*")
	if err != nil {
		return nil, fmt.Errorf("rig: temp dir: %w", err)
	}
	r := &rig{dir: dir, qcfg: cfg.Queue, simURL: cfg.SimURL, roots: cfg.SimRoots,
		tokens: cfg.Tokens}
	if r.tokens == nil {
		r.tokens = tokenizer.NewRegistry(tokenizer.Options{Offline: true})
	}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	r.natsURL = cfg.NatsURL
	if r.natsURL == "" {
		r.emb, err = queue.StartEmbedded(queue.EmbeddedConfig{DataDir: dir, Port: -1})
		if err != nil {
			return nil, fmt.Errorf("rig: %w", err)
		}
		r.natsURL = r.emb.ClientURL()
	}
	if cfg.Sim != nil {
		sc := *cfg.Sim
		sc.APIKeys = []string{string(benchKey)}
		r.sim, err = tinkersim.New(sc)
		if err != nil {
			return nil, fmt.Errorf("rig: simulator: %w", err)
		}
		r.simURL, err = r.sim.Listen(ctx, "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("rig: %w", err)
		}
	}
	return r, nil
}

// close stops everything the rig started and removes its data.
func (r *rig) close() {
	r.mu.Lock()
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	for _, nc := range conns {
		nc.Close()
	}
	if r.sim != nil {
		r.sim.Close()
	}
	if r.emb != nil {
		r.emb.Shutdown()
	}
	_ = os.RemoveAll(r.dir)
}

// connect opens a connection of its own and sets the queue up on it, as a worker does.
func (r *rig) connect(ctx context.Context, name string) (*queue.Queue, error) {
	nc, err := queue.Connect(queue.ConnectConfig{URL: r.natsURL, Name: name})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.conns = append(r.conns, nc)
	r.mu.Unlock()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return queue.Setup(ctx, js, r.qcfg)
}

// openWorker connects a worker of its own (connection, session, backoff) to the rig.
func (r *rig) openWorker(ctx context.Context, name string, concurrency int, local bool) (*worker.Worker, error) {
	q, err := r.connect(ctx, name)
	if err != nil {
		return nil, err
	}
	return worker.Open(ctx, worker.Config{
		Queue:         q,
		TinkerBaseURL: r.simURL,
		TinkerRootCAs: r.roots,
		TinkerAPIKey:  benchKey,
		LocalBackoff:  local,
		Concurrency:   concurrency,
		Tokenizers:    r.tokens,
		ShutdownGrace: 500 * time.Millisecond,
		Registerer:    r.takeRegistry(),
	})
}

// takeRegistry returns the registry for one worker's metrics and clears it, or nil.
func (r *rig) takeRegistry() prometheus.Registerer {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg := r.registry
	r.registry = nil
	if reg == nil {
		return nil // a typed nil would register
	}
	return reg
}

// openWorkers opens n workers, each on its own connection.
func (r *rig) openWorkers(ctx context.Context, n, concurrency int, local bool) ([]*worker.Worker, error) {
	var ws []*worker.Worker
	for i := range n {
		w, err := r.openWorker(ctx, fmt.Sprintf("bench-worker-%d", i), concurrency, local)
		if err != nil {
			for _, w := range ws {
				w.Close()
			}
			return nil, err
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// running is a set of workers in Run, stopped together.
type running struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ws     []*worker.Worker
	mu     sync.Mutex
	errs   []error
}

// start runs every worker until stop.
func start(ctx context.Context, ws []*worker.Worker) *running {
	ctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, ws: ws}
	for _, w := range ws {
		r.wg.Go(func() {
			if err := w.Run(ctx); err != nil {
				r.mu.Lock()
				r.errs = append(r.errs, err)
				r.mu.Unlock()
			}
		})
	}
	return r
}

// stop ends the workers' Run, waits for them and closes them.
func (r *running) stop() error {
	r.cancel()
	r.wg.Wait()
	for _, w := range r.ws {
		w.Close()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.errs...)
}

// benchJob is job i of a run: a short text prompt the worker tokenizes, max_tokens fixed.
func benchJob(i, maxTokens int) jobs.Job {
	mt := maxTokens
	return jobs.Job{
		CustomID:   fmt.Sprintf("job-%08d", i),
		Model:      benchModel,
		Prompt:     fmt.Sprintf("Question %d: explain in %d words why the sky is blue at noon and red at dusk.", i, 10+i%50),
		NumSamples: 1,
		Params:     jobs.SamplingParams{MaxTokens: &mt},
	}
}

// publishJobs publishes jobs [from, from+n) of batch, with maxTokens, the way cmd/submit does
// (async, futures settled every 2048) and waits until the stream stored them all.
func publishJobs(ctx context.Context, q *queue.Queue, batch string, from, n, maxTokens int) error {
	var pending []jetstream.PubAckFuture
	for i := from; i < from+n; i++ {
		j := benchJob(i, maxTokens)
		data, err := j.Encode()
		if err != nil {
			return fmt.Errorf("encode job: %w", err)
		}
		f, err := q.PublishJobAsync(batch, j.CustomID, data, false)
		if err != nil {
			return err
		}
		if pending = append(pending, f); len(pending) >= 2048 {
			if err := settle(ctx, pending); err != nil {
				return err
			}
			pending = pending[:0]
		}
	}
	return settle(ctx, pending)
}

// settle waits for every future.
func settle(ctx context.Context, fs []jetstream.PubAckFuture) error {
	for _, f := range fs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("publish: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// waitFor polls cond every 10 ms until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	const period = 10 * time.Millisecond
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(period):
		}
	}
	return nil
}

// waitForCount waits until count reaches target, ctx ends or timeout passes, and returns the
// last count. It polls sparsely: from the rate since its last poll it sleeps half the time the
// rest should take, but at most twice its last sleep (so that a rate that picks up after a slow
// start is not overshot), at least 20 ms and at most a second. The polls run in the measured
// process (comparison 2's stream info requests, their replies decoded as JSON): they are not
// the worker's work, and under valgrind, which slows the worker but not the clock, polling
// every 50 ms added about 6,000 instructions per sample. A count below 0 is a failed poll.
func waitForCount(ctx context.Context, timeout time.Duration, what string, target int64, count func() int64) (int64, error) {
	const least, most = 20 * time.Millisecond, time.Second
	deadline := time.Now().Add(timeout)
	lastK, lastAt := count(), time.Now()
	wait := least / 2
	for k := lastK; ; k = count() {
		if k >= target {
			return k, nil
		}
		now := time.Now()
		if now.After(deadline) {
			return k, fmt.Errorf("timed out after %s waiting for %s (%d of %d)", timeout, what, k, target)
		}
		if lastK >= 0 && k > lastK {
			perItem := now.Sub(lastAt) / time.Duration(k-lastK)
			wait = min(most, 2*wait, max(least, perItem*time.Duration(target-k)/2))
		} else {
			wait = min(most, 2*wait) // no progress (or no reading) since the last poll
		}
		if k >= 0 {
			lastK, lastAt = k, now
		}
		if err := sleepCtx(ctx, min(wait, time.Until(deadline))); err != nil {
			return k, err
		}
	}
}

// sleepCtx sleeps for d unless ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

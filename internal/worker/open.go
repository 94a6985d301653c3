package worker

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/dispatch"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/share"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

// Config is what a worker is opened with. Queue and the Tinker key (or a credential command)
// are required.
type Config struct {
	// Queue is the set-up deployment to pull jobs from and publish results to.
	Queue *queue.Queue
	// TinkerBaseURL is the Tinker service; "" means TINKER_BASE_URL or the default (§1.1).
	TinkerBaseURL string
	// TinkerAPIKey authenticates to Tinker. It is sent in X-API-Key and nowhere else.
	TinkerAPIKey tinker.APIKey
	// TinkerAPIKeyFile is the file TinkerAPIKey was read from (TINKER_API_KEY_FILE), or "".
	// When the service refuses the key, the worker reads the file again, and goes on with
	// the key it holds if that is another one that the service accepts: a key rotated in its
	// file (a mounted Kubernetes secret, say) costs no restart.
	TinkerAPIKeyFile string
	// TinkerCredentialCmd is a shell command whose output is the credential
	// (TINKER_CREDENTIAL_CMD; see tinker.Config.CredentialCmd). It may stand in for
	// TinkerAPIKey where the service exchanges credentials for JWTs.
	TinkerCredentialCmd string
	// HTTPClient carries the Tinker requests; nil means the client's default.
	HTTPClient *http.Client
	// TinkerRootCAs replaces the system roots in the TLS check of the Tinker service when
	// HTTPClient is nil (see tinker.Config.RootCAs).
	TinkerRootCAs *x509.CertPool
	// TinkerTiming overrides protocol delays (tests and benchmarks); zero means the defaults.
	TinkerTiming tinker.Timing
	// Account names the Tinker account whose fleet backoff and capacity shares the worker
	// takes part in (TINKERFLEET_ACCOUNT). "" means the account of the base URL and key: a
	// hash of both, so that workers with another key back off apart. Name it when the key
	// changes while workers run (rotated in TinkerAPIKeyFile): a worker that took the new key
	// keeps the account it started with, and one started later has the new key's, so without a
	// name the two back off as two fleets until every worker restarted.
	Account string
	// LocalBackoff keeps the backoff in this process only, as the Python SDK does, instead of
	// sharing it with the fleet through KV. For comparisons; a fleet wants the shared one.
	LocalBackoff bool
	// PausedBackoff is the fleet backoff signalled when a poll reports a paused queue state;
	// 0 means backoff.PausedBackoff (5 s), negative turns it off (the Python SDK only logs).
	PausedBackoff time.Duration
	// Dispatch sizes the limiter; a zero Bytes takes the server's
	// sample_dispatch_bytes_semaphore_size (§3.1).
	Dispatch dispatch.Config
	// Tokenizers finds the tokenizer of each model; nil means only prompt_tokens jobs work and
	// samples carry no text.
	Tokenizers *tokenizer.Registry
	// Concurrency is how many jobs the worker works on at once, polling included; default 400.
	Concurrency int
	// Limits re-validate every job (the same limits submit checked); zero means the defaults.
	Limits jobs.Limits
	// CompressAbove is the result size from which results are zstd-compressed; default 64 KiB.
	CompressAbove int
	// ResultMemory bounds the memory, in bytes, that results take between their arrival and
	// their storage: no new sample is sent while they take it all (see resultMemory). Only
	// results of many numbers come near it (long samples, prompt logprobs of long prompts).
	// Default DefaultResultMemory (256 MiB); negative means no bound.
	ResultMemory int64
	// ShutdownGrace is how long the samples already sent may run after Run's context is done
	// (jobs not yet sent are handed back at once); default 30s.
	ShutdownGrace time.Duration
	// RetryDelay is the wait before a job that failed transiently is delivered again, doubled
	// with each delivery (at most 5 minutes); default 5s.
	RetryDelay time.Duration
	// CapacityTTL is how long a capacity learned from a 429 limits this worker's samples in
	// flight once a second measure confirms it, a quarter of it before (see capacity); default
	// 60s, negative turns learning off (the SDK's behaviour: refill after every pause).
	CapacityTTL time.Duration
	// NakAbove: when the backoff has more than this left before a job is dispatched, the job is
	// handed back with NakWithDelay instead of waiting in this worker; default 10s.
	NakAbove time.Duration
	// SampleTimeout bounds how long a sample's future may go unanswered once the service
	// accepted it (tinker.Config.FutureTimeout). A future the service never completes (lost,
	// or hung) is otherwise polled for ever, as the Python SDK does (§4.1), and its batch
	// never ends. Past it, the job is tried again as after a transient failure, and ends as a
	// dead letter after MaxDeliver deliveries. It is checked as each long poll returns (no
	// timer per sample), so up to one poll late. Default 30 min; negative means no bound.
	SampleTimeout time.Duration
	// ReclaimedThrough is Reclaimed.Through of the queue.Reclaim that made this worker's jobs
	// of a stopped run deliverable again (submit --local), or 0. Such a job comes back as a
	// first delivery, but its result may be stored already, so the worker looks for it
	// before sampling, as it does for every job delivered again.
	ReclaimedThrough uint64
	// Registerer receives the worker's Prometheus metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger receives the worker's logs; nil discards them.
	Logger *slog.Logger
}

// accountKey is the KV key of the account the worker backs off for (Config.Account): a
// hash of the base URL and the account's name, or else of the credential. With a credential
// command alone, the command stands for the account: what it prints may change from one run
// to the next.
func accountKey(baseURL string, cfg Config) string {
	if cfg.Account != "" {
		return backoff.AccountKey(baseURL, "account:"+cfg.Account)
	}
	return backoff.AccountKey(baseURL, cmp.Or(string(cfg.TinkerAPIKey), "credential-cmd:"+cfg.TinkerCredentialCmd))
}

// Open connects a worker: its backoff (the fleet's KV entry for this Tinker account, unless
// LocalBackoff), its Tinker session with a Gate over the dispatch limiter, and its metrics.
func Open(ctx context.Context, cfg Config) (*Worker, error) {
	if cfg.Queue == nil {
		return nil, errors.New("worker: a queue is required")
	}
	if cfg.TinkerAPIKey != "" || cfg.TinkerCredentialCmd == "" {
		if err := cfg.TinkerAPIKey.Validate(); err != nil {
			return nil, err
		}
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 400
	}
	if cfg.ShutdownGrace <= 0 {
		cfg.ShutdownGrace = 30 * time.Second
	}
	if cfg.CapacityTTL == 0 {
		cfg.CapacityTTL = time.Minute
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = 5 * time.Second
	}
	if cfg.NakAbove <= 0 {
		cfg.NakAbove = 10 * time.Second
	}
	if cfg.SampleTimeout == 0 {
		cfg.SampleTimeout = DefaultSampleTimeout
	}
	if cfg.PausedBackoff == 0 {
		cfg.PausedBackoff = backoff.PausedBackoff
	}
	if cfg.ResultMemory == 0 {
		cfg.ResultMemory = DefaultResultMemory
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Worker{
		cfg:             cfg,
		log:             cfg.Logger,
		slots:           make(chan struct{}, cfg.Concurrency),
		alive:           aliveSet{staleAfter: staleAfter(cfg.Queue.Config.AckWait)},
		link:            newLink(),
		maxDeliver:      cfg.Queue.Config.MaxDeliver,
		memory:          resultMemory{limit: cfg.ResultMemory},
		fetchLinger:     fetchLinger,
		presenceEvery:   queue.PresencePeriod,
		deadLetterRetry: deadLetterRetry,
		id:              newWorkerID(),
		host:            hostName(),
	}
	w.sentBack.wake = make(chan struct{}, 1)
	w.cancelled.ended = w.sentBack.poke
	ok := false
	defer func() {
		if !ok {
			w.Close()
		}
	}()

	codec, err := queue.NewCodec(cfg.CompressAbove)
	if err != nil {
		return nil, fmt.Errorf("result codec: %w", err)
	}
	w.codec = codec
	w.closers = append(w.closers, codec.Close)
	if nc := cfg.Queue.JS.Conn(); nc != nil {
		w.maxPayload = nc.MaxPayload()
	}

	learned := newCapacity(cfg.CapacityTTL)
	if cfg.LocalBackoff {
		w.backoff = backoff.NewLocal(nil)
	} else {
		baseURL := cmp.Or(cfg.TinkerBaseURL, os.Getenv("TINKER_BASE_URL"), tinker.DefaultBaseURL)
		bucket, account := cfg.Queue.Names.BackoffBucket(), accountKey(baseURL, cfg)
		fleet, err := backoff.Open(ctx, cfg.Queue.JS, backoff.Config{
			Bucket:   bucket,
			Account:  account,
			Replicas: cfg.Queue.Config.Replicas,
			Logger:   cfg.Logger,
			// Another worker's 429 says the service is full too: learn this worker's share.
			OnChange: func(st backoff.State) {
				if st.Reason == backoff.ReasonRateLimited && time.Now().Before(st.Until) {
					learned.learn()
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("fleet backoff: %w", err)
		}
		w.backoff = fleet
		w.closers = append(w.closers, func() { _ = fleet.Close() })
		if cfg.CapacityTTL > 0 {
			board, err := share.Open(ctx, cfg.Queue.JS, bucket, account, share.Config{Worker: w.id})
			if err != nil {
				return nil, fmt.Errorf("capacity share board: %w", err)
			}
			w.board, learned.settled = board, make(chan measure, 1)
			w.closers = append(w.closers, func() {
				if w.natsDown() {
					return // the delete would wait out its timeout; the report ages out of the rounds, as a crashed worker's does
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = board.Close(ctx)
			})
		}
	}

	if cfg.Registerer != nil {
		w.metrics = NewMetrics(cfg.Registerer)
		w.samplerStates.gauge = w.metrics.queueState
	}

	// The limiter's byte budget comes from the server's flags, which Dial fetches; the gate
	// is handed to Dial first and given its limiter before any sample can pass it.
	gate := NewGate(nil, w.backoff, cfg.Logger)
	gate.metrics, gate.capacity, gate.cancelled, gate.held, gate.link = w.metrics, learned, &w.cancelled, &w.alive, w.link
	w.gate = gate
	client, err := tinker.Dial(ctx, tinker.Config{
		BaseURL:       cfg.TinkerBaseURL,
		APIKey:        cfg.TinkerAPIKey,
		CredentialCmd: cfg.TinkerCredentialCmd,
		HTTPClient:    cfg.HTTPClient,
		RootCAs:       cfg.TinkerRootCAs,
		Logger:        cfg.Logger,
		Dispatcher:    gate,
		OnEvent:       w.onEvent,
		Timing:        cfg.TinkerTiming,
		FutureTimeout: max(cfg.SampleTimeout, 0),
	})
	if err != nil {
		if tinker.CredentialRefused(err) {
			// §7.1: AuthenticationError, PermissionDeniedError. The key is not in the error.
			err = fmt.Errorf("tinker session: %w: %w", ErrCredentialRefused, err)
			noteRefusal(cfg.Queue, err, cfg.Logger)
			return nil, err
		}
		return nil, fmt.Errorf("tinker session: %w", err)
	}
	w.client = client
	w.closers = append(w.closers, func() { _ = client.Close() })

	dcfg := cfg.Dispatch
	if dcfg.Bytes == 0 {
		dcfg.Bytes = client.Flags().SampleDispatchBytesSemaphoreSize
	}
	dcfg.BackoffUntil = w.backoff.Until
	w.limiter = dispatch.New(dcfg)
	gate.limiter = w.limiter
	w.samplers.client = client
	w.models.client = client
	w.closers = append(w.closers, w.metrics.watch(w.limiter, &w.pullHeld, w.backoff, learned, &w.resultsHeld, &w.memory, cfg.Queue.JS.Conn()))
	ok = true
	return w, nil
}

// onEvent turns client events into metrics, the samplers' queue states and, for a queue
// paused for capacity or a rate limit, a fleet backoff signal. A state the client does not
// know is logged and counted, and pauses nothing: were it a normal state the service
// added, every poll that reports it would pause the fleet.
func (w *Worker) onEvent(e tinker.Event) {
	w.metrics.event(e)
	w.health.observe(e)
	w.noteServiceRetry(e)
	if e.Kind != tinker.EventQueueState {
		return
	}
	w.samplerStates.observe(e.SamplerID, e.QueueState)
	if e.QueueState.Holding() && w.cfg.PausedBackoff > 0 {
		w.metrics.signal(string(e.QueueState))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := w.backoff.Signal(ctx, string(e.QueueState), w.cfg.PausedBackoff); err != nil {
			w.log.Warn("signal backoff for a paused queue", "err", err)
		}
	}
}

// Backoff is the backoff this worker waits on (shared by the fleet unless LocalBackoff).
func (w *Worker) Backoff() Backoff { return w.backoff }

// ResultsHeld says how many results the worker holds, because the results stream cannot
// store them now (out of room, or without a leader), to try them again.
func (w *Worker) ResultsHeld() int { return int(w.resultsHeld.Load()) }

// Limiter is this worker's dispatch limiter.
func (w *Worker) Limiter() *dispatch.Limiter { return w.limiter }

// Client is this worker's Tinker session.
func (w *Worker) Client() *tinker.Client { return w.client }

// Close ends the Tinker session and stops the backoff watch. Call it after Run returned.
func (w *Worker) Close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
	w.closers = nil
}

// sessionHealth tracks the Tinker session's heartbeats for readiness.
type sessionHealth struct {
	failingSince atomic.Int64 // unix nanos of the first failed heartbeat since the last success
}

func (h *sessionHealth) observe(e tinker.Event) {
	switch {
	case e.Kind == tinker.EventHeartbeatFailed:
		h.failingSince.CompareAndSwap(0, time.Now().UnixNano())
	case e.Kind == tinker.EventRequest && e.Endpoint == "session_heartbeat" && e.StatusCode/100 == 2:
		h.failingSince.Store(0)
	}
}

// natsDown reports whether the worker's NATS connection is down (reconnecting or closed): a
// request or KV write would only wait out its timeout, and one left for the reconnect is lost
// with the process. A stop skips what can be left undone then.
func (w *Worker) natsDown() bool {
	nc := w.cfg.Queue.JS.Conn()
	return nc != nil && !nc.IsConnected()
}

// NATSHeard reports an error while the NATS server has not answered this worker's pings for
// 3 s (a link that died without closing, which the connection notices only after 20-30 s):
// the worker sends no sample meanwhile (see link). It is meaningful while Run runs.
func (w *Worker) NATSHeard() error {
	now := time.Now()
	if !w.link.doubtful(now) {
		return nil
	}
	return fmt.Errorf("no answer to the worker's pings for %s", now.Sub(time.Unix(0, w.link.heard.Load())).Round(time.Second))
}

// SessionHealthy reports an error once the Tinker session's heartbeats have failed for two
// minutes (§3.4: the server presumably ends such a session).
func (w *Worker) SessionHealthy() error {
	since := w.health.failingSince.Load()
	if since == 0 {
		return nil
	}
	if d := time.Since(time.Unix(0, since)); d > 2*time.Minute {
		return fmt.Errorf("session heartbeats failing for %s", d.Round(time.Second))
	}
	return nil
}

// Command worker is one member of a tinkerfleet: it pulls sampling jobs from the shared
// JetStream consumer, samples them on the Tinker API and publishes one result per job.
//
// Run one or a hundred; they share the work and the account's backoff. With --embedded-nats it
// also serves a NATS server with JetStream on disk, which other workers and submit can join:
//
//	TINKER_API_KEY=tml-… worker --embedded-nats --data-dir /var/lib/tinkerfleet
//	TINKER_API_KEY=tml-… worker --nats-url nats://10.0.0.5:4222
//
// Every flag has an environment variable (see README.md, "Configuration"). The API key is read
// from TINKER_API_KEY or the file named by TINKER_API_KEY_FILE, never from a flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
	"github.com/tinkerfleet/tinkerfleet/internal/interrupt"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

func main() {
	ctx, stop := interrupt.Context(context.Background())
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

type options struct {
	conn          queue.ConnectConfig
	queue         queue.Config
	embedded      bool
	dataDir       string
	embeddedHost  string
	embeddedPort  int
	baseURL       string
	concurrency   int
	metricsAddr   string
	shutdownGrace time.Duration
	account       string
	localBackoff  bool
	pausedBackoff time.Duration
	tokenizerDir  string
	logLevel      string
	logJSON       bool
	setupStreams  bool
	capacityTTL   time.Duration
	sampleTimeout time.Duration
	resultMemory  int // MiB
}

func parseFlags(args []string, getenv envflag.Getenv, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	s := envflag.New(fs, getenv)
	o.conn.RegisterFlags(s)
	o.queue.RegisterFlags(s)
	s.Bool(&o.embedded, "embedded-nats", "TINKERFLEET_EMBEDDED_NATS", false, "serve an embedded NATS server with JetStream in --data-dir")
	s.String(&o.dataDir, "data-dir", "TINKERFLEET_DATA_DIR", ".tinkerfleet", "JetStream store of the embedded server")
	s.String(&o.embeddedHost, "embedded-host", "TINKERFLEET_EMBEDDED_HOST", "127.0.0.1", "address the embedded server listens on")
	s.NonZeroInt(&o.embeddedPort, "embedded-port", "TINKERFLEET_EMBEDDED_PORT", 4222, "port of the embedded server (-1: any free port)")
	s.String(&o.baseURL, "tinker-base-url", "TINKER_BASE_URL", "", "Tinker service URL (default the production service)")
	s.PositiveInt(&o.concurrency, "concurrency", "TINKERFLEET_CONCURRENCY", 400, "jobs this worker works on at once, polling included")
	s.String(&o.metricsAddr, "metrics-addr", "TINKERFLEET_METRICS_ADDR", ":9464", "address of /metrics, /healthz and /readyz; off (or an empty flag) serves none")
	s.PositiveDuration(&o.shutdownGrace, "shutdown-grace", "TINKERFLEET_SHUTDOWN_GRACE", 30*time.Second, "time the samples already sent get to finish on SIGTERM (jobs not yet sent go back at once)")
	s.String(&o.account, "account", "TINKERFLEET_ACCOUNT", "", "name of the Tinker account whose backoff the fleet shares (default: a hash of the base URL and key); name it to keep one fleet across key rotations")
	s.Bool(&o.localBackoff, "local-backoff", "TINKERFLEET_LOCAL_BACKOFF", false, "back off in this process only instead of fleet-wide")
	s.NonZeroDuration(&o.pausedBackoff, "paused-backoff", "TINKERFLEET_PAUSED_BACKOFF", 5*time.Second, "fleet backoff on a paused_capacity or paused_rate_limit queue state; negative disables")
	s.String(&o.tokenizerDir, "tokenizer-dir", "TINKERFLEET_TOKENIZER_DIR", "", "tokenizer.json for every model, or a directory of them per model (then the HF_HOME cache, then the hub)")
	s.NonZeroDuration(&o.sampleTimeout, "sample-timeout", "TINKERFLEET_SAMPLE_TIMEOUT", worker.DefaultSampleTimeout, "how long the service may leave a sample it accepted unanswered before its job is tried again (a future it lost); negative: no bound")
	s.NonZeroInt(&o.resultMemory, "result-memory", "TINKERFLEET_RESULT_MEMORY", worker.DefaultResultMemory>>20, "MiB that results may take between their arrival and their storage; while they take it all, no new sample is sent (only results of many numbers come near it: long samples, prompt logprobs of long prompts); negative: no bound")
	s.NonZeroDuration(&o.capacityTTL, "capacity-ttl", "TINKERFLEET_CAPACITY_TTL", time.Minute, "how long the capacity learned from a 429 limits samples in flight once a second measure confirms it (a quarter of it before); negative: refill after every pause, as the Python SDK does")
	s.Bool(&o.setupStreams, "setup-streams", "TINKERFLEET_SETUP_STREAMS", true, "create or update the streams, consumer and buckets; false binds what an operator set up, so the worker's NATS user needs no right to change streams")
	s.String(&o.logLevel, "log-level", "TINKERFLEET_LOG_LEVEL", "info", "debug, info, warn or error")
	s.Bool(&o.logJSON, "log-json", "TINKERFLEET_LOG_JSON", false, "log JSON lines instead of text")
	if err := s.Err(); err != nil {
		return o, err
	}
	if err := envflag.ParseNone(fs, args); err != nil {
		return o, err
	}
	if o.conn.URL == "" && !o.embedded {
		return o, errors.New("give --nats-url (or NATS_URL), or --embedded-nats for a single-machine fleet")
	}
	if o.embeddedPort < -1 || o.embeddedPort > 65535 {
		// nats-server cannot listen on it, and says nothing: the worker would wait 30 s for it.
		return o, fmt.Errorf("--embedded-port (or TINKERFLEET_EMBEDDED_PORT) %d: want a port up to 65535, or -1 for any free one", o.embeddedPort)
	}
	if o.pausedBackoff > backoff.MaxPause {
		// Signal would cut it to MaxPause without a word.
		return o, fmt.Errorf("--paused-backoff (or TINKERFLEET_PAUSED_BACKOFF) %s: at most %s, the longest pause a worker honours", o.pausedBackoff, backoff.MaxPause)
	}
	if mib := int64(o.resultMemory); mib > math.MaxInt64>>20 || mib < math.MinInt64>>20 {
		// Its bytes (MiB << 20) would overflow an int64: a negative bound, which the worker
		// reads as none, or one of 0, which it reads as the default.
		return o, fmt.Errorf("--result-memory (or TINKERFLEET_RESULT_MEMORY) %d: want at most %d MiB (8 EiB), or a negative value such as -1 for no bound", o.resultMemory, int64(math.MaxInt64>>20))
	}
	if err := tokenizer.CheckDir(o.tokenizerDir); err != nil {
		return o, fmt.Errorf("--tokenizer-dir (or TINKERFLEET_TOKENIZER_DIR) %w", err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return o, fmt.Errorf("--log-level (or TINKERFLEET_LOG_LEVEL) %q: want debug, info, warn or error", o.logLevel)
	}
	return o, nil
}

func run(ctx context.Context, args []string, getenv envflag.Getenv, stderr io.Writer) error {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(stderr, o.logLevel, o.logJSON)
	key, credentialCmd, err := tinker.CredentialsFrom(getenv)
	if err != nil {
		return err
	}

	// /healthz answers from now on, /readyz once the worker runs: a worker waiting for NATS
	// is alive (an orchestrator's probes must not restart it), not ready.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var running atomic.Pointer[worker.Worker]
	// From start-up, tinkerfleet_nats_connected says whether NATS was reached: a worker that
	// waits for it (a mistyped host waits for ever) shows 0, which the alert on a worker cut
	// off from NATS reads, rather than nothing; so does one that waits for its Tinker session.
	// The worker, once open, keeps this gauge of the same connection rather than its own.
	var conn atomic.Pointer[nats.Conn]
	connecting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tinkerfleet_nats_connected", Help: worker.NATSConnectedHelp,
	}, func() float64 {
		if nc := conn.Load(); nc != nil && nc.IsConnected() {
			return 1
		}
		return 0
	})
	reg.MustRegister(connecting)
	if o.metricsAddr != "" && o.metricsAddr != "off" { // off: an empty variable reads as unset
		srv, metricsAddr, err := serveHealth(o.metricsAddr, reg, running.Load, ctx.Done())
		if err != nil {
			return err
		}
		defer func() {
			shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutCtx)
		}()
		log.Info("serving /metrics, /healthz and /readyz", "addr", metricsAddr)
	}

	// After the health server: recovering a large store takes a while, and the process is
	// alive meanwhile.
	if o.embedded {
		emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: o.dataDir, Host: o.embeddedHost, Port: o.embeddedPort})
		if err != nil {
			return err
		}
		defer emb.Shutdown()
		if o.conn.URL == "" {
			o.conn.URL = emb.ClientURL()
			o.conn = o.conn.Plain()
		}
		log.Info("embedded NATS server ready; other workers and submit can join it", "url", emb.ClientURL(), "data_dir", o.dataDir)
		if !loopback(o.embeddedHost) {
			log.Warn("the embedded NATS server has no authentication: whoever reaches it can read the prompts and results and submit jobs sampled with this worker's key; keep it on a private network, or run a NATS server with users and TLS (deploy/README.md)",
				"host", o.embeddedHost)
		}
	}
	o.conn.Name = "tinkerfleet-worker"
	o.conn.Logger = log
	// A worker may start before its NATS servers (compose, Kubernetes): it waits for them.
	nc, err := queue.ConnectWait(ctx, o.conn)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("worker stopped before NATS could be reached")
			return nil
		}
		return err
	}
	defer nc.Close()
	conn.Store(nc)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	setup := queue.Setup
	if !o.setupStreams {
		setup = queue.Bind
	}
	q, err := setup(ctx, js, o.queue)
	if err != nil {
		if ctx.Err() != nil {
			log.Info("worker stopped before its streams were set up")
			return nil
		}
		return err
	}

	// A worker that hosts the NATS server of others keeps serving it when its own work fails
	// (its key refused, say) until it is stopped: going would cut the other workers and
	// submit off every batch.
	host := func(err error) error {
		if err != nil && o.embedded && ctx.Err() == nil {
			log.Error("the worker stopped; this process goes on serving NATS to the other workers and submit until it is stopped", "err", err)
			<-ctx.Done()
		}
		return err
	}

	tokOpts := tokenizer.OptionsFromEnv(getenv)
	tokOpts.Dir, tokOpts.Logger = o.tokenizerDir, log
	w, err := worker.Open(ctx, worker.Config{
		Queue:               q,
		TinkerBaseURL:       o.baseURL,
		TinkerAPIKey:        key,
		TinkerAPIKeyFile:    tinker.APIKeyFileOf(getenv),
		TinkerCredentialCmd: credentialCmd,
		Account:             o.account,
		LocalBackoff:        o.localBackoff,
		PausedBackoff:       o.pausedBackoff,
		CapacityTTL:         o.capacityTTL,
		SampleTimeout:       o.sampleTimeout,
		ResultMemory:        int64(o.resultMemory) << 20,
		Tokenizers:          tokenizer.NewRegistry(tokOpts),
		Concurrency:         o.concurrency,
		ShutdownGrace:       o.shutdownGrace,
		Registerer:          reg,
		Logger:              log,
	})
	if err != nil {
		if ctx.Err() != nil { // a stop while it waits for the Tinker service is a clean stop
			log.Info("worker stopped before its Tinker session opened")
			return nil
		}
		return host(err)
	}
	defer w.Close()
	running.Store(w)
	log.Info("worker started", "concurrency", o.concurrency, "prefix", q.Names.Prefix, "session", w.Client().SessionID())
	err = w.Run(ctx)
	running.Store(nil)
	w.Close() // the Tinker session ends now, while a host goes on serving NATS
	log.Info("worker stopped")
	return host(err)
}

// serveHealth serves Prometheus metrics, /healthz (the process is up) and /readyz (the worker
// is open and not stopping, whether told to or by itself, NATS answers its pings, and the
// Tinker session is alive) on addr,
// and returns the address it listens on (port 0 picks one). running returns the worker
// /readyz checks, nil until it is open; stopping is closed once the worker is told to stop
// (it finishes the jobs in hand within its grace, and takes no more).
func serveHealth(addr string, reg *prometheus.Registry, running func() *worker.Worker, stopping <-chan struct{}) (*http.Server, string, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(rw, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		select {
		case <-stopping:
			http.Error(rw, "stopping (finishing the jobs in hand within the shutdown grace)", http.StatusServiceUnavailable)
			return
		default:
		}
		w := running()
		if w == nil {
			http.Error(rw, "starting (connecting to NATS, opening the Tinker session) or stopping", http.StatusServiceUnavailable)
			return
		}
		if err := w.StoppedItself(); err != nil {
			http.Error(rw, "stopping (finishing the jobs in hand within the shutdown grace): "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		// A connection that is down fails the worker's pings too (within 3 s). Asking the
		// connection itself would hang the probe on a link that died with writes pending:
		// nats.go holds its lock while such a write waits out its timeout (a minute).
		if err := w.NATSHeard(); err != nil {
			http.Error(rw, "nats: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := w.SessionHealthy(); err != nil {
			http.Error(rw, "tinker: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(rw, "ready\n")
	})
	ln, err := net.Listen("tcp", addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, "", fmt.Errorf("metrics listener: %w (another worker on this machine? give each its own --metrics-addr, or off to serve none)", err)
	}
	if err != nil {
		return nil, "", fmt.Errorf("metrics listener: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }() // owned by the caller through srv.Shutdown.
	return srv, ln.Addr().String(), nil
}

// newLogger logs at level (checked by parseFlags) to w, as text or JSON lines.
func newLogger(w io.Writer, level string, asJSON bool) *slog.Logger {
	var l slog.Level
	_ = l.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: l}
	if asJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// loopback reports whether host, an address to listen on, is reachable from this machine
// only: "localhost" or a loopback IP.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

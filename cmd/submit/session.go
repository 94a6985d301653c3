package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// connOptions are the flags every subcommand that talks to NATS shares.
type connOptions struct {
	conn    queue.ConnectConfig
	queue   queue.Config
	local   bool
	dataDir string
	verbose bool
}

func (o *connOptions) register(s *envflag.Set) {
	o.conn.RegisterFlags(s)
	o.queue.RegisterFlags(s)
	s.Bool(&o.local, "local", "TINKERFLEET_LOCAL", false, "run an embedded NATS server (and, when submitting, a worker) in this process; the default without --nats-url")
	s.String(&o.dataDir, "data-dir", "TINKERFLEET_DATA_DIR", ".tinkerfleet", "JetStream store of the embedded server")
	s.Bool(&o.verbose, "v", "TINKERFLEET_VERBOSE", false, "log more: what the embedded server is reached through and, when submitting, what the local worker does")
}

// checkLocal refuses --local beside a --nats-url given on the command line: one runs a NATS
// server in this process, the other names a fleet's, and the batch would go to a store the
// fleet never reads. A NATS_URL from the environment (a shell set up for a fleet) gives way to
// --local.
func (o *connOptions) checkLocal(fs *flag.FlagSet) error {
	urlGiven := false
	fs.Visit(func(f *flag.Flag) { urlGiven = urlGiven || f.Name == "nats-url" })
	if o.local && urlGiven {
		return fmt.Errorf("--local (or TINKERFLEET_LOCAL) runs a NATS server in this process, and --nats-url names another: give --local or --nats-url, not both: %w", errUsage)
	}
	return nil
}

// simulatedDataDir is where submit --local --simulate keeps its store: a directory of its own
// in the data directory, so that no simulated batch is taken for a real one.
func simulatedDataDir(dataDir string) string { return filepath.Join(dataDir, "simulated") }

// isSimulatedDataDir reports whether dataDir is a simulated store (simulatedDataDir) itself.
func isSimulatedDataDir(dataDir string) bool {
	return filepath.Base(filepath.Clean(dataDir)) == "simulated"
}

// simulatedBatchPrefix begins the batch id a --simulate run gives its input ("b-" a real
// run's): the same file simulated first, then sampled for real, makes two batches, and a
// results file of one is refused as the other's -o. It also tells the commands on one batch
// (status, results, ...) that it lives in the simulated store.
const simulatedBatchPrefix = "sim-"

// storeOf is the data directory of batch: the simulated store for a simulated batch, unless
// dataDir names it already.
func storeOf(dataDir, batch string) string {
	if strings.HasPrefix(batch, simulatedBatchPrefix) && !isSimulatedDataDir(dataDir) {
		return simulatedDataDir(dataDir)
	}
	return dataDir
}

// localOptions say how submit --local samples.
type localOptions struct {
	simulate     bool
	concurrency  int
	baseURL      string
	tokenizerDir string
}

func (o *localOptions) register(s *envflag.Set) {
	s.Bool(&o.simulate, "simulate", "TINKERFLEET_SIMULATE", false, "with --local, sample on an in-process Tinker simulator instead of the real service (its batches are kept apart, in the data directory's simulated/)")
	s.PositiveInt(&o.concurrency, "concurrency", "TINKERFLEET_CONCURRENCY", 400, "jobs the local worker works on at once")
	s.String(&o.baseURL, "tinker-base-url", "TINKER_BASE_URL", "", "Tinker service URL of the local worker (default the production service)")
	s.String(&o.tokenizerDir, "tokenizer-dir", "TINKERFLEET_TOKENIZER_DIR", "", "tokenizer.json for every model, or a directory of them per model")
}

// tokenizerOptions are where the local worker (and --dry-run) finds tokenizers: as a worker
// does, unless --tokenizer-dir says.
func (o *localOptions) tokenizerOptions(env *environment) tokenizer.Options {
	opts := tokenizer.OptionsFromEnv(env.getenv)
	if o.tokenizerDir != "" {
		opts.Dir = o.tokenizerDir
	}
	return opts
}

// jobAckTimeout is how long submit waits for the stream to acknowledge a job it published
// before it takes the job for not stored.
const jobAckTimeout = 5 * time.Second

// session is an open connection to the queue, with whatever runs in-process behind it.
type session struct {
	q       *queue.Queue
	nc      *nats.Conn
	log     *slog.Logger
	closers []func()
	workers sync.WaitGroup
	stopRun context.CancelFunc
	// held counts the results the in-process worker cannot store now; nil without one.
	held func() int
	// opened is closed once the in-process worker no longer opens its Tinker session (it
	// runs, or it stopped); nil without one.
	opened chan struct{}
	// host is the process whose embedded server this session reached through the data
	// directory it holds (see open); nil otherwise.
	host *queue.DataDirInUseError
	// own says the NATS server runs in this process, where no other process can reach it.
	own bool
	// reclaimedThrough is the last stream sequence of the jobs a run that stopped without
	// settling them left delivered, which this session made deliverable again (0: none).
	reclaimedThrough uint64
}

// alone says that no worker can take a job here: the NATS server is this process's own, and
// it runs no worker (submit results, status, on a local data directory).
func (s *session) alone() bool { return s.own && s.held == nil }

// hostEnded says, once the process whose server this session reached has ended (taking its
// server with it), that it has; "" while it runs, or for a session on a server of its own or
// a fleet's.
func (s *session) hostEnded() string {
	if s.host == nil || !s.nc.IsClosed() {
		return ""
	}
	return fmt.Sprintf("the process that served %s (pid %s) has ended, and its NATS server with it", s.host.Dir, s.host.PID)
}

func newFlagSet(name string, env *environment) (*flag.FlagSet, *envflag.Set) {
	fs := flag.NewFlagSet("submit "+name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	return fs, envflag.New(fs, env.getenv)
}

// open connects a subcommand to NATS and sets up the queue. In local mode it starts the
// embedded server on the data directory, or, while another process runs one there (a
// submit --local run in another terminal, worker --embedded-nats), connects to that one:
// status, results, failed, cancel, list and delete work on its batches as it runs.
func open(ctx context.Context, o connOptions, env *environment) (*session, error) {
	return openSession(ctx, o, env, true)
}

// openSession connects to NATS (starting the embedded server in local mode) and sets up the
// queue. join says whether a data directory in use may be reached through its holder's
// server; submitting may not, as its worker would stop with that process.
func openSession(ctx context.Context, o connOptions, env *environment, join bool) (*session, error) {
	// Warnings always show (a Tinker service that cannot be reached, a billing pause, a
	// message from the service); -v adds what the embedded worker does.
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelInfo
	}
	var logOut io.Writer = env.stderr
	if isTerminal(env) {
		logOut = clearLine{env.stderr}
	}
	s := &session{log: slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))}
	ok := false
	defer func() {
		if !ok {
			s.close()
		}
	}()
	if o.conn.URL == "" || o.local {
		// A subcommand reads what was submitted: where nothing was, it makes no store.
		emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: o.dataDir, Port: -1, Existing: join})
		var inUse *queue.DataDirInUseError
		switch {
		case errors.Is(err, queue.ErrNoDataDir):
			also := ""
			if fi, serr := os.Stat(simulatedDataDir(o.dataDir)); serr == nil && fi.IsDir() {
				also = fmt.Sprintf(" (--simulate runs keep theirs in %s: give that as --data-dir)", simulatedDataDir(o.dataDir))
			}
			return nil, fmt.Errorf("%w: nothing was submitted here%s; run this in the folder the batch was submitted from, or give its --data-dir (--nats-url for a fleet)", err, also)
		case errors.As(err, &inUse) && join && inUse.URL != "":
			o.conn.URL, s.host = inUse.URL, inUse
			o.conn = o.conn.Plain() // an embedded server too
			s.log.Info("connecting to the server of the process that holds the data directory", "pid", inUse.PID, "url", inUse.URL)
		case errors.As(err, &inUse):
			return nil, fmt.Errorf("%w; meanwhile submit status, results, failed, cancel, list and delete reach its batches", err)
		case err != nil:
			return nil, err
		default:
			s.closers = append(s.closers, emb.Shutdown)
			o.conn.URL, s.own = emb.ClientURL(), true
			o.conn = o.conn.Plain()
		}
	}
	o.conn.Name = "tinkerfleet-submit"
	o.conn.Logger = s.log
	var extra []nats.Option
	if s.host != nil {
		// Its server ends with that process: no other will take its address.
		extra = append(extra, nats.NoReconnect())
	}
	nc, err := queue.Connect(o.conn, extra...)
	if err != nil {
		if s.host != nil { // it stopped since it said where it serves
			return nil, fmt.Errorf("%w, and its server does not answer: %w", s.host, err)
		}
		return nil, err
	}
	s.nc = nc
	s.closers = append(s.closers, nc.Close)
	// Without an ack timeout, a job whose stream leader stopped before answering would be
	// waited for forever; with one, it is published again (storeWaiter), and the duplicate
	// window keeps it once.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096), jetstream.WithPublishAsyncTimeout(jobAckTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if s.q, err = queue.Bind(ctx, js, o.queue); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// startWorker runs a worker in this process until the session closes, sampling on the real
// service (TINKER_API_KEY) or, with --simulate, on an in-process simulator. A worker that
// stops by itself first (the service refused the key, or could not be reached for 5 minutes)
// calls stopped with why.
func (s *session) startWorker(ctx context.Context, o localOptions, qcfg queue.Config, env *environment, stopped func(error)) error {
	if s.own {
		// No worker but ours can reach this server (a random loopback port): a job delivered
		// and not settled is one a run killed before it could hand it back. Taken back here,
		// for the worker told how far (ReclaimedThrough), and not by a subcommand on the store:
		// status run between the killed run and its rerun made the jobs first deliveries
		// again, and the rerun's worker, told nothing, sampled again those whose results the
		// killed run had stored.
		r, err := s.q.Reclaim(ctx)
		if err != nil {
			return err
		}
		if r.Jobs > 0 {
			s.log.Info("jobs of a run that stopped without handing them back are ready again", "jobs", r.Jobs)
		}
		s.reclaimedThrough = r.Through
	}
	// The in-process worker is the fleet here: it sets up the consumer (submit only binds).
	q, err := queue.Setup(ctx, s.q.JS, qcfg)
	if err != nil {
		return err
	}
	cfg := worker.Config{
		Queue:         q,
		TinkerBaseURL: o.baseURL,
		Concurrency:   o.concurrency,
		ShutdownGrace: 5 * time.Second,
		Logger:        s.log,
		// Their results may be stored already, though they come back as first deliveries.
		ReclaimedThrough: s.reclaimedThrough,
	}
	tokOpts := o.tokenizerOptions(env)
	if o.simulate {
		key := "tml-simulated-" + randomHex(16)
		// The worker long-polls each future from the moment it is accepted, so a result is
		// read within milliseconds of being ready, and never again: the simulator's ReadTTL
		// then drops it (about 1.7 KB a job, kept for the default 30 s: 300 MB at the rate
		// of a local run).
		sim, err := tinkersim.New(tinkersim.Config{APIKeys: []string{key}, Capacity: 256,
			BaseLatency: 20 * time.Millisecond, PerTokenLatency: 200 * time.Microsecond,
			ReadTTL: 5 * time.Second})
		if err != nil {
			return err
		}
		s.closers = append(s.closers, sim.Close)
		simCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s.closers = append(s.closers, cancel)
		url, err := sim.Listen(simCtx, "127.0.0.1:0")
		if err != nil {
			return err
		}
		s.closers = append(s.closers, func() { // runs first, once the worker has stopped
			st := sim.Stats()
			s.log.Info("simulated Tinker service", "samples", st.SamplesCompleted, "failed", st.SamplesFailed,
				"capacity_429s", st.CapacityRejections, "connections", st.Connections)
		})
		cfg.TinkerBaseURL, cfg.TinkerAPIKey = url, tinker.APIKey(key)
	} else {
		key, credentialCmd, err := tinker.CredentialsFrom(env.getenv)
		if err != nil {
			return fmt.Errorf("the local worker needs a Tinker key (or --simulate): %w", err)
		}
		cfg.TinkerAPIKey, cfg.TinkerCredentialCmd = key, credentialCmd
		cfg.TinkerAPIKeyFile = tinker.APIKeyFileOf(env.getenv)
	}
	tokOpts.Logger = s.log
	cfg.Tokenizers = tokenizer.NewRegistry(tokOpts)
	// The worker opens its Tinker session while the jobs are published: a service it cannot
	// reach yet (retried for up to 5 minutes, §2) holds back no job, and the progress line
	// names what it retries.
	var running atomic.Pointer[worker.Worker]
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stopRun, s.opened = stop, make(chan struct{})
	s.held = func() int {
		if w := running.Load(); w != nil {
			return w.ResultsHeld()
		}
		return 0
	}
	s.workers.Go(func() {
		w, err := worker.Open(runCtx, cfg)
		running.Store(w)
		if err != nil {
			// Stopped before opened: awaitOpen's caller reads the cause as soon as it returns.
			if runCtx.Err() == nil {
				stopped(err)
			}
			close(s.opened)
			return
		}
		close(s.opened)
		if err := w.Run(runCtx); err != nil {
			stopped(err)
		}
		w.Close()
	})
	return nil
}

// opening says the in-process worker is still opening its Tinker session.
func (s *session) opening() bool {
	select {
	case <-s.opened:
		return false
	default:
		return s.opened != nil
	}
}

// firstAnswerWait is how long publishing waits for the local worker to open its Tinker
// session: a few of the service's round trips, and the refusal of a key comes with the first.
const firstAnswerWait = 2 * time.Second

// awaitOpen waits until the in-process worker has opened its Tinker session or stopped, for
// at most d: a key the service refuses is refused by its first answer, before any job is
// published, while a service that cannot be reached holds back no job for longer than d.
func (s *session) awaitOpen(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.opened:
	case <-t.C:
	case <-ctx.Done():
	}
}

// close stops the in-process worker and simulator, then the connection and the server.
func (s *session) close() {
	if s.stopRun != nil {
		s.stopRun()
		s.workers.Wait()
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var errUsage = errors.New("usage")

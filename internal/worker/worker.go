package worker

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/dispatch"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/share"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// Worker is one member of the fleet: a Tinker session, a dispatch limiter, a backoff (the
// fleet's, or this process's alone) and the loop that pulls and works jobs. Create it with
// Open, start it with Run, release it with Close.
type Worker struct {
	cfg     Config
	log     *slog.Logger
	codec   *queue.Codec
	slots   chan struct{}
	client  *tinker.Client
	limiter *dispatch.Limiter
	gate    *Gate
	backoff Backoff
	board   *share.Board // the fleet's split of learned capacity (nil: local backoff, or no learning)
	metrics *Metrics
	closers []func()
	health  sessionHealth
	alive   aliveSet
	link    *link
	id      string // in the worker's presence note (attend)
	host    string // its host name, in the presence note and the answer for held results

	pullDone    chan struct{}           // closed when Run stopped pulling and closed the puller
	stop        context.CancelCauseFunc // stops Run with a cause (set by Run; stopRun)
	stopCause   atomic.Pointer[error]   // why stopRun called stop (nil: it did not)
	credential  credentialCheck
	keysTaken   atomic.Uint64 // keys taken from Config.TinkerAPIKeyFile after the service refused the one before
	fetchLinger time.Duration // fetchLinger (a test lengthens it)
	// presenceEvery is how often the worker notes its presence (queue.PresencePeriod; a test
	// shortens it); another worker is silent once three periods pass without its note.
	presenceEvery time.Duration
	// deadLetterRetry is how long a dead letter that failed waits for its next try
	// (deadLetterRetry; a test shortens it).
	deadLetterRetry time.Duration
	// sampled, when set (by a test), is called with each job the service sampled, as its
	// reply arrives: where a bug decoding the reply would panic.
	sampled func(jobs.Job)

	samplers      samplerCache
	samplerStates samplerStates // their queue states, for the gauge
	models        modelCache
	cancelled     cancelSet
	sentBack      sentBack // jobs sent back to wait in the stream, ended here if their batch is cancelled
	retryNotes    retryNotes
	// serviceNoted is when this worker last noted a retry of its Tinker client (unix
	// nanoseconds; noteServiceRetry).
	serviceNoted atomic.Int64
	// Per-job lines that one cause can repeat for every job in hand (thinned).
	retryLog, heldAgainLog, leftLog thinned

	maxDeliver  int
	maxPayload  int64
	settler     *settler         // set by Run
	resultsHeld atomic.Int64     // results the settler holds for another try
	pullHeld    atomic.Int64     // count permits the puller holds for jobs it has not pulled yet
	memory      resultMemory     // what results take between their arrival and their storage
	settlements chan *settlement // kept for next jobs, with their buffers
}

// Run pulls and works jobs until ctx is done, then stops pulling, gives in-flight jobs
// ShutdownGrace to finish, naks the rest and returns. It returns nil after a clean stop. It
// stops the same way by itself when the service refuses the worker's credential, and then
// returns an error wrapping ErrCredentialRefused.
func (w *Worker) Run(ctx context.Context) error {
	ctx, w.stop = context.WithCancelCause(ctx)
	defer w.stop(nil)
	puller, err := w.cfg.Queue.NewJobPuller(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it began: as clean a stop as any
		}
		return err
	}
	// Results are stored and their jobs acked in groups, until every handler has returned.
	if w.settler, err = newSettler(w.cfg.Queue, cap(w.slots), settleLinger, w.settled); err != nil {
		_ = puller.Close(nil)
		return err
	}
	w.settler.hold, w.settler.log = w.holding, w.log
	w.settlements = make(chan *settlement, cap(w.slots))
	// Readers ask over core NATS what the worker holds: a full store refuses its notes too.
	if answering, err := w.cfg.Queue.AnswerHeld(w.heldReport); err != nil {
		w.log.Warn("cannot answer for held results", "err", err)
	} else {
		defer func() { _ = answering.Unsubscribe() }()
	}

	// jobCtx outlives ctx by the grace period: in-flight jobs finish, then are cancelled.
	jobCtx, cancelJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelJobs()

	var bg sync.WaitGroup
	bgCtx, stopBG := context.WithCancel(ctx)
	defer stopBG()
	loaded := make(chan struct{})
	bg.Go(func() { w.cancelled.watch(bgCtx, w.cfg.Queue, w.log, loaded) })
	bg.Go(func() { w.deadLetters(bgCtx) })
	bg.Go(func() { w.endSentBack(bgCtx) })
	if w.board != nil {
		bg.Go(func() { w.splitShares(bgCtx) })
		// A worker that leaves frees its part of the capacity: forget the limit, learn anew.
		bg.Go(func() {
			rewatch(bgCtx, w.cfg.Queue.JS.Conn(), w.log, "capacity share watch", bucketOf(w.cfg.Queue, w.cfg.Queue.Names.BackoffBucket()), func(ctx context.Context) error {
				return w.board.WatchLeaves(ctx, func(string) {
					if w.gate.capacity.forget() {
						w.metrics.forgotLimit("left")
					}
				})
			})
		})
		// So does one that crashed, which takes nothing off the board: its presence notes stop.
		bg.Go(func() {
			silence := &queue.Silence{Window: 3 * w.presenceEvery}
			rewatch(bgCtx, w.cfg.Queue.JS.Conn(), w.log, "presence watch", bucketOf(w.cfg.Queue, w.cfg.Queue.Names.BackoffBucket()), func(ctx context.Context) error {
				return silence.Watch(ctx, w.cfg.Queue, w.silent)
			})
		})
	}
	aliveCtx, stopAlive := context.WithCancel(context.WithoutCancel(ctx)) // outlives the grace period
	defer stopAlive()
	// The flushes end when aliveCtx does: with the server down, a flush waits out its timeout
	// (up to AckWait/3), which held Run past the grace period by as much.
	nc := w.cfg.Queue.JS.Conn()
	flush := func(timeout time.Duration) error {
		fctx, cancel := context.WithTimeout(aliveCtx, timeout)
		defer cancel()
		return nc.FlushWithContext(fctx)
	}
	bg.Go(func() { w.alive.keepAlive(aliveCtx, w.cfg.Queue.Config.AckWait/3, w.link.again, flush) })
	bg.Go(func() { w.link.probe(aliveCtx, flush) })
	// Present to readers (submit) until Run returns, grace period included.
	bg.Go(func() { w.attend(aliveCtx, w.presenceEvery) })
	select { // know the cancelled batches before the first job
	case <-loaded:
	case <-ctx.Done():
	}

	var settling sync.WaitGroup
	settling.Go(func() { w.settler.run(jobCtx) })

	// Job handlers live as long as Run: a goroutine per job would grow a fresh stack for
	// every job (bench comparison 2 found that a few per cent of the worker's CPU).
	var handlers sync.WaitGroup
	deliveries := make(chan delivery)
	spawned := 0
	w.pullDone = make(chan struct{})
	err = w.pull(ctx, puller, func(d delivery) {
		if spawned < cap(w.slots) {
			select {
			case deliveries <- d: // an idle handler took it
				return
			default:
			}
			spawned++
			handlers.Go(func() { w.handleAll(jobCtx, d, deliveries) })
			return
		}
		deliveries <- d // d holds a slot, so a handler is finishing and will take it
	})
	// Samples already sent finish within the grace period; jobs not yet sent go back now.
	graceOver := time.Now().Add(w.cfg.ShutdownGrace)
	w.gate.capacity.close()
	// Close hands back what the last pull request still brings: the server may answer it now.
	if cerr := puller.Close(w.alive.holds); cerr != nil {
		w.log.Debug("close job puller", "err", cerr)
	}
	close(deliveries)
	close(w.pullDone)

	done := make(chan struct{})
	go func() { handlers.Wait(); close(done) }() // ends when every job handler has returned.
	select {
	case <-done:
	case <-time.After(time.Until(graceOver)):
		w.log.Warn("shutdown grace period over: handing unfinished jobs back", "grace", w.cfg.ShutdownGrace)
		cancelJobs()
		<-done
	}
	w.settler.close(graceOver) // results the stream cannot store yet are tried until then
	settling.Wait()
	// Acks and naks are fire-and-forget: make sure the last of them left before returning.
	if nc := w.cfg.Queue.JS.Conn(); nc != nil && nc.IsConnected() {
		_ = nc.FlushTimeout(5 * time.Second)
	}
	stopBG()
	stopAlive()
	bg.Wait()
	if cause := context.Cause(ctx); errors.Is(cause, ErrCredentialRefused) {
		return cause
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// delivery is one job message and the dispatch reservation taken for it before the fetch.
type delivery struct {
	msg jetstream.Msg
	r   *dispatch.Reservation
}

// handleAll works first, then every delivery that comes until deliveries is closed. Each
// delivery holds a job slot and a reservation, freed when it is settled (by the settler for
// the jobs handed to it).
func (w *Worker) handleAll(ctx context.Context, first delivery, deliveries <-chan delivery) {
	d, ok := first, true
	for ok {
		if !w.handle(ctx, d) {
			w.free(d.r)
		}
		d, ok = <-deliveries
	}
}

const (
	// fetchExpiry is how long one pull request waits for jobs.
	fetchExpiry = time.Second
	// fetchLinger is how long the pull loop waits, once a job slot is free, for more to free
	// up before it asks for jobs. Where the service has latency, jobs finish one by one, and
	// without it a pull request brought 2.3 jobs (bench comparison 2 with 20 ms samples; 14-21
	// with it). It delays a free slot's next job by at most that: nothing next to a sample.
	fetchLinger = 2 * time.Millisecond
)

// pull fetches jobs while ctx lasts, never more than it has free job slots and reserved
// dispatch count permits for.
func (w *Worker) pull(ctx context.Context, puller *queue.JobPuller, start func(delivery)) error {
	const maxBatch = 64
	var held []*dispatch.Reservation
	defer func() {
		for _, r := range held {
			w.free(r)
		}
		w.pullHeld.Add(-int64(len(held)))
	}()
	var lastWarn time.Time
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		// Block for the first slot and permit, then take more only while they are free now.
		if len(held) == 0 {
			select {
			case w.slots <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			r, err := w.limiter.Reserve(ctx)
			if err != nil {
				<-w.slots
				return err
			}
			held = append(held, &r)
			w.pullHeld.Add(1)
			// More slots free up meanwhile: one pull request then brings several jobs.
			w.sleep(ctx, w.fetchLinger)
		}
		for len(held) < maxBatch && w.limiter.Free() > 0 {
			select {
			case w.slots <- struct{}{}:
			default:
				goto fetch
			}
			r, ok := w.limiter.TryReserve()
			if !ok {
				<-w.slots
				goto fetch
			}
			held = append(held, &r)
			w.pullHeld.Add(1)
		}
	fetch:
		got, err := puller.Pull(ctx, len(held), fetchExpiry, func(msg jetstream.Msg) {
			r := held[len(held)-1]
			held = held[:len(held)-1]
			w.pullHeld.Add(-1)
			w.metrics.pulled()
			start(delivery{msg: msg, r: r})
		})
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			w.metrics.fetched("error")
			if now := time.Now(); now.Sub(lastWarn) >= 10*time.Second { // one line per outage second is noise
				w.log.Warn("fetch jobs", "err", err)
				lastWarn = now
			}
			w.sleep(ctx, 250*time.Millisecond)
		case got > 0:
			w.metrics.fetched("jobs")
		default:
			w.metrics.fetched("empty")
		}
	}
}

func (w *Worker) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

package backoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultBucket is the KV bucket used when Config.Bucket is empty.
const DefaultBucket = "tinkerfleet_backoff"

// Defaults for the watch loop.
const (
	// DefaultResync is how often the watcher re-reads the key and re-probes
	// the server clock, catching a watch that went silent (JS notes §6).
	DefaultResync = 10 * time.Second
	// DefaultWakeJitter is Config.WakeJitter's default.
	DefaultWakeJitter = 250 * time.Millisecond
	minRetry          = 50 * time.Millisecond
	maxRetry          = 5 * time.Second
	maxCASRetries     = 1000
)

// Config configures Open.
type Config struct {
	// Bucket is the KV bucket (default "tinkerfleet_backoff"); created with
	// History 1 if missing, bound otherwise.
	Bucket string
	// Account is the KV key, normally AccountKey(baseURL, apiKey). Required.
	Account string
	// Replicas of the bucket when it is created (default 1).
	Replicas int
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Now is the local clock (default time.Now). Tests inject a skewed one.
	Now func() time.Time
	// OnChange, if set, is called (serialised, from the goroutine that
	// learned it) whenever the in-memory deadline moves forward.
	OnChange func(State)
	// Resync is the period of the safety re-read (default 10 s).
	Resync time.Duration
	// WakeJitter spreads the end of a pause: a Wait that found the fleet paused
	// returns at a random point in the first WakeJitter after the deadline,
	// re-checking the deadline until then. The first submission to wake meets
	// any 429 that is still there, and its signal (propagated in well under a
	// millisecond) holds back the rest, so the whole fleet sends about as much
	// into a 429 window as one worker would. Default 250 ms; negative disables.
	WakeJitter time.Duration
}

var validKey = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

// record is the JSON value stored under the account key. Times are the
// server's (unix ns). The deadline it stands for is
// max(Floor, Created + D), where Created is the server-assigned timestamp
// of the entry itself, so no writer's clock enters it.
type record struct {
	Floor       int64  `json:"floor_ns"`
	D           int64  `json:"d_ns"`
	Reason      string `json:"reason,omitempty"`
	FloorReason string `json:"floor_reason,omitempty"`
}

// deadline is the deadline r stands for, stored at created, and its reason. It is at most
// MaxPause past created: capped reports that r asked for more (a client with write access to
// the bucket, or a bug, wrote a pause of years), which would pause the fleet for ever.
func (r record) deadline(created time.Time) (dl int64, reason string, capped bool) {
	dl, reason = created.UnixNano()+min(max(r.D, 0), int64(MaxPause)), r.Reason
	if r.D > int64(MaxPause) {
		capped = true
	}
	if r.Floor > dl {
		dl, reason = r.Floor, r.FloorReason
	}
	if limit := created.UnixNano() + int64(MaxPause); dl > limit {
		dl, capped = limit, true
	}
	return dl, reason, capped
}

// Fleet is the backoff deadline of one Tinker account shared by every worker
// through a JetStream KV key, kept in memory by a watch. Until, Active and
// Recent are atomic loads; Signal and Open do network I/O.
type Fleet struct {
	kv       jetstream.KeyValue
	js       jetstream.JetStream // to create the bucket again if it goes (restore)
	cfg      Config
	nc       *nats.Conn
	key      string
	log      *slog.Logger
	now      func() time.Time
	onChange func(State)
	resync   time.Duration
	jitter   func() time.Duration // nil: no wake jitter

	deadline atomic.Int64 // server unix ns, 0 = none; only moves forward
	offLo    atomic.Int64 // lower bound of server − local clock, ns
	offHi    atomic.Int64 // upper bound of server − local clock, ns
	// unwritten is the latest deadline this worker applied for a Signal whose write failed
	// (server unix ns, 0 = none): up to it, the deadline in memory may be known here only.
	unwritten atomic.Int64
	// retrying is set while a Signal writes again a deadline that a failed write left
	// unwritten: the others of a burst of 429s leave it to that one.
	retrying atomic.Bool

	mu      sync.Mutex // guards reason, lastRev and created
	reason  string
	lastRev uint64
	// created is when the bucket's stream was created, as the last probe read it: another
	// time means another stream, whose revisions start again from 1.
	created time.Time
	cbMu    sync.Mutex // serialises OnChange
	n       notifier

	watches  atomic.Int64   // watchers created, for tests and debugging
	stopping sync.WaitGroup // old watchers being stopped (deleting their consumers)

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

// Open binds (or creates) the bucket, learns the server clock offset and the
// current state, and starts the watch goroutine; Close stops it.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Fleet, error) {
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if !validKey.MatchString(cfg.Account) {
		return nil, fmt.Errorf("backoff: invalid account key %q", cfg.Account)
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.WakeJitter == 0 {
		cfg.WakeJitter = DefaultWakeJitter
	}
	kv, err := bindBucket(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	f := &Fleet{
		kv:       kv,
		js:       js,
		cfg:      cfg,
		nc:       js.Conn(),
		key:      cfg.Account,
		log:      cfg.Logger.With("bucket", cfg.Bucket, "account", cfg.Account),
		now:      cfg.Now,
		onChange: cfg.OnChange,
		resync:   cfg.Resync,
		jitter:   wakeJitter(cfg.WakeJitter),
		done:     make(chan struct{}),
	}
	if err := f.firstRead(ctx); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go f.run(runCtx)
	return f, nil
}

// firstRead probes the server's clock and reads the key. In a cluster whose bucket was just
// created (workers starting together on a fresh cluster), no replica may answer yet: "no
// responders", or no answer at all. It tries again for a few seconds then, and gives any other
// error (a permission, say) at once.
func (f *Fleet) firstRead(ctx context.Context) error {
	return tryAgain(ctx, firstReadAttempts, notYet, func() error {
		actx, cancel := context.WithTimeout(ctx, firstReadAttempt)
		defer cancel()
		_, err := f.probe(actx)
		if err == nil {
			_, err = f.reread(actx)
		}
		return err
	})
}

// notYet reports whether err is a cluster's bucket that no replica answers for yet (see
// firstRead).
func notYet(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
}

// tryAgain calls try until it succeeds, fails with an error for which again is false (one
// that waiting does not mend), has been called attempts times, or ctx ends; it waits 50 ms
// after the first failure, doubling to 2 s. It returns try's last error, or ctx's when ctx
// ends during a wait.
func tryAgain(ctx context.Context, attempts int, again func(error) bool, try func() error) error {
	delay := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := try()
		if err == nil || !again(err) || attempt == attempts || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// The first read's attempts (about 5 s of waits between them) and the bound of each.
const (
	firstReadAttempts = 8
	firstReadAttempt  = 5 * time.Second
)

// wakeJitter draws a waiter's delay after the deadline, uniform in [0, max).
func wakeJitter(max time.Duration) func() time.Duration {
	if max <= 0 {
		return nil
	}
	return func() time.Duration { return rand.N(max) }
}

func bindBucket(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("backoff: bind bucket %s: %w", cfg.Bucket, err)
	}
	bucket := jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "tinkerfleet fleet-wide backoff deadlines per Tinker account",
		History:     1,
		Replicas:    cfg.Replicas,
		Storage:     jetstream.FileStorage,
	}
	err = tryAgain(ctx, createAttempts, serverFault, func() error {
		var err error
		kv, err = js.CreateKeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketExists) { // lost a creation race
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("backoff: create bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// createAttempts bounds the creations of the bucket that a server fault fails (about 1.5 s
// of waits between them).
const createAttempts = 6

// serverFault reports whether err is the JetStream API's own failure (a 5xx), which may pass:
// a bucket made again just after it was deleted, when nats-server removes the account's
// emptied store directories in the background, can fail with "error creating store for
// stream" while another worker's creation of it goes through.
func serverFault(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code >= 500
}

// Close stops the watch goroutine, and waits for the stops of the watches it replaced
// (stop) while the connection is up. With the connection down, each of those stops waits
// out nats.go's JetStream API timeout (5 s) for a consumer delete that cannot be sent, and
// the server drops the consumer by itself: they end by that timeout, after Close, which a
// worker's stop no longer waits for. It is idempotent.
func (f *Fleet) Close() error {
	f.closeOnce.Do(func() {
		f.cancel()
		<-f.done
		if f.nc == nil || f.nc.IsConnected() {
			f.stopping.Wait()
		}
	})
	return nil
}

// Until returns the deadline in local clock terms (zero = none): the server
// deadline minus the lower bound of the offset, so an offset error can only
// lengthen a pause, by at most the one-way latency of the probe. Atomic loads
// only; safe for the dispatch fast path.
func (f *Fleet) Until() time.Time {
	d := f.deadline.Load()
	if d == 0 {
		return time.Time{}
	}
	return time.Unix(0, d-f.offLo.Load())
}

// Active reports whether a backoff is in force now.
func (f *Fleet) Active() bool { return State{Until: f.Until()}.Active(f.now()) }

// Recent reports whether a backoff is active or ended less than window ago (§5.2).
func (f *Fleet) Recent(window time.Duration) bool { return recent(f.Until(), f.now(), window) }

// Wait blocks until no backoff is active: it returns at once if none is,
// otherwise when the deadline passes, re-blocking if the deadline was
// extended meanwhile (woken by the watch, not by a polling loop). It returns
// ctx.Err() if ctx ends first.
func (f *Fleet) Wait(ctx context.Context) error {
	return waitUntil(ctx, &f.n, f.now, f.Until, f.jitter)
}

// State returns the current state.
func (f *Fleet) State() State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return State{Until: f.Until(), Reason: f.reason, Revision: f.lastRev}
}

// Signal extends the fleet's deadline to at least (server now) + d. It never
// shortens it: the new entry's floor is the current deadline, written with a
// compare-and-swap on the revision read (kv.Create for the first write), and
// retried on conflict. It returns without writing if the deadline known in
// memory already covers now + d for sure, unless a failed Signal of this
// worker may have set that deadline alone (then one Signal at a time writes
// it again, the others returning at once). On success the local copy is
// extended at once to a lower bound of the new deadline; the watch then
// delivers the exact one.
func (f *Fleet) Signal(ctx context.Context, reason string, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	d = min(d, MaxPause) // no worker honours more
	if dl := f.deadline.Load(); f.covers(dl, d) {
		if dl > f.unwritten.Load() {
			return nil
		}
		// A deadline in memory no later than one of a failed write may be this worker's
		// alone: it spares no signal its write, or the fleet would never learn of the pause.
		// But one write at a time: while NATS cannot be reached, each write waits out its
		// timeout, and a burst of 429s would be as many waits, and warnings.
		if !f.retrying.CompareAndSwap(false, true) {
			return nil
		}
		defer f.retrying.Store(false)
	}
	// This worker backs off at once, whatever happens to the write: a lower bound of the
	// deadline about to be stored (or, if NATS is unreachable, of the one it would have).
	own := f.now().UnixNano() + f.offLo.Load() + int64(d)
	f.extend(own, reason, 0)
	err := f.write(ctx, reason, d)
	if err != nil {
		for {
			old := f.unwritten.Load()
			if own <= old || f.unwritten.CompareAndSwap(old, own) {
				break
			}
		}
	}
	return err
}

// write stores a deadline of at least (server now) + d for Signal, with a compare-and-swap
// on the revision read, retried on conflict.
func (f *Fleet) write(ctx context.Context, reason string, d time.Duration) error {
	for range maxCASRetries {
		var (
			rev    uint64
			cur    int64
			curWhy string
		)
		e, err := f.kv.Get(ctx, f.key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("backoff: signal %s: read: %w", reason, err)
		default:
			f.apply(e, f.now())
			rev = e.Revision()
			if r, ok := decode(e); ok {
				cur, curWhy, _ = r.deadline(e.Created())
			}
		}
		if f.covers(cur, d) {
			return nil
		}
		val, err := json.Marshal(record{Floor: cur, D: int64(d), Reason: reason, FloorReason: curWhy})
		if err != nil {
			return fmt.Errorf("backoff: signal %s: encode: %w", reason, err)
		}
		t0 := f.now()
		if rev == 0 {
			_, err = f.kv.Create(ctx, f.key, val)
			if errors.Is(err, jetstream.ErrKeyExists) || wrongLastSequence(err) {
				continue
			}
		} else {
			_, err = f.kv.Update(ctx, f.key, val, rev)
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("backoff: signal %s: write: %w", reason, err)
		}
		// The entry's server timestamp is ≥ t0 + offLo, so this is a lower
		// bound of the deadline just stored: safe to apply before the watch
		// delivers the exact value.
		f.extend(max(cur, t0.UnixNano()+f.offLo.Load()+int64(d)), reason, 0)
		f.log.Debug("backoff signalled", "reason", reason, "duration", d)
		return nil
	}
	return fmt.Errorf("backoff: signal %s: gave up after %d conflicting writes", reason, maxCASRetries)
}

// wrongLastSequence reports whether err is the server's answer to a write that another write
// came before. Create gives it as ErrKeyExists, except where the key was deleted: it then
// writes over the delete mark, and a replicated bucket's answer to that write losing a race
// (code 10164) comes back bare.
func wrongLastSequence(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// covers reports whether a server deadline is surely ≥ server now + d, up to
// the coalescing slack, using the upper bound of the clock offset (server now ≤
// local now + offHi). The slack (a tenth of d, at most 250 ms) makes a burst of
// 429s one write instead of one each, each later by a few milliseconds; a pause
// can thus end up to the slack before now + d of the burst's last signal.
func (f *Fleet) covers(deadline int64, d time.Duration) bool {
	slack := min(d/10, 250*time.Millisecond)
	return deadline != 0 && deadline >= f.now().UnixNano()+f.offHi.Load()+int64(d-slack)
}

func decode(e jetstream.KeyValueEntry) (record, bool) {
	if e.Operation() != jetstream.KeyValuePut {
		return record{}, false
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return record{}, false
	}
	return r, true
}

// apply learns from an entry received at local time recv: a clock-offset
// lower bound (the entry was created before it was received) and, if the
// revision is new, its deadline. It reports whether the revision was new.
func (f *Fleet) apply(e jetstream.KeyValueEntry, recv time.Time) bool {
	f.learnLo(e.Created().UnixNano() - recv.UnixNano())
	f.mu.Lock()
	if e.Revision() <= f.lastRev {
		f.mu.Unlock()
		return false
	}
	f.lastRev = e.Revision()
	f.mu.Unlock()
	if r, ok := decode(e); ok {
		dl, why, capped := r.deadline(e.Created())
		if capped { // once per entry: only a new revision gets here
			f.log.Warn("backoff: a pause longer than the longest honoured was capped", "revision", e.Revision(),
				"reason", why, "asked", time.Duration(max(r.Floor-e.Created().UnixNano(), r.D)), "max", MaxPause)
		}
		f.extend(dl, why, e.Revision())
	} else if e.Operation() == jetstream.KeyValuePut {
		f.log.Warn("backoff: undecodable entry ignored", "revision", e.Revision())
	}
	return true
}

// extend moves the in-memory deadline forward to dl (server ns), never back.
func (f *Fleet) extend(dl int64, reason string, rev uint64) {
	f.mu.Lock()
	if dl <= f.deadline.Load() {
		f.mu.Unlock()
		return
	}
	f.deadline.Store(dl)
	f.reason = reason
	f.mu.Unlock()
	f.n.notify()
	if f.onChange != nil {
		f.cbMu.Lock()
		defer f.cbMu.Unlock()
		st := f.State()
		if rev != 0 {
			st.Revision = max(st.Revision, rev)
		}
		f.onChange(st)
	}
}

// learnLo raises the lower bound of the offset (keeping hi ≥ lo).
func (f *Fleet) learnLo(sample int64) {
	for {
		old := f.offLo.Load()
		if sample <= old || f.offLo.CompareAndSwap(old, sample) {
			break
		}
	}
	for {
		hi := f.offHi.Load()
		lo := f.offLo.Load()
		if hi >= lo || f.offHi.CompareAndSwap(hi, lo) {
			return
		}
	}
}

// probe measures the server clock: the bucket's stream info carries the
// server's timestamp ts, taken between local t0 and t1, so the offset is in
// [ts − t1, ts − t0]. The bounds are reset by every probe (the clocks drift).
// The same info says when the stream was created: if that changed, the bucket
// was deleted and created again, and its revisions started again from 1.
// Then probe forgets the last revision seen and reports that the watch, which
// waits for a revision past it, must be made again.
func (f *Fleet) probe(ctx context.Context) (recreated bool, err error) {
	t0 := f.now()
	st, err := f.kv.Status(ctx)
	t1 := f.now()
	if err != nil {
		return false, fmt.Errorf("backoff: probe server clock: %w", err)
	}
	var ts time.Time
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
		ts = bs.StreamInfo().TimeStamp
		recreated = f.streamCreated(bs.StreamInfo().Created)
	}
	if ts.IsZero() {
		// Server too old to report its time: trust the local clock.
		f.log.Warn("backoff: server reports no timestamp; assuming synchronised clocks")
		f.offLo.Store(0)
		f.offHi.Store(0)
		return recreated, nil
	}
	f.offLo.Store(ts.UnixNano() - t1.UnixNano())
	f.offHi.Store(ts.UnixNano() - t0.UnixNano())
	return recreated, nil
}

// streamCreated records when the bucket's stream was created, and reports whether that is
// another stream than the one seen before; then the last revision seen is forgotten.
func (f *Fleet) streamCreated(at time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	other := !f.created.IsZero() && !at.Equal(f.created)
	f.created = at
	if other {
		f.lastRev = 0
	}
	return other
}

// restore creates the bucket again if err says it is gone (deleted, or a store lost), so that
// the fleet backoff works again without a restart: every Signal failed meanwhile. The bucket's
// new revisions start from 1, so the last revision seen is forgotten. It reports whether it
// made the bucket again. A watch made while the bucket is gone (a server back without its
// store) fails with the older nats package's ErrStreamNotFound, which KeyValue.Watch
// subscribes through.
func (f *Fleet) restore(ctx context.Context, err error) bool {
	gone := errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		errors.Is(err, nats.ErrStreamNotFound)
	if !gone && !errors.Is(err, nats.ErrNoResponders) {
		return false
	}
	if gone {
		// Whichever bucket is watched next, made again here or by another worker (which may
		// be done before this one's next try), is a new stream whose revisions start again
		// from 1: a watch resuming after the last revision seen would miss every pause up to
		// it, until the next resync. Watching an unchanged bucket from its start only
		// delivers its entry again, which moves no deadline.
		f.mu.Lock()
		f.lastRev = 0
		f.mu.Unlock()
	}
	if _, err := f.js.KeyValue(ctx, f.cfg.Bucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		return false // there (no responders: a leader election, say), or JetStream cannot say
	}
	if _, err := bindBucket(ctx, f.js, f.cfg); err != nil {
		f.log.Warn("backoff: the bucket is gone and could not be made again; the fleet backoff is off meanwhile", "err", err)
		return false
	}
	f.log.Warn("backoff: the bucket was gone; made it again")
	f.mu.Lock()
	f.lastRev, f.created = 0, time.Time{}
	f.mu.Unlock()
	return true
}

// reread gets the key and applies it. It reports whether the watch must be
// restarted: the entry was newer than anything the watch delivered (the
// watch is silent), or older than the last revision seen (the stream was
// recreated, so resuming from lastRev+1 would wait forever).
func (f *Fleet) reread(ctx context.Context) (rewatch bool, err error) {
	e, err := f.kv.Get(ctx, f.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("backoff: read %s: %w", f.key, err)
	}
	f.mu.Lock()
	last := f.lastRev
	if e.Revision() < last {
		f.lastRev = 0 // store reset: follow the new revisions
	}
	f.mu.Unlock()
	isNew := f.apply(e, f.now())
	return isNew && last != 0 || e.Revision() < last, nil
}

// run owns the watch: it (re)creates the watcher from the last revision
// seen, with bounded exponential back-off, re-reads the key after every
// (re)watch, on reconnect and every Resync, and stops the old watcher
// before making a new one, so no consumer leaks.
func (f *Fleet) run(ctx context.Context) {
	defer close(f.done)
	var status chan nats.Status
	if f.nc != nil {
		status = f.nc.StatusChanged(nats.CONNECTED)
		defer f.nc.RemoveStatusListener(status)
	}
	ticker := time.NewTicker(f.resync)
	defer ticker.Stop()
	retry := minRetry
	for ctx.Err() == nil {
		w, err := f.watch(ctx)
		rewatch := false
		if err == nil {
			// An entry older than the last one seen (the bucket was made again) leaves this
			// watch waiting for a revision the new bucket has not reached: make it again.
			rewatch, err = f.reread(ctx)
		}
		if err == nil && rewatch {
			f.stop(ctx, w)
			continue
		}
		if err != nil {
			if w != nil {
				f.stop(ctx, w)
			}
			if f.restore(ctx, err) {
				continue
			}
			f.log.Debug("backoff: watch not ready, retrying", "err", err, "in", retry)
			if !sleep(ctx, retry) {
				return
			}
			retry = min(2*retry, maxRetry)
			continue
		}
		healthy := f.follow(ctx, w, status, ticker)
		f.stop(ctx, w)
		if healthy {
			retry = minRetry
		} else {
			if !sleep(ctx, retry) {
				return
			}
			retry = min(2*retry, maxRetry)
		}
	}
}

// stop stops an old watcher in the background: Stop deletes the watch's
// consumer with a request that can take up to the JetStream API timeout while
// the connection is down, and the new watch must not wait for it. Close waits
// for these while the connection is up. Once ctx is done with the connection
// down it leaves w to ctx's end, which unsubscribes it (the watch is tied to
// ctx, see watch), and the server drops the consumer by itself: Close waited
// out that timeout for nothing, and a worker whose NATS server was gone took
// 5 s more to stop.
func (f *Fleet) stop(ctx context.Context, w jetstream.KeyWatcher) {
	if ctx.Err() != nil && f.nc != nil && !f.nc.IsConnected() {
		return
	}
	f.stopping.Go(func() { _ = w.Stop() })
}

func (f *Fleet) watch(ctx context.Context) (jetstream.KeyWatcher, error) {
	f.mu.Lock()
	last := f.lastRev
	f.mu.Unlock()
	var opts []jetstream.WatchOpt
	if last > 0 {
		opts = append(opts, jetstream.ResumeFromRevision(last+1))
	}
	// ctx must outlive the watcher: the subscription is tied to it (a
	// short-lived timeout context here closes the watch when it expires).
	w, err := f.kv.Watch(ctx, f.key, opts...)
	if err != nil {
		return nil, fmt.Errorf("backoff: watch %s: %w", f.key, err)
	}
	f.watches.Add(1)
	return w, nil
}

// follow applies watch updates until the watch must be replaced: its channel
// closed (not healthy), the connection reconnected, or a re-read found that
// it missed an update. It returns whether the watch had been working.
func (f *Fleet) follow(ctx context.Context, w jetstream.KeyWatcher, status chan nats.Status, ticker *time.Ticker) bool {
	for {
		select {
		case <-ctx.Done():
			return true
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil { // ctx's end closes the watcher too: either may come first
					return true
				}
				f.log.Info("backoff: watch closed; re-watching")
				return false
			}
			if e != nil {
				f.apply(e, f.now())
			}
		case <-status:
			f.log.Info("backoff: reconnected; re-reading and re-watching")
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, _ = f.probe(rctx)
			cancel()
			return true
		case <-ticker.C:
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			recreated, err := f.probe(rctx)
			if err != nil && f.restore(rctx, err) {
				cancel()
				return true // a new bucket: watch it from its start
			}
			if recreated {
				cancel()
				f.log.Info("backoff: the bucket was made again; re-watching it")
				return true
			}
			rewatch, err := f.reread(rctx)
			cancel()
			if err != nil {
				f.log.Debug("backoff: re-read failed", "err", err)
				continue
			}
			if rewatch {
				f.log.Info("backoff: watch missed an update; re-watching")
				return true
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

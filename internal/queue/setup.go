package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Config sizes the streams and the consumer. Zero values take the defaults documented on each
// field (see docs/architecture.md, "Numbers").
type Config struct {
	// Prefix names everything (see Names); default DefaultPrefix.
	Prefix string
	// Replicas of every stream and bucket: 1 for a single server, 3 on a cluster.
	Replicas int
	// AckWait is how long a delivered job may go without an ack or InProgress; default 30s.
	// Setup does not shorten it while workers run (refuseUnderWorkers).
	AckWait time.Duration
	// MaxDeliver is how many times a job is delivered to be worked on before it is
	// dead-lettered; default 10, negative (or math.MaxInt) for no limit. The consumer allows
	// one delivery more, on which a worker dead-letters the job without working it: that
	// delivery of a job whose last one died with its worker comes once the ack wait has
	// passed, to whichever worker pulls next, even one that starts later. (The server's
	// MAX_DELIVERIES advisory, the other way to learn of such a job, goes once to whoever
	// listens at that moment.) Setup does not change it while workers run.
	MaxDeliver int
	// MaxAckPending caps the jobs in flight across the whole fleet; default 1000. Size it to
	// workers × per-worker concurrency (deploy/README.md).
	MaxAckPending int
	// DuplicateWindow is how long job ids are remembered; default 2h, so re-running a submit
	// within it publishes nothing twice. Dead letters' ids are remembered as long (at most
	// DeadMaxAge). (Results carry no id: one per job subject is kept.)
	DuplicateWindow time.Duration
	// ResultsMaxAge is how long results are kept; default 7 days.
	ResultsMaxAge time.Duration
	// DeadMaxAge is how long dead-lettered payloads are kept; default 30 days.
	DeadMaxAge time.Duration
}

func (c Config) withDefaults() Config {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	switch c.MaxDeliver {
	case 0:
		c.MaxDeliver = 10
	case math.MaxInt:
		// No limit, as it says: the consumer's one delivery more would wrap around to a
		// negative MaxDeliver, which the server stores as -1, and a worker started again with
		// the same flag found the consumer set up otherwise, and refused to start.
		c.MaxDeliver = -1
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 1000
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = 2 * time.Hour
	}
	if c.ResultsMaxAge == 0 {
		c.ResultsMaxAge = 7 * 24 * time.Hour
	}
	if c.DeadMaxAge == 0 {
		c.DeadMaxAge = 30 * 24 * time.Hour
	}
	return c
}

// Queue is a set-up deployment: its streams, consumer and buckets, ready to use.
type Queue struct {
	// Names of everything in the deployment.
	Names Names
	// JS is the JetStream context the queue was set up with.
	JS jetstream.JetStream
	// Jobs, Results and Dead are the three streams.
	Jobs, Results, Dead jetstream.Stream
	// Batches holds the batch manifests.
	Batches jetstream.KeyValue
	// Config is the configuration after defaults, with the consumer's as the server holds it.
	Config Config
}

// extraDeliveryKey is the consumer's metadata that tells the extra delivery: it holds the
// deliveries to work on (Config.MaxDeliver), one less than the consumer's MaxDeliver.
const extraDeliveryKey = "tinkerfleet_max_deliver"

// Setup creates or updates the streams, the shared consumer and the batch bucket, so that
// workers can start in any order. It is the workers' (and operators') call: their
// configuration wins, but for a shorter AckWait or another MaxDeliver while workers run,
// which it refuses (refuseUnderWorkers). Programs that only publish and read use Bind.
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config) (*Queue, error) {
	return ensure(ctx, js, cfg, true)
}

// Bind uses the streams and bucket as they are, creating with cfg only what does not exist
// yet, and leaves the workers' consumer alone. submit binds, so that running it with default
// flags never rewrites a fleet's replicas, ack wait or in-flight cap.
func Bind(ctx context.Context, js jetstream.JetStream, cfg Config) (*Queue, error) {
	return ensure(ctx, js, cfg, false)
}

func ensure(ctx context.Context, js jetstream.JetStream, cfg Config, update bool) (*Queue, error) {
	cfg = cfg.withDefaults()
	names, err := NewNames(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	q := &Queue{Names: names, JS: js, Config: cfg}
	q.Jobs, err = ensureStream(ctx, js, update, names, jetstream.StreamConfig{
		Name:        names.JobsStream(),
		Description: "tinkerfleet jobs waiting for a worker",
		Subjects:    []string{names.Prefix + ".jobs.*"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.DuplicateWindow,
	})
	if err != nil {
		return nil, err
	}
	q.Results, err = ensureStream(ctx, js, update, names, jetstream.StreamConfig{
		Name:        names.ResultsStream(),
		Description: "tinkerfleet results, one per job",
		Subjects:    []string{names.Prefix + ".results.*.*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.ResultsMaxAge,
		// One result per job subject, and the first one stored is final: a second is refused
		// (ResultStored reads the refusal), whenever it comes. Results carry no Nats-Msg-Id:
		// the duplicate window would keep an id per result in the server's memory for hours,
		// to do what the subject limit does for as long as the result is kept.
		MaxMsgsPerSubject:    1,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		// For workers of earlier versions, which still send an id with each result.
		Duplicates: min(cfg.DuplicateWindow, cfg.ResultsMaxAge),
	})
	if err != nil {
		return nil, err
	}
	q.Dead, err = ensureStream(ctx, js, update, names, jetstream.StreamConfig{
		Name:        names.DeadStream(),
		Description: "tinkerfleet payloads of jobs that ran out of deliveries",
		Subjects:    []string{names.Prefix + ".dead.*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.DeadMaxAge,
		// PublishDead's ids, for as long as the jobs': the server's default of 2 minutes let
		// each later try of a dead letter (every worker hears of the job, and one that failed
		// tries again for as long as its result cannot be stored) add another copy.
		Duplicates: min(cfg.DuplicateWindow, cfg.DeadMaxAge),
	})
	if err != nil {
		return nil, err
	}
	consumer := jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		Description:   "shared by every tinkerfleet worker",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: cfg.MaxAckPending,
		Replicas:      cfg.Replicas,
	}
	if cfg.MaxDeliver > 0 {
		consumer.MaxDeliver = cfg.MaxDeliver + 1
		consumer.Metadata = map[string]string{extraDeliveryKey: strconv.Itoa(cfg.MaxDeliver)}
	}
	var c jetstream.Consumer
	if update {
		if err := q.refuseUnderWorkers(ctx, cfg); err != nil {
			return nil, err
		}
		createOrUpdate := func(ctx context.Context) (jetstream.Consumer, error) {
			return js.CreateOrUpdateConsumer(ctx, names.JobsStream(), consumer)
		}
		c, err = retry(ctx, createOrUpdate)
		// Just after a --replicas change the stream may still be growing its replicas (it
		// copies its jobs to them first), and the server refuses the consumer more of them
		// until it has: a worker's start waits for that rather than fail.
		for start := time.Now(); replicasGrowing(err) && time.Since(start) < replicasGrowWait && ctx.Err() == nil; {
			c, err = retry(ctx, createOrUpdate)
		}
		if err != nil {
			return nil, fmt.Errorf("queue: consumer %s on %s: %w", ConsumerName, names.JobsStream(), err)
		}
	} else if c, err = js.Consumer(ctx, names.JobsStream(), ConsumerName); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("queue: consumer %s on %s: %w", ConsumerName, names.JobsStream(), err)
	}
	if c != nil {
		// Another worker (or the operator) may have set the consumer up with other flags:
		// what the server holds is what redelivery follows.
		got := c.CachedInfo().Config
		q.Config.AckWait, q.Config.MaxAckPending = got.AckWait, got.MaxAckPending
		q.Config.MaxDeliver = deliveries(got)
	}
	if update {
		// The backoff bucket is made by the first worker that opens the fleet backoff, with
		// the replicas of that moment, and never again: a --replicas change reaches it here,
		// or the fleet's backoff, capacity shares and presence notes stay on one node.
		if err := ensureReplicas(ctx, js, "KV_"+names.BackoffBucket(), cfg.Replicas); err != nil {
			return nil, err
		}
	}
	bucket := jetstream.KeyValueConfig{
		Bucket:      names.BatchesBucket(),
		Description: "tinkerfleet batch manifests",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	}
	q.Batches, err = retry(ctx, func(ctx context.Context) (jetstream.KeyValue, error) {
		if update {
			return js.CreateOrUpdateKeyValue(ctx, bucket)
		}
		kv, err := js.KeyValue(ctx, bucket.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return js.CreateKeyValue(ctx, bucket)
		}
		return kv, err
	})
	if err != nil {
		return nil, fmt.Errorf("queue: bucket %s: %w", names.BatchesBucket(), err)
	}
	return q, nil
}

// refuseUnderWorkers refuses a setup that would change under running workers what each of
// them read of the consumer once, at its own setup: a shorter ack wait (they keep their jobs
// alive with an InProgress every third of theirs, and the server would give the jobs they hold
// to the next worker that pulls, to be sampled twice), or another number of deliveries (they
// would take another delivery than the server for a job's last). A longer ack wait, or the
// settings the consumer has, are set up at any time; so is any change once no worker runs.
// Workers are known by their presence notes, or, where nobody notes them (no worker backs off
// fleet-wide), by their pull requests waiting.
func (q *Queue) refuseUnderWorkers(ctx context.Context, want Config) error {
	c, err := retry(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
		c, err := q.JS.Consumer(ctx, q.Names.JobsStream(), ConsumerName)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, nil
		}
		return c, err
	})
	if err != nil {
		return fmt.Errorf("queue: consumer %s on %s: %w", ConsumerName, q.Names.JobsStream(), err)
	}
	if c == nil {
		return nil
	}
	info := c.CachedInfo()
	gotWaitFor, gotDeliveries := info.Config.AckWait, max(deliveries(info.Config), -1)
	var changes []string
	if want.AckWait < gotWaitFor {
		changes = append(changes, fmt.Sprintf("a shorter ack wait (%v) than the consumer's (%v), by a third of which they keep their jobs alive: the server would give the jobs they hold to other workers before their next InProgress, to be sampled twice",
			want.AckWait, gotWaitFor))
	}
	if wantDeliveries := max(want.MaxDeliver, -1); wantDeliveries != gotDeliveries {
		changes = append(changes, fmt.Sprintf("another max deliver (%d) than the consumer's (%d), which they take for the deliveries a job is worked on: they would take another delivery than the server for a job's last",
			wantDeliveries, gotDeliveries))
	}
	if len(changes) == 0 {
		return nil
	}
	a, known, err := q.Present(ctx, PresenceWindow, PresenceWindow)
	if err != nil {
		return fmt.Errorf("queue: consumer %s: are workers running? %w", ConsumerName, err)
	}
	var running string
	switch {
	case known && len(a.Running) > 0:
		running = fmt.Sprintf("workers run (%d)", len(a.Running))
	case !known && info.NumWaiting > 0:
		running = "workers run (their pull requests wait)"
	default:
		return nil
	}
	return fmt.Errorf("queue: consumer %s on %s: %s, and this setup would give it %s. Stop every worker first, or start this one with the consumer's settings (--ack-wait %v --max-deliver %d)",
		ConsumerName, q.Names.JobsStream(), running, strings.Join(changes, "; and "), gotWaitFor, gotDeliveries)
}

// deliveries reads from a consumer's config how many deliveries a job is worked on. A
// consumer set up by a worker of an earlier version, or changed by hand, keeps no delivery
// for the dead letter: each of its deliveries is worked on.
func deliveries(c jetstream.ConsumerConfig) int {
	if n, err := strconv.Atoi(c.Metadata[extraDeliveryKey]); err == nil && n > 0 && c.MaxDeliver == n+1 {
		return n
	}
	return c.MaxDeliver
}

// Consumer binds the shared durable consumer that workers pull jobs from.
func (q *Queue) Consumer(ctx context.Context) (jetstream.Consumer, error) {
	c, err := q.JS.Consumer(ctx, q.Names.JobsStream(), ConsumerName)
	if err != nil {
		return nil, fmt.Errorf("queue: consumer %s: %w", ConsumerName, err)
	}
	return c, nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, update bool, names Names, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := retry(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		s, err := js.Stream(ctx, cfg.Name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			if update {
				return js.CreateOrUpdateStream(ctx, cfg)
			}
			return js.CreateStream(ctx, cfg)
		case err != nil:
			return nil, err
		}
		if err := ownStream(s, names); err != nil {
			return nil, err
		}
		if update {
			return js.CreateOrUpdateStream(ctx, cfg)
		}
		return s, nil
	})
	if err != nil {
		return nil, fmt.Errorf("queue: stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// errCodeReplicasExceedStream is the JetStream API error code of a consumer given more
// replicas than its stream has (JSConsumerReplicasExceedsStream).
const errCodeReplicasExceedStream = 10126

// replicasGrowWait bounds how long Setup waits for the jobs stream to grow the replicas its
// consumer is to have.
const replicasGrowWait = time.Minute

// replicasGrowing reports whether err is the server refusing a consumer the replicas its
// stream does not have yet.
func replicasGrowing(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeReplicasExceedStream
}

// ensureReplicas gives the stream name, if it exists, replicas replicas, changing nothing else.
func ensureReplicas(ctx context.Context, js jetstream.JetStream, name string, replicas int) error {
	_, err := retry(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		c := s.CachedInfo().Config
		if c.Replicas == replicas {
			return s, nil
		}
		c.Replicas = replicas
		return js.UpdateStream(ctx, c)
	})
	if err != nil {
		return fmt.Errorf("queue: stream %s: %w", name, err)
	}
	return nil
}

// ownStream refuses a stream s that holds subjects of another prefix. Stream and bucket names
// turn a prefix's '-' into '_', so two prefixes that differ only there (team-a, team_a) name
// the same streams: updating one's streams with the other's subjects would take them over,
// its jobs included, and its own publishing would find no stream.
func ownStream(s jetstream.Stream, names Names) error {
	info := s.CachedInfo()
	for _, subject := range info.Config.Subjects {
		if !strings.HasPrefix(subject, names.Prefix+".") {
			return &otherPrefixError{stream: info.Config.Name, subject: subject, prefix: names.Prefix}
		}
	}
	return nil
}

// otherPrefixError is ownStream's refusal, which no retry mends.
type otherPrefixError struct{ stream, subject, prefix string }

func (e *otherPrefixError) Error() string {
	return fmt.Sprintf("stream %s holds subject %s, of another prefix than %s: prefixes that differ only in '-' and '_' share stream names; give this deployment another --prefix",
		e.stream, e.subject, e.prefix)
}

// retry repeats a create-or-update a few times: two processes setting up the same stream at
// once may see "already in use", and a cluster that is electing a leader answers "unavailable"
// or not at all. Each attempt gets at most setupAttemptTimeout, so one request lost in a
// leader change does not use up the caller's whole deadline.
func retry[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	delay := 50 * time.Millisecond
	for range 8 {
		actx, cancel := context.WithTimeout(ctx, setupAttemptTimeout)
		v, err = f(actx)
		cancel()
		if other := (*otherPrefixError)(nil); err == nil || errors.As(err, &other) {
			return v, err
		}
		if ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
	return v, err
}

// setupAttemptTimeout bounds one JetStream API request of Setup or Bind.
const setupAttemptTimeout = 10 * time.Second

// Reclaimed says which jobs Reclaim made deliverable again.
type Reclaimed struct {
	// Jobs is how many there were.
	Jobs int
	// Through is the highest stream sequence among them, or among the jobs an earlier
	// Reclaim made deliverable again (reclaimedKey). A job at or below it comes back as a
	// first delivery, but its result may be stored already: its run may have stopped between
	// storing the result and acking the job.
	Through uint64
}

// reclaimedKey, in the backoff bucket, keeps the highest Reclaimed.Through of the store: a
// rerun interrupted after its Reclaim and before its worker pulled those jobs leaves them
// first deliveries that no worker holds, and the run after it, finding none to reclaim,
// would otherwise take them for jobs that were never worked.
const reclaimedKey = "local.reclaimed"

// Reclaim makes every job delivered and not settled deliverable again at once. Call it only
// where no worker can hold a job: on the embedded server of submit --local, just started on
// the store of a run that stopped without handing its jobs back (kill -9, a crash, a power
// cut). There they would wait out AckWait, 30 s at the end of the rerun. Anywhere else a
// delivered job is a live worker's, and AckWait is what gives it to another.
//
// The server resets the consumer to its ack floor: the work queue holds only jobs not yet
// acked, and they go out again, their delivery counts back at zero. The consumer delivers in
// stream order, so they are the jobs at or below the last sequence it delivered.
func (q *Queue) Reclaim(ctx context.Context) (Reclaimed, error) {
	c, err := q.JS.Consumer(ctx, q.Names.JobsStream(), ConsumerName)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return Reclaimed{}, nil
	}
	if err != nil {
		return Reclaimed{}, fmt.Errorf("queue: reclaim: %w", err)
	}
	// The bucket is made by the first worker that opened the fleet backoff, and so exists on
	// any store where a worker held jobs; on one where none ever ran there is nothing to keep.
	kv, err := q.JS.KeyValue(ctx, q.Names.BackoffBucket())
	if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return Reclaimed{}, fmt.Errorf("queue: reclaim: bucket %s: %w", q.Names.BackoffBucket(), err)
	}
	var before uint64
	if kv != nil {
		e, err := kv.Get(ctx, reclaimedKey)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return Reclaimed{}, fmt.Errorf("queue: reclaim: %w", err)
		default:
			before, _ = strconv.ParseUint(string(e.Value()), 10, 64)
		}
	}
	info := c.CachedInfo()
	if info.NumAckPending == 0 {
		return Reclaimed{Through: before}, nil
	}
	through := max(before, info.Delivered.Stream)
	if through > before && kv != nil {
		// Kept before the reset: a run stopped right after it still leaves it to the next.
		if _, err := kv.Put(ctx, reclaimedKey, strconv.AppendUint(nil, through, 10)); err != nil {
			return Reclaimed{}, fmt.Errorf("queue: reclaim %d jobs: %w", info.NumAckPending, err)
		}
	}
	if _, err := q.JS.ResetConsumer(ctx, q.Names.JobsStream(), ConsumerName); err != nil {
		return Reclaimed{}, fmt.Errorf("queue: reclaim %d jobs: reset consumer %s: %w", info.NumAckPending, ConsumerName, err)
	}
	return Reclaimed{Jobs: info.NumAckPending, Through: through}, nil
}

package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// samplerCache holds one sampling session per model (base model or checkpoint), created on
// first use; concurrent first uses share one create_sampling_session call.
type samplerCache struct {
	client *tinker.Client
	mu     sync.Mutex
	byKey  map[tinker.SamplerSpec]*samplerEntry
}

type samplerEntry struct {
	ready     chan struct{}
	sampler   *tinker.Sampler
	baseModel string
	err       error
}

// get returns the sampler of spec and the base model it samples (for its tokenizer).
func (c *samplerCache) get(ctx context.Context, spec tinker.SamplerSpec) (*tinker.Sampler, string, error) {
	c.mu.Lock()
	if c.byKey == nil {
		c.byKey = make(map[tinker.SamplerSpec]*samplerEntry)
	}
	e, ok := c.byKey[spec]
	if !ok {
		e = &samplerEntry{ready: make(chan struct{})}
		c.byKey[spec] = e
		c.mu.Unlock()
		e.sampler, e.baseModel, e.err = c.create(ctx, spec)
		if e.err != nil {
			c.mu.Lock()
			delete(c.byKey, spec) // the next job tries again
			c.mu.Unlock()
		}
		close(e.ready)
	} else {
		c.mu.Unlock()
	}
	select {
	case <-e.ready:
		return e.sampler, e.baseModel, e.err
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
}

// drop forgets the sampler s of spec, which the service no longer knows, so that the next get
// creates a new one. A newer sampler of spec, made since s, stays.
func (c *samplerCache) drop(spec tinker.SamplerSpec, s *tinker.Sampler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byKey[spec]
	if !ok {
		return
	}
	select {
	case <-e.ready: // e's fields are written before ready closes
		if e.sampler == s {
			delete(c.byKey, spec)
		}
	default: // a new one is being made
	}
}

func (c *samplerCache) create(ctx context.Context, spec tinker.SamplerSpec) (*tinker.Sampler, string, error) {
	s, err := c.client.NewSampler(ctx, spec)
	if err != nil {
		return nil, "", fmt.Errorf("create sampler for %s%s: %w", spec.BaseModel, spec.ModelPath, err)
	}
	if spec.BaseModel != "" {
		return s, spec.BaseModel, nil
	}
	info, err := s.Info(ctx) // a checkpoint: its base model names the tokenizer (§9)
	if err != nil {
		return nil, "", fmt.Errorf("base model of %s: %w", spec.ModelPath, err)
	}
	return s, info.BaseModel, nil
}

// modelCache remembers the context windows from get_server_capabilities (§3.8).
type modelCache struct {
	client *tinker.Client
	mu     sync.Mutex
	caps   *tinker.Capabilities
	at     time.Time
}

// maxContext returns the context window of model, 0 when the server does not say. The
// capabilities are fetched once and again when a model is missing (at most once a minute).
func (c *modelCache) maxContext(ctx context.Context, model string) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.caps != nil {
		if m, ok := c.caps.Model(model); ok {
			return m.MaxContextLength, nil
		}
		if time.Since(c.at) < time.Minute {
			return 0, nil
		}
	}
	caps, err := c.client.Capabilities(ctx)
	if err != nil {
		return 0, fmt.Errorf("server capabilities: %w", err)
	}
	c.caps, c.at = caps, time.Now()
	m, _ := caps.Model(model)
	return m.MaxContextLength, nil
}

// cancelSet is the set of cancelled (or deleted) batches, kept current by watching the
// batches bucket.
type cancelSet struct {
	mu  sync.RWMutex
	ids map[string]bool // batch id → deleted (not only cancelled)
	// waiting holds, for each batch whose jobs wait at the gate, the context that ends their
	// waits when the batch is found cancelled or deleted (see endedContext).
	waiting map[string]*endedBatch
	// ended, if set, is called when a batch is found cancelled or deleted (after set or
	// replace), outside the lock.
	ended func()
}

// endedBatch is the context of one batch that endedContext hands out, and how many hold it.
type endedBatch struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	holds  int
}

// endedContext returns a context that is done, with cause errBatchCancelled, once batch is
// found cancelled or deleted (at once if it is already), and the func that lets go of it. The
// jobs of one batch waiting at the gate share it.
func (s *cancelSet) endedContext(batch string) (context.Context, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.waiting[batch]
	if e == nil {
		e = &endedBatch{}
		e.ctx, e.cancel = context.WithCancelCause(context.Background())
		if _, ok := s.ids[batch]; ok {
			e.cancel(errBatchCancelled) // not kept: a later job gets a context of its own
		} else {
			if s.waiting == nil {
				s.waiting = make(map[string]*endedBatch)
			}
			s.waiting[batch] = e
		}
	}
	e.holds++
	return e.ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if e.holds--; e.holds == 0 {
			if s.waiting[batch] == e {
				delete(s.waiting, batch)
			}
			e.cancel(nil) // held by nobody now
		}
	}
}

// endWaits cancels the context of batch's jobs at the gate, if any, and forgets it. Call with
// mu held.
func (s *cancelSet) endWaits(batch string) {
	if e := s.waiting[batch]; e != nil {
		e.cancel(errBatchCancelled)
		delete(s.waiting, batch)
	}
}

// has reports whether batch was cancelled or deleted.
func (s *cancelSet) has(batch string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	_, ok := s.ids[batch]
	return ok
}

// deleted reports whether batch was deleted (submit delete): its results are purged.
func (s *cancelSet) deleted(batch string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ids[batch]
}

// set records the state of batch from its manifest m; nil m: the manifest is gone.
func (s *cancelSet) set(batch string, m *queue.Manifest) {
	s.mu.Lock()
	if s.ids == nil {
		s.ids = make(map[string]bool)
	}
	setIn(s.ids, batch, m)
	if m != nil && m.Ended() {
		s.endWaits(batch)
	}
	s.mu.Unlock()
	if s.ended != nil && m != nil && m.Ended() {
		s.ended()
	}
}

// setIn records the state of batch from its manifest m in ids; nil m: the manifest is gone.
func setIn(ids map[string]bool, batch string, m *queue.Manifest) {
	if m != nil && m.Ended() {
		ids[batch] = m.Status == queue.BatchDeleted
	} else {
		delete(ids, batch)
	}
}

// replace makes ids the set, as a watch from the bucket's start found it: batches the set
// held that the bucket no longer has (it was made again) are forgotten.
func (s *cancelSet) replace(ids map[string]bool) {
	s.mu.Lock()
	s.ids = ids
	for batch := range s.waiting {
		if _, ok := ids[batch]; ok {
			s.endWaits(batch)
		}
	}
	s.mu.Unlock()
	if s.ended != nil && len(ids) > 0 {
		s.ended()
	}
}

// watch follows the batches bucket until ctx is done, re-watching after a reconnect and
// after the watcher ends (see rewatch). It closes loaded once the bucket's current entries
// are known.
func (s *cancelSet) watch(ctx context.Context, q *queue.Queue, log *slog.Logger, loaded chan<- struct{}) {
	var once sync.Once
	markLoaded := func() { once.Do(func() { close(loaded) }) }
	defer markLoaded()
	s.watchChecking(ctx, q, log, markLoaded, bucketOf(q, q.Names.BatchesBucket()))
}

// watchChecking is watch, checking the bucket as check says (tests check it more often).
func (s *cancelSet) watchChecking(ctx context.Context, q *queue.Queue, log *slog.Logger, loaded func(), check bucketCheck) {
	rewatch(ctx, q.JS.Conn(), log, "batch watch", check, func(ctx context.Context) error {
		return s.watchOnce(ctx, q, loaded)
	})
}

// rewatch runs watch until ctx is done. After nc reconnects it ends the watch and runs it
// again at once: a KV watcher may go silent across a reconnect (jetstream-notes §6), and after
// a server restart one here delivered nothing for 20 s, so a cancel or a leave in that time
// came 20 s late. After the watch ends by itself (its watcher closed) it runs it again after
// 100 ms, doubled per end up to 5 s, so that a failing watch does not leak consumers as fast
// as the server makes them.
//
// And every bucket.every it reads when the watched bucket's stream was created: another time
// means the bucket was deleted and made again (an operator's `nats kv rm`, a store lost, then
// a worker's or submit's set-up), whose revisions start again from 1. nats.go makes the
// watch's consumer again at the old stream sequence, past all of them, and the watch is
// silent for good: a cancel was never heard, and workers sampled a cancelled batch on. So it
// runs the watch again, from the new bucket's start.
func rewatch(ctx context.Context, nc *nats.Conn, log *slog.Logger, what string, bucket bucketCheck, watch func(context.Context) error) {
	var reconnected chan nats.Status // nil (never ready) without a connection
	if nc != nil {
		reconnected = nc.StatusChanged(nats.CONNECTED)
		defer nc.RemoveStatusListener(reconnected)
	}
	var check <-chan time.Time // nil (never ready) without a bucket to check
	if bucket.created != nil {
		t := time.NewTicker(bucket.every)
		defer t.Stop()
		check = t.C
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		created, _ := bucket.read(ctx) // zero if it cannot be read now: the first later read sets it
		watchCtx, stop := context.WithCancel(ctx)
		ended := make(chan error, 1)
		go func() { ended <- watch(watchCtx) }() // joined below, before the next watch
		var err error
		again := false
		for !again && err == nil {
			select {
			case err = <-ended:
				if err == nil {
					err = errWatchEnded
				}
			case <-reconnected:
				log.Debug(what + ": reconnected; watching again")
				again = true
			case <-check:
				now, rerr := bucket.read(ctx)
				switch {
				case rerr != nil || now.IsZero():
				case created.IsZero():
					// Unknown when the watch began (the bucket could not be read, or was not
					// there): the watch may follow none, or an older one.
					log.Debug(what + ": the bucket can be read now; watching it anew")
					again = true
				case !now.Equal(created):
					log.Info(what + ": the bucket was made again; watching it from its start")
					again = true
				}
			}
		}
		stop()
		if again {
			<-ended
			delay = 100 * time.Millisecond
			continue
		}
		if errors.Is(err, errWatchEnded) {
			err = nil
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn(what+" ended; watching again", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

func (s *cancelSet) watchOnce(ctx context.Context, q *queue.Queue, loaded func()) error {
	w, err := q.Batches.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer q.StopWatch(w)         // the watch is tied to ctx, rewatch's, which ends as this returns
	initial := map[string]bool{} // the bucket's entries as the watch finds them, until it has them all
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil { // ctx's end closes the watcher too: either may come first
					return nil
				}
				return errors.New("watcher closed")
			}
			if e == nil { // the end of the initial values
				if initial != nil {
					s.replace(initial)
					initial = nil
				}
				loaded()
				continue
			}
			var m *queue.Manifest
			if e.Operation() == jetstream.KeyValuePut {
				m = new(queue.Manifest)
				if json.Unmarshal(e.Value(), m) != nil {
					continue
				}
			}
			if initial != nil {
				setIn(initial, e.Key(), m)
			} else {
				s.set(e.Key(), m)
			}
		}
	}
}

// errWatchEnded stands, in rewatch, for a watch that returned without an error.
var errWatchEnded = errors.New("the watch ended")

// bucketCheck reads, every every, when a watched bucket's stream was created (see rewatch).
// Its zero value checks nothing.
type bucketCheck struct {
	created func(context.Context) (time.Time, error)
	every   time.Duration
}

// read returns when the bucket was created (zero without a check).
func (b bucketCheck) read(ctx context.Context) (time.Time, error) {
	if b.created == nil {
		return time.Time{}, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return b.created(rctx)
}

// bucketCheckEvery is how often rewatch reads when a watched bucket was created.
const bucketCheckEvery = 10 * time.Second

// bucketOf is the check of q's bucket named name, every bucketCheckEvery: one request each
// time, the bucket's handle being kept (a check is used by one goroutine, its rewatch).
func bucketOf(q *queue.Queue, name string) bucketCheck {
	var kv jetstream.KeyValue
	return bucketCheck{every: bucketCheckEvery, created: func(ctx context.Context) (time.Time, error) {
		if kv == nil {
			var err error
			if kv, err = q.JS.KeyValue(ctx, name); err != nil {
				kv = nil
				return time.Time{}, err
			}
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
			return bs.StreamInfo().Created, nil
		}
		return time.Time{}, nil
	}}
}

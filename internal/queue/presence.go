package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Presence is what a running worker says of itself in the backoff bucket, every
// PresencePeriod, so that a reader can tell a fleet at work from one that is gone. The
// jobs consumer cannot: a job a worker handed back, or held when it crashed, counts as in
// flight (NumAckPending) until another worker takes it, so once every worker has stopped
// the server still shows jobs "at the workers", and no pull request, as a fleet whose
// every slot is busy does.
type Presence struct {
	Host string `json:"host,omitempty"` // the worker's host name (a pod's name)
	// Worker is the worker's id, and At when the note was stored, in the NATS server's clock
	// (both set by Present).
	Worker string    `json:"-"`
	At     time.Time `json:"-"`
}

// Attendance is what Present read, as of Now in the server's clock: the workers running,
// and those that went silent without removing their note (a crash, a lost connection).
type Attendance struct {
	Running []Presence
	// Silent are the workers whose latest note is older than the window: the jobs each held
	// stay in flight until their ack wait, counted from its last keep-alive, has passed.
	Silent []Presence
	Now    time.Time
}

// classify puts the latest note of each worker, a zero Presence for one that removed its note,
// into the running or the silent workers.
func (a *Attendance) classify(latest map[string]Presence, window time.Duration) {
	for _, p := range latest {
		switch {
		case p.At.IsZero(): // it stopped, and said so
		case a.Now.Sub(p.At) <= window:
			a.Running = append(a.Running, p)
		default:
			a.Silent = append(a.Silent, p)
		}
	}
}

const (
	// PresencePeriod is how often a running worker notes its presence.
	PresencePeriod = 5 * time.Second
	// PresenceWindow is how recent a worker's latest note must be for it to count as
	// running: three periods, so that one note delayed or lost does not hide a worker, and
	// a crashed worker stops counting within 15 s.
	PresenceWindow = 3 * PresencePeriod
)

// presenceKeyPrefix begins the key of a worker's presence note in the backoff bucket: keys of
// two tokens, apart from the accounts' keys (one token, hex), their capacity reports (three)
// and the notes under "retry." and "service.".
const presenceKeyPrefix = "worker."

// NotePresence stores p as worker id's latest presence note. Like the other notes it does
// not wait for the server: a worker that cannot reach it is not seen, which is what a reader
// should learn. Without the bucket (no worker backs off fleet-wide), nothing is stored.
func (q *Queue) NotePresence(id string, p Presence) error {
	if err := q.publishNote(presenceKeyPrefix+id, p); err != nil {
		return fmt.Errorf("presence note: %w", err)
	}
	return nil
}

// ForgetPresence removes worker id's presence note, as the worker stops: readers then know
// at once that it is gone, not only once the note is older than PresenceWindow.
func (q *Queue) ForgetPresence(ctx context.Context, id string) error {
	kv, err := q.JS.KeyValue(ctx, q.Names.BackoffBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err == nil {
		err = kv.Delete(ctx, presenceKeyPrefix+id)
	}
	if err != nil {
		return fmt.Errorf("presence note: %w", err)
	}
	return nil
}

// Present reads the latest presence note of each worker stored within since before the
// server's now: the workers whose note is at most window old run (PresenceWindow, for a
// reader of the fleet), the others went silent. It reports known false when the backoff
// bucket does not exist: no worker of a fleet that backs off per process notes its presence,
// so nobody can tell. It asks the server only for what was stored within since, so that the
// notes of workers long gone (one per worker that ever ran) cost nothing.
func (q *Queue) Present(ctx context.Context, window, since time.Duration) (a Attendance, known bool, err error) {
	bucket := q.Names.BackoffBucket()
	stream, err := q.JS.Stream(ctx, "KV_"+bucket) // the bucket's stream info says the server's time
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return a, false, nil
	}
	if err != nil {
		return a, false, fmt.Errorf("presence notes: %w", err)
	}
	if a.Now = stream.CachedInfo().TimeStamp; a.Now.IsZero() {
		return a, false, errors.New("presence notes: the server did not say its time")
	}
	from := a.Now.Add(-max(window, since))
	subjectPrefix := "$KV." + bucket + "." + presenceKeyPrefix
	cons, err := q.JS.OrderedConsumer(ctx, "KV_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{subjectPrefix + "*"},
		DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
		OptStartTime:      &from,
		InactiveThreshold: 5 * time.Second, // the server drops it soon after the read
	})
	if err != nil {
		return a, false, fmt.Errorf("presence notes: %w", err)
	}
	info := cons.CachedInfo()
	if info == nil || info.NumPending == 0 {
		return a, true, nil
	}
	// An iterator, not FetchNoWait: a consumer just made may not deliver at once (a cluster
	// whose node just stopped), while NumPending says what will come.
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return a, false, fmt.Errorf("presence notes: %w", err)
	}
	defer it.Stop()
	defer context.AfterFunc(ctx, it.Stop)()
	latest := make(map[string]Presence) // by worker: a later revision replaces an earlier one
	for {
		msg, err := it.Next(jetstream.NextMaxWait(2 * time.Second))
		if ctx.Err() != nil {
			return a, false, fmt.Errorf("presence notes: %w", ctx.Err())
		}
		if errors.Is(err, nats.ErrTimeout) {
			return a, false, errors.New("presence notes: the notes the server counted did not come")
		}
		if err != nil {
			return a, false, fmt.Errorf("presence notes: %w", err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return a, false, fmt.Errorf("presence notes: %w", err)
		}
		id := msg.Subject()[len(subjectPrefix):]
		// A delete marker (its worker stopped) is not a presence; nor is what is not a note.
		var p Presence
		if msg.Headers().Get(kvOperationHeader) == "" && json.Unmarshal(msg.Data(), &p) == nil {
			p.Worker, p.At = id, meta.Timestamp
		}
		latest[id] = p
		if meta.NumPending == 0 {
			a.classify(latest, window)
			return a, true, nil
		}
	}
}

// kvOperationHeader marks a KV delete or purge marker (its value is DEL or PURGE).
const kvOperationHeader = "KV-Operation"

// Silence tells, from the presence notes, which workers went silent without removing their
// note: they crashed, or lost their connection to NATS for longer than Window. Time is the
// server's, read from the notes themselves: a worker is silent once its latest note is
// Window older than the newest note of any worker (this one's own included), so no clock
// of a worker matters, and while no note comes at all (the server is down) nobody goes
// silent, nor when notes come again: every worker then has a window from the first. It follows only the workers noted since its first watch began, and keeps what it
// saw across watches (a reconnect ends one). Use it from one goroutine.
type Silence struct {
	// Window is how far behind the newest note a worker's latest may fall before it is
	// silent (PresenceWindow).
	Window time.Duration

	last   map[string]time.Time // the latest note of each worker followed
	newest time.Time            // the newest note of any worker
}

// Watch follows the presence notes and calls silent, once, with the id of each followed
// worker that goes silent; a worker that removes its note (ForgetPresence: it stopped, and
// said so) is no longer followed. It returns when ctx is done (nil) or the watcher ends (a
// reconnect may end it, jetstream-notes §6): watch again then. Without the bucket (no worker
// backs off fleet-wide, so none notes its presence) it waits for ctx.
func (s *Silence) Watch(ctx context.Context, q *Queue, silent func(worker string)) error {
	kv, err := q.JS.KeyValue(ctx, q.Names.BackoffBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		<-ctx.Done()
		return nil
	}
	if err != nil {
		return fmt.Errorf("presence watch: %w", err)
	}
	// Only updates: the bucket keeps the last note of every worker that ever crashed.
	w, err := kv.Watch(ctx, presenceKeyPrefix+"*", jetstream.UpdatesOnly(), jetstream.MetaOnly())
	if err != nil {
		return fmt.Errorf("presence watch: %w", err)
	}
	defer q.StopWatch(w) // this returns only on a closed watcher or on ctx's end
	if s.last == nil {
		s.last = make(map[string]time.Time)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok && ctx.Err() != nil: // ctx's end closes the watcher too: either may come first
				return nil
			case !ok:
				return errors.New("presence watch: the watcher closed")
			case e == nil:
				continue
			}
			s.saw(e.Key()[len(presenceKeyPrefix):], e.Operation() == jetstream.KeyValuePut, e.Created(), silent)
		}
	}
}

// saw records a note of worker (or its removal, if not put) stored at, then tells silent of
// each followed worker now Window behind the newest note.
func (s *Silence) saw(worker string, put bool, at time.Time, silent func(string)) {
	if !put {
		delete(s.last, worker)
		return
	}
	if !s.newest.IsZero() && at.Sub(s.newest) > s.Window {
		// No note at all for longer than a window: the server, or the link to it, was away,
		// and every worker's notes stopped with it. Judged by the notes from before, every
		// worker but the first to note again would be silent (and each would lose its part of
		// the capacity); each gets a window from now instead.
		for id := range s.last {
			s.last[id] = at
		}
	}
	s.last[worker] = at
	if at.After(s.newest) {
		s.newest = at
	}
	for id, last := range s.last {
		if s.newest.Sub(last) > s.Window {
			delete(s.last, id)
			silent(id)
		}
	}
}

// StopWatch stops w, a KV watch on q's connection made with a context that ends as its
// owner returns. Stop deletes the watch's consumer with a request, which waits out nats.go's
// 5 s API timeout while the connection is down: a worker whose NATS server was gone took 5 s
// more to stop. With the connection down, the context's end unsubscribes the watcher instead,
// and the server drops the consumer by itself.
func (q *Queue) StopWatch(w jetstream.KeyWatcher) {
	if nc := q.JS.Conn(); nc == nil || nc.IsConnected() {
		_ = w.Stop()
	}
}

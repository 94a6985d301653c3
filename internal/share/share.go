package share

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Report is what one worker measured in a round.
type Report struct {
	// Peak is the most samples the service held for the worker during its measure.
	Peak int `json:"peak"`
	// Want is how many samples the worker would run now if it could.
	Want int `json:"want"`
	// Limit is the worker's limit in force before the round (0: none), its part of a capacity
	// measured earlier, and LimitAge how long before the report that capacity was measured
	// (nanoseconds in JSON).
	Limit    int           `json:"limit,omitempty"`
	LimitAge time.Duration `json:"limit_age,omitempty"`
	// Capacity is the capacity measured that Limit is a part of: the Measured of the round
	// that gave it, or the worker's own peak for a limit it measured alone (0 with no limit,
	// and from workers that do not say, which leaves capacityOf's checks of the limits out).
	Capacity int `json:"capacity,omitempty"`
}

// Share is what a round gives one worker.
type Share struct {
	// Part is the worker's part of Capacity (0 if the round holds nothing for it).
	Part int
	// Capacity is what the parts of the round add up to: the sum of its peaks, or of its
	// workers' limits if that is no less.
	Capacity int
	// Measured is the capacity the fleet measured that this division comes from: Capacity,
	// or more when the round found the fleet full just under its limits and took its peaks
	// (see fullSlack). A worker reports it as the capacity its limit is a part of, so that
	// later rounds take their slack from it, and no run of 429s lowers the limits further.
	Measured int
	// Age is how long ago Capacity was measured: 0 if this round measured it, else the
	// oldest of its workers' limit ages, so that the limits expire when they would have
	// without this round.
	Age time.Duration
	// Before is, for a round that measured the capacity afresh (Age 0), the largest capacity
	// its workers' limits were parts of (0: none named): the fleet's measure before this one.
	// A worker that joins has none of its own, and confirms this measure against it as the
	// others confirm it against theirs.
	Before int
}

// Config tunes a Board; zero values take the defaults.
type Config struct {
	// Gather is how long a worker waits for the others' reports (default 300 ms: longer than
	// a worker's measure may last, 250 ms, so that the last report of a round is read by the
	// first worker to report).
	Gather time.Duration
	// Window is how far apart, in the server's clock, the reports of one round may be
	// created (default 500 ms; rounds are at least a 1 s pause apart).
	Window time.Duration
	// Worker is the worker's id on the board, the one in its presence note
	// (queue.Presence), so that both of its keys in the bucket name it alike (default: a
	// fresh random id).
	Worker string
}

// Board is one worker's place on the fleet's share board.
type Board struct {
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	prefix string // <account>.share.
	id     string
	cfg    Config
	// reported is set once this worker put a report on the board: only then does Close take
	// one off (a delete marker tells the others a part of the capacity is free).
	reported atomic.Bool
	// watchedTo is the revision after the last board update WatchLeaves saw (0: none yet),
	// where its next watch begins.
	watchedTo atomic.Uint64
	// seenMu guards seen: when each worker last reported in a round Split read.
	seenMu sync.Mutex
	seen   map[string]time.Time
}

// Open binds the board of account in the KV bucket (the backoff bucket, which must exist)
// under cfg.Worker.
func Open(ctx context.Context, js jetstream.JetStream, bucket, account string, cfg Config) (*Board, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("share: bind bucket %s: %w", bucket, err)
	}
	if cfg.Worker == "" {
		var id [8]byte
		_, _ = rand.Read(id[:])
		cfg.Worker = hex.EncodeToString(id[:])
	}
	if cfg.Gather <= 0 {
		cfg.Gather = 300 * time.Millisecond
	}
	if cfg.Window <= 0 {
		cfg.Window = 500 * time.Millisecond
	}
	return &Board{js: js, kv: kv, prefix: account + ".share.", id: cfg.Worker, cfg: cfg}, nil
}

// Split writes r as this worker's report of a round, waits for the others' and returns this
// worker's share of the capacity the fleet knows after the round.
func (b *Board) Split(ctx context.Context, r Report) (Share, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return Share{}, fmt.Errorf("share: %w", err)
	}
	rev, err := b.kv.Put(ctx, b.prefix+b.id, data)
	if err != nil {
		return Share{}, fmt.Errorf("share: report: %w", err)
	}
	b.reported.Store(true)
	t := time.NewTimer(b.cfg.Gather)
	select {
	case <-ctx.Done():
		t.Stop()
		return Share{}, ctx.Err()
	case <-t.C:
	}
	reports, _, err := b.round(ctx, rev)
	if err != nil {
		return Share{}, err
	}
	s := capacityOf(reports)
	wants := make(map[string]int, len(reports))
	now := time.Now()
	b.seenMu.Lock()
	if b.seen == nil {
		b.seen = make(map[string]time.Time)
	}
	for id, r := range reports {
		wants[id], b.seen[id] = r.Want, now
	}
	b.seenMu.Unlock()
	s.Part = Split(s.Capacity, wants)[b.id]
	return s, nil
}

// capacityOf returns the capacity a round's workers have between them: the sum of their
// peaks, unless the sum of their limits is no less; then the round neither lowers nor
// renews those limits, and the capacity keeps the age of the oldest. A fleet that keeps under
// its limits never fills the service itself, so such a round was set off by a 429 about a
// rate or another client, mostly while some samples waited to be sent; taking its peaks
// ratcheted the capacity down round by round, and renewing kept one learned too low (see the
// worker's capacity). Limits, not a capacity of the whole fleet, are what a round adds up: a
// worker that measured nothing (idle, or in a storm of 429s) sits the round out and keeps
// its own, so the round must not hand its part to the others.
//
// That holds only while the limits are parts of one division. Each worker's round is the
// reports near its own, so workers whose reports came far apart read different rounds, and
// a worker that joins, or keeps its own peak when its round fails, holds a limit of its own;
// limits from different divisions can add up to more than any capacity measured (three
// workers at 32 of 64 after one restarted). Holding them is then what fills the service, and
// the fleet paused about every second until they expired. So when the limits add up to more
// than the largest capacity they are parts of, the round takes that capacity, or its peaks
// if they are more.
//
// Nor does it hold when that capacity was measured a little too high (see fullSlack): a
// round of one division whose peaks come under its limits, but within fullSlack of the
// capacity measured, takes its peaks, still as parts of that capacity and with its age.
func capacityOf(reports map[string]Report) Share {
	var peaks, limits, top int
	var oldest, topAge time.Duration
	allSay := true // every limit names the capacity it is a part of
	for _, r := range reports {
		peaks += r.Peak
		if r.Limit <= 0 {
			continue
		}
		limits += r.Limit
		oldest = max(oldest, r.LimitAge)
		switch {
		case r.Capacity <= 0:
			allSay = false
		case r.Capacity > top:
			top, topAge = r.Capacity, r.LimitAge
		case r.Capacity == top:
			topAge = max(topAge, r.LimitAge)
		}
	}
	switch {
	case allSay && limits > top && top > peaks:
		return Share{Capacity: top, Measured: top, Age: topAge}
	case allSay && limits > peaks && limits <= top && peaks >= top-fullSlack(top):
		return Share{Capacity: peaks, Measured: top, Age: oldest}
	case limits > 0 && limits >= peaks && (!allSay || limits <= top):
		return Share{Capacity: limits, Measured: max(limits, top), Age: oldest}
	}
	return Share{Capacity: peaks, Measured: peaks, Before: top}
}

// fullSlack is how far under the capacity it measured a fleet may find itself full for its
// round to take the peaks rather than keep the limits: a sixteenth of it, at least 1.
//
// A round can count a sample or two more than the service held: one whose result was on its
// way back when the service took another in its place, or peaks its workers measured at
// different moments (three workers of one process, every acceptance traced against one clock:
// a round summed 65 of 64 when they held 65 for a moment, another when they never held more
// than 64). Limits split from such a round add up to a little more than the capacity; then
// every refill after a pause meets a 429, and each round measures 64 or 65 under limits of
// 66. Keeping them, as a 429 about a rate, paused the fleet every 1.2 s until they expired: a
// fifth of the throughput for up to the ttl, 0.72 of the ideal over a steady 100,000-job run.
//
// A 429 about a rate that comes as the fleet is full looks the same to one round, and takes
// a place or two too. The slack is counted from the capacity measured, which such a round
// does not lower (Share.Measured), so 429 after 429 cannot ratchet the limits down: they
// stay within a sixteenth of it until they expire, and the next 429 measures it afresh.
func fullSlack(capacity int) int { return max(1, capacity/16) }

// round reads the reports created within Window of this worker's report at revision rev, and
// says how many messages it read. It asks the server only for what was stored from Window
// before that report on, so that reports left by crashed workers, and the delete markers of
// closed ones, cost a round nothing however many pile up in the bucket.
func (b *Board) round(ctx context.Context, rev uint64) (map[string]Report, int, error) {
	mine, err := b.kv.Get(ctx, b.prefix+b.id)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("share: read own report: %w", err)
	}
	if err != nil || mine.Revision() != rev {
		return nil, 0, errors.New("share: this worker's report was replaced or lost")
	}
	bucket := b.kv.Bucket()
	subjectPrefix := "$KV." + bucket + "." // a key's subject in the bucket's stream
	from := mine.Created().Add(-b.cfg.Window)
	cons, err := b.js.OrderedConsumer(ctx, "KV_"+bucket, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subjectPrefix + b.prefix + "*"},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &from,
		// The server drops the consumer soon after the round (nats.go's default keeps it 5 min:
		// a fleet's rounds would leave hundreds behind).
		InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return nil, 0, fmt.Errorf("share: read reports: %w", err)
	}
	type stored struct {
		msg jetstream.Msg
		at  time.Time
	}
	// Read with an iterator, not FetchNoWait: a fetch right after the consumer is made (on a
	// cluster, just after a node stopped) may find it not yet able to deliver and come back
	// empty, while a pull of the iterator waits for the reports, which this worker's own
	// report, stored before, guarantees are there.
	it, err := cons.Messages(jetstream.PullMaxMessages(256))
	if err != nil {
		return nil, 0, fmt.Errorf("share: read reports: %w", err)
	}
	defer it.Stop()
	stopOnCancel := context.AfterFunc(ctx, it.Stop)
	defer stopOnCancel()
	latest := make(map[string]stored) // by key: the bucket keeps one revision of each
	read := 0
	for done := false; !done; {
		msg, err := it.Next(jetstream.NextMaxWait(reportWait))
		if ctx.Err() != nil {
			return nil, read, ctx.Err()
		}
		if errors.Is(err, nats.ErrTimeout) {
			return nil, read, fmt.Errorf("share: read reports: the round's reports did not come in %v", reportWait)
		}
		if err != nil {
			return nil, read, fmt.Errorf("share: read reports: %w", err)
		}
		read++
		meta, err := msg.Metadata()
		if err != nil {
			return nil, read, fmt.Errorf("share: read reports: %w", err)
		}
		latest[strings.TrimPrefix(msg.Subject(), subjectPrefix)] = stored{msg, meta.Timestamp}
		done = meta.NumPending == 0 // what was stored when the consumer began has come
	}
	reports := make(map[string]Report, len(latest))
	for key, e := range latest {
		if e.msg.Headers().Get(kvOperationHeader) != "" {
			continue // deleted or purged
		}
		if d := e.at.Sub(mine.Created()); d > b.cfg.Window || d < -b.cfg.Window {
			continue
		}
		var r Report
		if err := json.Unmarshal(e.msg.Data(), &r); err != nil || r.Peak < 0 || r.Want < 0 {
			continue // not a report of ours
		}
		reports[key[len(b.prefix):]] = r
	}
	return reports, read, nil
}

// reportWait is how long a round waits for the next stored report before it gives up.
const reportWait = 2 * time.Second

// kvOperationHeader marks a KV delete or purge marker (its value is DEL or PURGE).
const kvOperationHeader = "KV-Operation"

// Close takes this worker's report, if it made one, off the board: the others then know
// (WatchLeaves) that its part of the capacity is free.
func (b *Board) Close(ctx context.Context) error {
	if !b.reported.Load() {
		return nil
	}
	if err := b.kv.Delete(ctx, b.prefix+b.id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("share: delete report: %w", err)
	}
	return nil
}

// WatchLeaves calls left, with its id, each time another worker of the account takes its
// report off the board (Close): it stopped, and its part of the capacity is free, which the
// parts of those that stay do not cover until their limits expire. It returns when ctx is
// done (nil) or the watcher ends (a reconnect may end it, jetstream-notes §6): watch again
// then, and after a reconnect, which a watcher may not notice for 20 s or more. A watch
// begins where the board's last one left off, so a leave in between is not missed; the
// first begins after what the bucket holds now, and so does one after the bucket was made
// anew. A crashed worker's report is not taken off; it ages out of the rounds instead. One
// WatchLeaves at a time per board.
func (b *Board) WatchLeaves(ctx context.Context, left func(worker string)) error {
	st, err := b.kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("share: watch the board: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return errors.New("share: watch the board: the bucket's status has no stream state")
	}
	next := bs.StreamInfo().State.LastSeq + 1
	from := b.watchedTo.Load()
	if from == 0 || from > next { // the first watch, or a bucket made anew (a server that lost its store)
		from = next
	}
	w, err := b.kv.Watch(ctx, b.prefix+"*", jetstream.ResumeFromRevision(from), jetstream.MetaOnly())
	if err != nil {
		return fmt.Errorf("share: watch the board: %w", err)
	}
	// As queue.StopWatch (this package imports no queue): Stop deletes the watch's consumer
	// with a request, which waits out nats.go's 5 s API timeout while the connection is down.
	// This returns only on a closed watcher or on ctx's end, which unsubscribes the watcher
	// (the watch is tied to ctx), and the server drops the consumer by itself.
	defer func() {
		if nc := b.js.Conn(); nc == nil || nc.IsConnected() {
			_ = w.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok && ctx.Err() != nil: // ctx's end closes the watcher too: either may come first
				return nil
			case !ok:
				return errors.New("share: board watcher closed")
			case e == nil: // the end of what was stored before the watch: go on
				continue
			}
			b.watchedTo.Store(e.Revision() + 1)
			if e.Operation() != jetstream.KeyValuePut && e.Key() != b.prefix+b.id {
				left(strings.TrimPrefix(e.Key(), b.prefix))
			}
		}
	}
}

// ReportedSince reports whether worker reported in a round Split read since then: a part of
// the capacity may be its, given by one of those rounds, or kept through later ones it sat
// out (a round divides only the limits of the workers in it). A crashed worker's report is
// not taken off the board (WatchLeaves cannot tell), so the worker asks this of one whose
// presence notes stopped (queue.Silence), with since a ttl ago: limits older than that have
// expired. Workers last seen before since are forgotten.
func (b *Board) ReportedSince(worker string, since time.Time) bool {
	b.seenMu.Lock()
	defer b.seenMu.Unlock()
	maps.DeleteFunc(b.seen, func(_ string, at time.Time) bool { return at.Before(since) })
	_, ok := b.seen[worker]
	return ok
}

// Split divides total places among workers by what they want: equal parts, a worker that
// wants less than its part gets what it wants and the rest is divided again among the
// others (water-filling); places nobody wants are divided evenly too, since a limit above
// the want costs nothing. Remainders go one each in id order, so every worker computing
// Split from the same reports gets the same answer. The parts add up to total.
func Split(total int, wants map[string]int) map[string]int {
	ids := make([]string, 0, len(wants))
	for id := range wants {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make(map[string]int, len(ids))
	if len(ids) == 0 || total <= 0 {
		return parts
	}
	left := total
	open := slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return wants[id] <= 0 })
	for left > 0 && len(open) > 0 {
		each := left / len(open)
		if each == 0 {
			for _, id := range open[:left] {
				parts[id]++
			}
			return parts
		}
		var still []string
		for _, id := range open {
			give := min(each, wants[id]-parts[id])
			parts[id] += give
			left -= give
			if parts[id] < wants[id] {
				still = append(still, id)
			}
		}
		open = still
	}
	// Everybody has what they want: spread the rest.
	each, rest := left/len(ids), left%len(ids)
	for i, id := range ids {
		parts[id] += each
		if i < rest {
			parts[id]++
		}
	}
	return parts
}

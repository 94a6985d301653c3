package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/dispatch"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// queueAndCodec starts a NATS server and returns a queue on it and a result codec.
func queueAndCodec(t *testing.T) (*queue.Queue, *queue.Codec) {
	t.Helper()
	q := fleettest.Queue(t, fleettest.NATS(t).ClientURL(), queue.Config{})
	codec, err := queue.NewCodec(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(codec.Close)
	return q, codec
}

// fetchJobs publishes n jobs to batch and fetches them from the workers' consumer.
func fetchJobs(t *testing.T, q *queue.Queue, batch string, n int) []jetstream.Msg {
	t.Helper()
	js := make([]jobs.Job, n)
	for i := range js {
		js[i] = jobs.Job{CustomID: fmt.Sprintf("job-%03d", i), Model: "m", Prompt: "p"}
	}
	fleettest.Publish(t, q, batch, js)
	ctx := context.Background()
	cons, err := q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for len(msgs) < n {
		b, err := cons.Fetch(n-len(msgs), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			msgs = append(msgs, m)
		}
		if err := b.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return msgs
}

// pendingAcks is the number of delivered jobs the consumer waits to be acked for, once it is
// want or 5 s have passed: acks are not confirmed, and the server applies them a moment later.
func pendingAcks(t *testing.T, q *queue.Queue, want int) int {
	t.Helper()
	cons, err := q.Consumer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == want || time.Now().After(deadline) {
			return info.NumAckPending
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSettlerStoresAGroupThenAcksIt: settlements that are waiting when the settler runs go out
// as one group, every result is stored, and every job is acked (or termed) after that.
func TestSettlerStoresAGroupThenAcksIt(t *testing.T) {
	q, codec := queueAndCodec(t)
	const n = 40
	msgs := fetchJobs(t, q, "b1", n)

	st, settled := testSettler(t, q, n, 0)
	settlements := storing(t, q, codec, msgs)
	for i, s := range settlements {
		s.term = i%4 == 0
		if i%5 == 0 { // every fifth job has its result stored already: ack only
			s.store, s.result = false, nil
		}
		st.hand(s) // all waiting before the settler starts
	}
	var groups int
	done := make(chan struct{})
	go func() { groups = st.run(context.Background()); close(done) }()
	if err := waitSettled(settled, n); err != nil {
		t.Error(err)
	}
	st.close(time.Now())
	<-done

	if groups != 1 {
		t.Errorf("settled %d waiting jobs in %d groups; want 1", n, groups)
	}
	stored, err := q.ResultsStored(context.Background(), "b1")
	if err != nil {
		t.Fatal(err)
	}
	if want := n - n/5; stored != want {
		t.Errorf("%d results stored; want %d", stored, want)
	}
	if p := pendingAcks(t, q, 0); p != 0 {
		t.Errorf("%d jobs still wait for an ack; want 0", p)
	}
}

// TestSettlerLeavesAJobWhoseResultFailed: a result the stream does not take fails on its own;
// its job is not acked (it will be delivered again), and the rest of its group is settled.
func TestSettlerLeavesAJobWhoseResultFailed(t *testing.T) {
	q, codec := queueAndCodec(t)
	msgs := fetchJobs(t, q, "b1", 3)

	st, settled := testSettler(t, q, len(msgs), 0)
	settlements := make([]*settlement, len(msgs))
	for i, m := range msgs {
		s := &settlement{}
		s.msg = m
		id := m.Headers().Get(queue.HeaderCustomID)
		var err error
		if s.result, err = q.ResultMsg(nil, codec, "b1", id, "ok", queue.Tokens{}, []byte(`{}`), 0); err != nil {
			t.Fatal(err)
		}
		s.store = true
		settlements[i] = s
	}
	// The stream refuses this one result (it expects another stream), and stores the rest.
	settlements[1].result.Header.Set(jetstream.ExpectedStreamHeader, "elsewhere")
	for _, s := range settlements {
		st.hand(s)
	}
	st.close(time.Now())
	st.run(context.Background())
	if len(settled) != len(settlements) {
		t.Fatalf("%d of %d settlements passed on", len(settled), len(settlements))
	}
	for i, s := range settlements {
		if failed := s.publishErr != nil; failed != (i == 1) {
			t.Errorf("settlement %d: publish error %v", i, s.publishErr)
		}
	}
	if p := pendingAcks(t, q, 1); p != 1 {
		t.Errorf("%d jobs wait for an ack; want 1 (the one whose result failed)", p)
	}
}

// storing returns a settlement for each message that stores an "ok" result of its job.
func storing(t *testing.T, q *queue.Queue, codec *queue.Codec, msgs []jetstream.Msg) []*settlement {
	t.Helper()
	out := make([]*settlement, len(msgs))
	for i, m := range msgs {
		s := &settlement{msg: m, store: true}
		var err error
		if s.result, err = q.ResultMsg(nil, codec, "b1", m.Headers().Get(queue.HeaderCustomID), "ok", queue.Tokens{}, []byte(`{}`), 0); err != nil {
			t.Fatal(err)
		}
		out[i] = s
	}
	return out
}

// handAll hands each of settlements to st, gap apart.
func handAll(st *settler, settlements []*settlement, gap time.Duration) {
	for i, s := range settlements {
		if i > 0 {
			time.Sleep(gap)
		}
		st.hand(s)
	}
}

// waitSettled waits for n settlements to be passed on, and returns the first error of theirs.
func waitSettled(settled <-chan *settlement, n int) error {
	var first error
	for range n {
		s := <-settled
		first = cmp.Or(first, errors.Join(s.publishErr, s.settleErr))
	}
	return first
}

// TestSettlerLingersForJobsThatFinishSoonAfter: jobs that finish one by one, a little apart,
// go out in one group when they fall within the linger of the first.
func TestSettlerLingersForJobsThatFinishSoonAfter(t *testing.T) {
	q, codec := queueAndCodec(t)
	msgs := fetchJobs(t, q, "b1", 4)

	st, settled := testSettler(t, q, len(msgs), time.Second)
	var groups int
	done := make(chan struct{})
	go func() { groups = st.run(context.Background()); close(done) }()
	handAll(st, storing(t, q, codec, msgs), 20*time.Millisecond)
	if err := waitSettled(settled, len(msgs)); err != nil {
		t.Error(err)
	}
	st.close(time.Now())
	<-done

	if groups != 1 {
		t.Errorf("4 jobs 20 ms apart settled in %d groups; want 1 (linger 1 s)", groups)
	}
	if p := pendingAcks(t, q, 0); p != 0 {
		t.Errorf("%d jobs still wait for an ack; want 0", p)
	}
}

// TestSettlerSkipsTheLingerForAFullGroup: with enough jobs waiting, a group goes at once.
func TestSettlerSkipsTheLingerForAFullGroup(t *testing.T) {
	q, codec := queueAndCodec(t)
	msgs := fetchJobs(t, q, "b1", lingerFull)

	st, settled := testSettler(t, q, len(msgs), time.Hour)
	handAll(st, storing(t, q, codec, msgs), 0) // all waiting before the settler starts
	go st.run(context.Background())
	finished := make(chan error, 1)
	go func() { finished <- waitSettled(settled, len(msgs)) }()
	select {
	case err := <-finished:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%d waiting jobs not settled within 10 s: the group waited for its linger (1 h)", lingerFull)
	}
	st.close(time.Now())
}

// testSettler is newSettler for a test: the settlements it is through with come out of the
// channel returned.
func testSettler(t *testing.T, q *queue.Queue, capacity int, linger time.Duration) (*settler, <-chan *settlement) {
	t.Helper()
	settled := make(chan *settlement, capacity)
	st, err := newSettler(q, capacity, linger, func(s *settlement) { settled <- s })
	if err != nil {
		t.Fatal(err)
	}
	return st, settled
}

// TestSettledHandsBackAJobWhoseResultFailed: once the settler is through, a job whose result
// was not stored is handed back for another delivery at once (not after AckWait), a stored
// one is not, and both free their job slot and dispatch permit.
func TestSettledHandsBackAJobWhoseResultFailed(t *testing.T) {
	q, codec := queueAndCodec(t)
	msgs := fetchJobs(t, q, "b1", 2)
	limiter := dispatch.New(dispatch.Config{Count: 2})
	w := &Worker{log: slog.New(slog.DiscardHandler), slots: make(chan struct{}, 2), limiter: limiter,
		settlements: make(chan *settlement, 2)}
	st, err := newSettler(q, 2, 0, w.settled)
	if err != nil {
		t.Fatal(err)
	}
	settlements := storing(t, q, codec, msgs)
	// The stream refuses this one result (it expects another stream).
	settlements[0].result.Header.Set(jetstream.ExpectedStreamHeader, "elsewhere")
	for _, s := range settlements {
		w.slots <- struct{}{}
		r, err := limiter.Reserve(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s.job = finishedJob{reservation: &r, batch: "b1", delivered: 1, start: time.Now()}
		st.hand(s)
	}
	st.close(time.Now())
	st.run(context.Background())

	if len(w.slots) != 0 || limiter.Free() != 2 {
		t.Errorf("after settling: %d job slots and %d of 2 permits still taken", len(w.slots), 2-limiter.Free())
	}
	if len(w.settlements) != 2 {
		t.Errorf("%d settlements kept for the next jobs; want 2", len(w.settlements))
	}
	cons, err := q.Consumer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Within 5 s: NakWithDelay(1 s), not AckWait (30 s).
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for m := range again.Messages() {
		ids = append(ids, m.Headers().Get(queue.HeaderCustomID))
	}
	if want := msgs[0].Headers().Get(queue.HeaderCustomID); len(ids) != 1 || ids[0] != want {
		t.Errorf("delivered again: %v; want %s, whose result failed", ids, want)
	}
	// The other was acked: the work queue holds only the job handed back.
	if info, err := q.Jobs.Info(context.Background()); err != nil || info.State.Msgs != 1 {
		t.Errorf("jobs stream holds %d jobs (%v); want only the one handed back", info.State.Msgs, err)
	}
}

// resultsRoom sets the results stream's byte limit: 1 makes it full, so that it refuses every
// result as a full store does (maximum bytes exceeded, a 503); -1 gives the room back.
func resultsRoom(t *testing.T, q *queue.Queue, maxBytes int64) {
	t.Helper()
	ctx := context.Background()
	info, err := q.Results.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.MaxBytes = maxBytes
	if _, err := q.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// holdLog records a settler's hold calls.
type holdLog struct {
	mu      sync.Mutex
	held    map[*settlement]bool
	letGo   int
	changed chan struct{}
}

func newHoldLog() *holdLog {
	return &holdLog{held: make(map[*settlement]bool), changed: make(chan struct{}, 1024)}
}

func (h *holdLog) hold(s *settlement, held bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if held {
		h.held[s] = true
	} else {
		delete(h.held, s)
		h.letGo++
	}
	h.changed <- struct{}{}
}

// waitHeld waits until n settlements are held, for at most 10 s.
func (h *holdLog) waitHeld(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		h.mu.Lock()
		got := len(h.held)
		h.mu.Unlock()
		if got == n {
			return
		}
		select {
		case <-h.changed:
		case <-deadline:
			t.Fatalf("%d settlements held, want %d", got, n)
		}
	}
}

// holdingSettler runs a settler with n jobs' results handed in while the results stream is
// full, and returns once it holds them all; done is closed when its run ends. A retry other
// than 0 is the settler's every wait before it tries them again.
func holdingSettler(t *testing.T, n int, retry time.Duration) (q *queue.Queue, st *settler, settled <-chan *settlement, holds *holdLog, done <-chan struct{}) {
	t.Helper()
	q, codec := queueAndCodec(t)
	msgs := fetchJobs(t, q, "b1", n)
	resultsRoom(t, q, 1)
	st, settled = testSettler(t, q, n, 0)
	if retry != 0 {
		st.retryFrom, st.retryUpTo = retry, retry
	}
	holds = newHoldLog()
	st.hold = holds.hold
	handAll(st, storing(t, q, codec, msgs), 0)
	running := make(chan struct{})
	go func() { st.run(context.Background()); close(running) }()
	holds.waitHeld(t, n)
	return q, st, settled, holds, running
}

// waitClosed waits, at most 10 s, for a closed settler's run to end.
func waitClosed(t *testing.T, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the settler did not end within 10 s of being closed")
	}
}

// TestSettlerHoldsResultsWhileTheStreamIsFull: results that a full stream refuses are held,
// not passed on (passing on hands the job back to be sampled again), tried again, and
// stored, their jobs acked, once the stream has room.
func TestSettlerHoldsResultsWhileTheStreamIsFull(t *testing.T) {
	const n = 5
	q, st, settled, holds, done := holdingSettler(t, n, 0)
	time.Sleep(4 * (firstRetry + 2*firstRetry)) // the settler tries them again meanwhile
	if len(settled) != 0 {
		t.Fatalf("%d of %d results passed on while the stream was full; want them held", len(settled), n)
	}
	if p := pendingAcks(t, q, n); p != n {
		t.Fatalf("%d jobs wait for an ack while their results are held; want %d", p, n)
	}

	resultsRoom(t, q, -1)
	if err := waitSettled(settled, n); err != nil {
		t.Errorf("after the stream had room again: %v", err)
	}
	st.close(time.Now())
	<-done
	if holds.letGo != n || len(holds.held) != 0 {
		t.Errorf("%d held settlements let go, %d still held; want %d and none", holds.letGo, len(holds.held), n)
	}
	if stored, err := q.ResultsStored(context.Background(), "b1"); err != nil || stored != n {
		t.Errorf("%d results stored (%v); want %d", stored, err, n)
	}
	if p := pendingAcks(t, q, 0); p != 0 {
		t.Errorf("%d jobs still wait for an ack; want 0", p)
	}
}

// TestSettlerTriesHeldResultsAgainOnAReconnect: a reconnect is the likeliest end of an
// outage, so held results are tried again as the connection is made again, not after the
// wait (up to 5 s). Here the wait is an hour: only the reconnect can bring them in.
func TestSettlerTriesHeldResultsAgainOnAReconnect(t *testing.T) {
	const n = 3
	q, st, settled, _, done := holdingSettler(t, n, time.Hour)
	resultsRoom(t, q, -1)
	if err := q.JS.Conn().ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	finished := make(chan error, 1)
	go func() { finished <- waitSettled(settled, n) }()
	select {
	case err := <-finished:
		if err != nil {
			t.Errorf("after the reconnect: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("held results not stored within 10 s of a reconnect: the settler waited out its hour")
	}
	st.close(time.Now())
	waitClosed(t, done)
	if stored, err := q.ResultsStored(context.Background(), "b1"); err != nil || stored != n {
		t.Errorf("%d results stored (%v); want %d", stored, err, n)
	}
}

// TestSettlerLetsHeldResultsGoWhenClosed: results the stream still cannot store when the
// settler is closed are tried until the drain time, then passed on unstored, jobs unacked.
func TestSettlerLetsHeldResultsGoWhenClosed(t *testing.T) {
	const n = 3
	q, st, settled, _, done := holdingSettler(t, n, 0)
	drainBy := time.Now().Add(500 * time.Millisecond)
	st.close(drainBy)
	waitClosed(t, done)
	if time.Now().Before(drainBy) {
		t.Error("the settler let held results go before the drain time")
	}
	if len(settled) != n {
		t.Fatalf("%d of %d held settlements passed on", len(settled), n)
	}
	for range n {
		if s := <-settled; s.publishErr == nil || !queue.StoreUnavailable(s.publishErr) || s.heldSince.IsZero() {
			t.Errorf("passed on with publish error %v, held since %v; want the stream's refusal, held", s.publishErr, s.heldSince)
		}
	}
	if p := pendingAcks(t, q, n); p != n {
		t.Errorf("%d jobs wait for an ack; want all %d (none acked without its result)", p, n)
	}
}

// TestSettlerLetsGoJobsThatWaitedBehindHeldOnes: with more jobs than one group holds while the
// stream is full, those handed in behind the held ones are held too (kept alive), and when
// the settler is closed they are passed on with an error, never as settled.
func TestSettlerLetsGoJobsThatWaitedBehindHeldOnes(t *testing.T) {
	const n = maxSettleGroup + 44
	q, st, settled, _, done := holdingSettler(t, n, 0)
	st.close(time.Now())
	waitClosed(t, done)
	if len(settled) != n {
		t.Fatalf("%d of %d held settlements passed on", len(settled), n)
	}
	for range n {
		if s := <-settled; !queue.StoreUnavailable(s.publishErr) {
			t.Fatalf("a job passed on with publish error %v; want the stream's refusal", s.publishErr)
		}
	}
	if p := pendingAcks(t, q, n); p != n {
		t.Errorf("%d jobs wait for an ack; want all %d", p, n)
	}
}

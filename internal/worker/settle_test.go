package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

	st := testSettler(t, q, n, 0)
	settlements := storing(t, q, codec, msgs)
	for i, s := range settlements {
		s.term = i%4 == 0
		if i%5 == 0 { // every fifth job has its result stored already: ack only
			s.store, s.result = false, nil
		}
	}
	settled := make(chan error, 1)
	go func() { settled <- settleAll(st, settlements, 0) }()
	for len(st.in) < n { // all waiting before the settler starts
		time.Sleep(time.Millisecond)
	}
	var groups int
	done := make(chan struct{})
	go func() { groups = st.run(context.Background()); close(done) }()
	if err := <-settled; err != nil {
		t.Error(err)
	}
	st.close()
	<-done

	if groups != 1 {
		t.Errorf("settled %d waiting jobs in %d groups; want 1", n, groups)
	}
	stored, err := fleettest.ResultCount(context.Background(), q, "b1")
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

	st := testSettler(t, q, len(msgs), 0)
	settlements := make([]*settlement, len(msgs))
	for i, m := range msgs {
		s := newSettlement()
		s.msg = m
		id := m.Headers().Get(queue.HeaderCustomID)
		var err error
		if s.result, err = q.ResultMsg(nil, codec, "b1", id, "ok", []byte(`{}`), 0); err != nil {
			t.Fatal(err)
		}
		s.store = true
		settlements[i] = s
	}
	// No stream listens on this subject: the publish has no responders.
	settlements[1].result = &nats.Msg{Subject: "nowhere.results", Header: nats.Header{jetstream.MsgIDHeader: {"b1/x"}}, Data: []byte(`{}`)}
	for _, s := range settlements {
		st.in <- s
	}
	st.close()
	st.run(context.Background())
	for i, s := range settlements {
		<-s.done
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
		s := newSettlement()
		s.msg, s.store = m, true
		var err error
		if s.result, err = q.ResultMsg(nil, codec, "b1", m.Headers().Get(queue.HeaderCustomID), "ok", []byte(`{}`), 0); err != nil {
			t.Fatal(err)
		}
		out[i] = s
	}
	return out
}

// settleAll settles each of settlements from a handler of its own, gap apart, and returns
// once all are settled, with the first error seen.
func settleAll(st *settler, settlements []*settlement, gap time.Duration) error {
	var (
		handlers sync.WaitGroup
		mu       sync.Mutex
		first    error
	)
	for i, s := range settlements {
		if i > 0 {
			time.Sleep(gap)
		}
		handlers.Go(func() {
			st.settle(s)
			if err := errors.Join(s.publishErr, s.settleErr); err != nil {
				mu.Lock()
				first = cmp.Or(first, err)
				mu.Unlock()
			}
		})
	}
	handlers.Wait()
	return first
}

// TestSettlerLingersForJobsThatFinishSoonAfter: jobs that finish one by one, a little apart,
// go out in one group when they fall within the linger of the first.
func TestSettlerLingersForJobsThatFinishSoonAfter(t *testing.T) {
	q, codec := queueAndCodec(t)
	msgs := fetchJobs(t, q, "b1", 4)

	st := testSettler(t, q, len(msgs), time.Second)
	var groups int
	done := make(chan struct{})
	go func() { groups = st.run(context.Background()); close(done) }()
	if err := settleAll(st, storing(t, q, codec, msgs), 20*time.Millisecond); err != nil {
		t.Error(err)
	}
	st.close()
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

	st := testSettler(t, q, len(msgs), time.Hour)
	go func() {
		for len(st.in) < lingerFull { // all waiting before the settler starts
			time.Sleep(time.Millisecond)
		}
		st.run(context.Background())
	}()
	settlements := storing(t, q, codec, msgs)
	finished := make(chan error, 1)
	go func() { finished <- settleAll(st, settlements, 0) }()
	select {
	case err := <-finished:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%d waiting jobs not settled within 10 s: the group waited for its linger (1 h)", lingerFull)
	}
	st.close()
}

// testSettler is newSettler for a test.
func testSettler(t *testing.T, q *queue.Queue, capacity int, linger time.Duration) *settler {
	t.Helper()
	st, err := newSettler(q, capacity, linger)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

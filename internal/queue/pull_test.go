package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func newPuller(t *testing.T, b *testBundle) *JobPuller {
	t.Helper()
	p, err := b.q.NewJobPuller(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close(nil) })
	return p
}

// pullInto sends a pull request of the test's own for the puller's inbox, as one that Pull
// gave up on would have been.
func pullInto(t *testing.T, b *testBundle, p *JobPuller, batch int, expires time.Duration) {
	t.Helper()
	body := `{"batch":` + strconv.Itoa(batch) + `,"expires":` + strconv.FormatInt(int64(expires), 10) + `}`
	if err := b.nc.PublishRequest(p.subject, p.inbox+".0", []byte(body)); err != nil {
		t.Fatal(err)
	}
}

// publishAndPull publishes the job customID of batch b1 and pulls it with p: its first
// delivery, and its stream sequence.
func publishAndPull(t *testing.T, b *testBundle, p *JobPuller, customID string) (jetstream.Msg, uint64) {
	t.Helper()
	publishJob(t, b.q, "b1", customID)
	var msg jetstream.Msg
	if got, err := p.Pull(context.Background(), 1, time.Second, func(m jetstream.Msg) { msg = m }); err != nil || got != 1 {
		t.Fatalf("pull %s: %d, %v", customID, got, err)
	}
	seq, _ := StreamSeq(msg)
	return msg, seq
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func jobsInStream(t *testing.T, b *testBundle) uint64 {
	t.Helper()
	info, err := b.q.Jobs.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestJobPullerDeliversAtMostWhatItAskedFor(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	p := newPuller(t, b)
	ctx := context.Background()
	for i := range 5 {
		publishJob(t, b.q, "b1", "job-"+strconv.Itoa(i))
	}
	var msgs []jetstream.Msg
	collect := func(m jetstream.Msg) { msgs = append(msgs, m) }
	if got, err := p.Pull(ctx, 2, time.Second, collect); err != nil || got != 2 || len(msgs) != 2 {
		t.Fatalf("first pull: %d delivered (%d seen), err %v; want 2", got, len(msgs), err)
	}
	// Three are left: the request for five ends when it expires, with the three.
	if got, err := p.Pull(ctx, 5, 200*time.Millisecond, collect); err != nil || got != 3 || len(msgs) != 5 {
		t.Fatalf("second pull: %d delivered (%d seen in all), err %v; want 3", got, len(msgs), err)
	}
	for i, m := range msgs {
		if want := "job-" + strconv.Itoa(i); m.Headers().Get(HeaderCustomID) != want || string(m.Data()) != `{"custom_id":"`+want+`"}` {
			t.Fatalf("job %d: custom id %q, data %s", i, m.Headers().Get(HeaderCustomID), m.Data())
		}
		if batch := b.q.Names.BatchFromJobSubject(m.Subject()); batch != "b1" {
			t.Fatalf("job %d: subject %q, batch %q", i, m.Subject(), batch)
		}
		meta, err := m.Metadata()
		if err != nil || meta.NumDelivered != 1 || meta.Stream != b.q.Names.JobsStream() || meta.Consumer != ConsumerName {
			t.Fatalf("job %d: metadata %+v, err %v", i, meta, err)
		}
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the acked jobs to leave the work queue", func() bool { return jobsInStream(t, b) == 0 })
	if got, err := p.Pull(ctx, 1, 100*time.Millisecond, collect); err != nil || got != 0 {
		t.Fatalf("pull of an empty queue: %d delivered, err %v", got, err)
	}
}

// TestJobPullerKnowsWhenItsRequestsEnded: no request is abandoned while every request got
// all it asked for or the server ended it; one the caller gave up on, which the server may
// still hold, is kept with its expiry, also after later requests ended: Close lingers for
// such a request only when it may still be open.
func TestJobPullerKnowsWhenItsRequestsEnded(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	p := newPuller(t, b)
	ctx := context.Background()
	publishJob(t, b.q, "b1", "a")
	publishJob(t, b.q, "b1", "b")
	ack := func(m jetstream.Msg) { _ = m.Ack() }
	if got, err := p.Pull(ctx, 2, 5*time.Second, ack); err != nil || got != 2 || !p.abandoned.expires.IsZero() {
		t.Fatalf("a request that got all it asked for: %d, %v, open until %v", got, err, p.abandoned.expires)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	sent := time.Now()
	if _, err := p.Pull(short, 5, 5*time.Second, ack); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request given up on: %v", err)
	}
	open := p.abandoned.expires
	if open.Before(sent.Add(5*time.Second)) || open.After(time.Now().Add(5*time.Second)) {
		t.Fatalf("a request given up on is open until %v, want its expiry, 5 s after it was sent at %v", open, sent)
	}
	if got, err := p.Pull(ctx, 1, 100*time.Millisecond, ack); err != nil || got != 0 || !p.abandoned.expires.Equal(open) {
		t.Fatalf("after a request the server ended: %d, %v, open until %v, want %v (the one given up on)", got, err, p.abandoned.expires, open)
	}
}

func TestJobPullerKeepsTheJobsOfARequestItGaveUpOn(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	p := newPuller(t, b)
	ctx := context.Background()
	// An earlier request brings two jobs after it was given up on, and another one's end
	// (a 408) comes late too.
	pullInto(t, b, p, 2, 5*time.Second)
	publishJob(t, b.q, "b1", "late-1")
	publishJob(t, b.q, "b1", "late-2")
	waitFor(t, "the late jobs in the inbox", func() bool { return len(p.msgs) == 2 })
	pullInto(t, b, p, 1, 50*time.Millisecond)
	waitFor(t, "the late request's end", func() bool { return len(p.msgs) == 3 })
	publishJob(t, b.q, "b1", "now")

	var ids []string
	got, err := p.Pull(ctx, 3, 2*time.Second, func(m jetstream.Msg) {
		ids = append(ids, m.Headers().Get(HeaderCustomID))
		_ = m.Ack()
	})
	if err != nil || got != 3 {
		t.Fatalf("pull: %d delivered (%v), err %v; want the two late jobs and the new one", got, ids, err)
	}
	if ids[0] != "late-1" || ids[1] != "late-2" || ids[2] != "now" {
		t.Fatalf("delivered %v", ids)
	}
}

func TestJobPullerCloseHandsBackLateJobs(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{}) // AckWait 30 s
	p, err := b.q.NewJobPuller(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pullInto(t, b, p, 1, 5*time.Second)
	publishJob(t, b.q, "b1", "late")
	waitFor(t, "the late job in the inbox", func() bool { return len(p.msgs) == 1 })
	if err := p.Close(nil); err != nil {
		t.Fatal(err)
	}
	cons, err := b.q.Consumer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Handed back, it is delivered again at once, not after AckWait.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var delivered []uint64
	for m := range batch.Messages() {
		delivered = append(delivered, NumDelivered(m))
		_ = m.Ack()
	}
	if len(delivered) != 1 || delivered[0] != 2 {
		t.Fatalf("deliveries after Close: %v, want one, the job's second", delivered)
	}
}

// TestJobPullerCloseLeavesALateDeliveryOfAHeldJob: a job delivered again into a request Close
// finds, while the caller still works on its earlier delivery (its ack wait passed while its
// link was down), is left to that delivery: handed back, it went at once to another worker,
// which sampled it a second time.
func TestJobPullerCloseLeavesALateDeliveryOfAHeldJob(t *testing.T) {
	t.Parallel()
	for _, held := range []bool{true, false} {
		b := setup(t, Config{AckWait: 2 * time.Second})
		p, err := b.q.NewJobPuller(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_, seq := publishAndPull(t, b, p, "held")
		pullInto(t, b, p, 1, 10*time.Second) // answered by the job's second delivery, once its ack wait passed
		waitFor(t, "the second delivery in the inbox", func() bool { return len(p.msgs) == 1 })
		if err := p.Close(func(s uint64) bool { return held && s == seq }); err != nil {
			t.Fatal(err)
		}
		cons, err := b.q.Consumer(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// Within the ack wait: only a job handed back is delivered.
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range batch.Messages() {
			n++
		}
		if held && n != 0 {
			t.Fatalf("a late delivery of a job still held was handed back: delivered to another at once")
		}
		if !held && n != 1 {
			t.Fatalf("a late job nobody holds was not handed back (%d delivered)", n)
		}
	}
}

func TestJobPullerReportsADeletedConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	p := newPuller(t, b)
	ctx := context.Background()
	errc := make(chan error, 1)
	go func() {
		_, err := p.Pull(ctx, 1, 10*time.Second, func(jetstream.Msg) {})
		errc <- err
	}()
	// The request has reached the server once the consumer counts it waiting: a delete before
	// that left it no consumer to reach, and a 503 (no responders) for a 409 (deleted).
	waitFor(t, "the pull request waiting at the consumer", func() bool {
		cons, err := b.q.JS.Consumer(ctx, b.q.Names.JobsStream(), ConsumerName)
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting > 0
	})
	if err := b.q.JS.DeleteConsumer(ctx, b.q.Names.JobsStream(), ConsumerName); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, jetstream.ErrConsumerDeleted) {
			t.Fatalf("pull from a deleted consumer: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pull went on waiting after the consumer was deleted")
	}
}

func TestJobMsgSettlesAsJetStreamsMessagesDo(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	p := newPuller(t, b)
	ctx := context.Background()
	for _, id := range []string{"later", "failed", "done"} {
		publishJob(t, b.q, "b1", id)
	}
	msgs := map[string]jetstream.Msg{}
	if got, err := p.Pull(ctx, 3, time.Second, func(m jetstream.Msg) { msgs[m.Headers().Get(HeaderCustomID)] = m }); err != nil || got != 3 {
		t.Fatalf("pull: %d, %v", got, err)
	}
	if err := msgs["later"].InProgress(); err != nil {
		t.Fatal(err)
	}
	if err := msgs["later"].NakWithDelay(time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := msgs["later"].Ack(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		t.Fatalf("ack after nak: %v, want ErrMsgAlreadyAckd", err)
	}
	if err := msgs["failed"].TermWithReason("bad job"); err != nil {
		t.Fatal(err)
	}
	if err := msgs["done"].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	// Termed and acked jobs leave the work queue; the delayed one stays, not delivered yet.
	waitFor(t, "the settled jobs to leave", func() bool { return jobsInStream(t, b) == 1 })
	if got, err := p.Pull(ctx, 1, 300*time.Millisecond, func(jetstream.Msg) {}); err != nil || got != 0 {
		t.Fatalf("pull while the only job waits out its nak delay: %d, %v", got, err)
	}
}

// TestPublishAgainTakesNoOtherJobsID: the copy's message id is no first publish's, whatever
// the custom ids: with "<id>/again/<seq>" it was that of the job named so, and the server
// dropped the copy as its duplicate while the original was ended: the job was lost.
func TestPublishAgainTakesNoOtherJobsID(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxDeliver: 1, AckWait: 500 * time.Millisecond})
	p := newPuller(t, b)
	ctx := context.Background()
	msg, seq := publishAndPull(t, b, p, "x")
	for _, other := range []string{fmt.Sprintf("x/again/%d", seq), fmt.Sprintf("again:%d:b1/x", seq)} {
		publishJob(t, b.q, "b1", other)
	}
	if err := b.q.PublishAgain(ctx, msg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // past the original's ack wait
	seen := map[string]bool{}
	if _, err := p.Pull(ctx, 5, 300*time.Millisecond, func(m jetstream.Msg) { seen[m.Headers().Get(HeaderCustomID)] = true }); err != nil {
		t.Fatal(err)
	}
	if !seen["x"] || len(seen) != 3 {
		t.Fatalf("jobs left in the stream: %v; want x's copy and the two others", seen)
	}
}

// TestPublishAgainEndsTheOriginal: a job on its last delivery published again leaves the
// stream at once, so that it cannot run out of deliveries into a dead letter whose error
// result could come before its copy's. Its term may not reach the server (here no one answers
// it): it is deleted instead. Or the term reaches it and only the answer is lost: then it is
// gone already, and that is no error. The copy comes next, marked.
func TestPublishAgainEndsTheOriginal(t *testing.T) {
	t.Parallel()
	for _, term := range []string{"answered", "lost", "answer lost"} {
		t.Run(term, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{MaxDeliver: 1, AckWait: 500 * time.Millisecond})
			p := newPuller(t, b)
			ctx := context.Background()
			msg, seq := publishAndPull(t, b, p, "last")
			j := msg.(*jobMsg)
			if term == "answer lost" {
				if _, err := b.nc.Request(j.msg.Reply, []byte(ackTerm), 5*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			if term != "answered" { // its ack subject names a stream that is not there: nobody answers
				j.msg.Reply = strings.Replace(j.msg.Reply, "."+b.q.Names.JobsStream()+".", ".GONE.", 1)
			}
			if err := b.q.PublishAgain(ctx, msg); err != nil {
				t.Fatalf("publish again: %v", err)
			}
			if _, err := b.q.Jobs.GetMsg(ctx, seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
				t.Fatalf("the job published again is still in the stream (%v): it would end as a dead letter", err)
			}
			if err := msg.Nak(); !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				t.Fatalf("nak after it was published again: %v, want ErrMsgAlreadyAckd", err)
			}
			time.Sleep(time.Second) // past the original's ack wait
			var copies []jetstream.Msg
			// Shorter than the ack wait, which would bring the copy again (the consumer keeps
			// a delivery for its dead letter).
			if _, err := p.Pull(ctx, 2, 300*time.Millisecond, func(m jetstream.Msg) { copies = append(copies, m) }); err != nil {
				t.Fatal(err)
			}
			if len(copies) != 1 || copies[0].Headers().Get(HeaderCustomID) != "last" || copies[0].Headers().Get(HeaderRepublished) == "" {
				t.Fatalf("after the ack wait: %d jobs delivered, want the copy alone", len(copies))
			}
		})
	}
}

// TestJobPullerReportsARequestAboveTheConsumersLimits: a 409 the next request would meet again
// (here a batch above the consumer's MaxRequestBatch) is an error, not an empty pull.
func TestJobPullerReportsARequestAboveTheConsumersLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	cons, err := b.q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	cfg.MaxRequestBatch = 2
	if _, err := b.q.JS.UpdateConsumer(ctx, b.q.Names.JobsStream(), cfg); err != nil {
		t.Fatal(err)
	}
	p := newPuller(t, b)
	got, err := p.Pull(ctx, 5, 5*time.Second, func(jetstream.Msg) {})
	if err == nil || !strings.Contains(err.Error(), "MaxRequestBatch") || got != 0 {
		t.Fatalf("pull of 5 from a consumer that allows 2: %d, %v", got, err)
	}
}

// TestJobPullerAsksNothingWhileDisconnected: without a connection Pull fails at once rather
// than leave a request in nats.go's reconnect buffer, which the server would serve after the
// reconnect, long after Pull gave up on it.
func TestJobPullerAsksNothingWhileDisconnected(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	p := newPuller(t, b)
	b.emb.Shutdown()
	waitFor(t, "the connection to notice", func() bool { return !b.nc.IsConnected() })
	before := b.nc.Stats().OutMsgs
	got, err := p.Pull(context.Background(), 5, 5*time.Second, func(jetstream.Msg) {})
	if !errors.Is(err, nats.ErrConnectionReconnecting) || got != 0 {
		t.Fatalf("pull while disconnected: %d, %v", got, err)
	}
	if after := b.nc.Stats().OutMsgs; after != before {
		t.Fatalf("%d messages buffered for the reconnect", after-before)
	}
}

// TestJobPullerClosesAtOnceWithoutAConnection: with the connection down, Close does not wait
// to drain the inbox from a server that is not there.
func TestJobPullerClosesAtOnceWithoutAConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	p, err := b.q.NewJobPuller(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.emb.Shutdown()
	waitFor(t, "the connection to drop", func() bool { return !b.nc.IsConnected() })
	began := time.Now()
	if err := p.Close(nil); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Second {
		t.Fatalf("Close took %v with no server to drain from", took)
	}
}

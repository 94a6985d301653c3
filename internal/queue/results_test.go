package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// resultGroup makes n result messages of batch, custom ids id-0..id-n-1.
func resultGroup(t *testing.T, q *Queue, codec *Codec, batch string, n int) []*nats.Msg {
	t.Helper()
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		id := fmt.Sprintf("id-%d", i)
		msg, err := q.ResultMsg(nil, codec, batch, id, "ok", Tokens{}, []byte(`{"custom_id":"`+id+`"}`), 0)
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = msg
	}
	return msgs
}

// publisherBed starts a server with the streams and returns them, a codec and a result
// publisher on a connection made with opts, released when the test ends.
func publisherBed(t *testing.T, opts ...nats.Option) (*testBundle, *Codec, *ResultPublisher) {
	t.Helper()
	b := setup(t, Config{}, opts...)
	codec := newCodec(t, 0)
	p, err := b.q.NewResultPublisher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return b, codec, p
}

// newCodec returns a codec with threshold (0: the default), closed when the test ends.
func newCodec(t *testing.T, threshold int) *Codec {
	t.Helper()
	codec, err := NewCodec(threshold)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(codec.Close)
	return codec
}

// refuse makes the stream refuse msg: it expects a last sequence its subject does not have.
func refuse(msg *nats.Msg) { msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "999999") }

// TestResultPublisherTellsEachMessageOfAGroupApart: a group's messages are answered one by
// one, each error lands on its own message, a repeated result counts as stored, and a
// subject no stream takes is an error.
func TestResultPublisherTellsEachMessageOfAGroupApart(t *testing.T) {
	t.Parallel()
	b, codec, p := publisherBed(t)
	ctx := context.Background()

	const n = 30
	msgs := resultGroup(t, b.q, codec, "b1", n)
	for i := 0; i < n; i += 7 {
		refuse(msgs[i])
	}
	msgs[n-1].Subject = "nowhere.results" // no stream
	errs := make([]error, n)
	p.Publish(ctx, msgs, errs)
	for i, err := range errs {
		var apiErr *jetstream.APIError
		switch {
		case i == n-1:
			if !errors.Is(err, jetstream.ErrNoStreamResponse) {
				t.Errorf("message to no stream: err = %v, want no stream response", err)
			}
		case i%7 == 0:
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
				t.Errorf("refused message %d: err = %v, want wrong last sequence", i, err)
			}
		case err != nil:
			t.Errorf("message %d: %v", i, err)
		}
	}
	info, err := b.q.Results.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(n - 1 - (n+6)/7); info.State.Msgs != want {
		t.Fatalf("results stream holds %d messages, want %d", info.State.Msgs, want)
	}

	// The same results again (a job delivered twice): stored, as far as the worker is concerned.
	again := resultGroup(t, b.q, codec, "b1", 3)
	p.Publish(ctx, again, errs[:3])
	for i, err := range errs[:3] {
		if err != nil {
			t.Errorf("repeated result %d: %v", i, err)
		}
	}
}

// TestResultPublisherIgnoresTheAcksOfAGroupItGaveUpOn: acks of a group that were not waited
// for (here its context was done) must not answer the next group's messages.
func TestResultPublisherIgnoresTheAcksOfAGroupItGaveUpOn(t *testing.T) {
	t.Parallel()
	b, codec, p := publisherBed(t)

	const n = 100
	done, cancel := context.WithCancel(context.Background())
	cancel()
	errs := make([]error, n)
	p.Publish(done, resultGroup(t, b.q, codec, "b1", n), errs)
	for i, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	// The next group, on the same positions: the first half is refused. A positive ack of the
	// first group taken for one of them would show here as stored.
	next := resultGroup(t, b.q, codec, "b2", n)
	for _, msg := range next[:n/2] {
		refuse(msg)
	}
	p.Publish(context.Background(), next, errs)
	for i, err := range errs {
		if refused := i < n/2; refused != (err != nil) {
			t.Fatalf("message %d of the next group: err = %v, refused %v", i, err, refused)
		}
	}
}

// TestResultPublisherAfterClose: a closed publisher stores nothing and says so.
func TestResultPublisherAfterClose(t *testing.T) {
	t.Parallel()
	b, codec, p := publisherBed(t)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, 1)
	p.Publish(context.Background(), resultGroup(t, b.q, codec, "b1", 1), errs)
	if errs[0] == nil {
		t.Fatal("a closed publisher stored a result")
	}
}

// TestFirstResultIsFinal: a second result for a job, by either way of publishing, counts as
// stored and leaves the first in place; results carry no de-duplication id, so the server
// keeps none in memory for them; a refusal for another reason is not taken for stored.
func TestFirstResultIsFinal(t *testing.T) {
	t.Parallel()
	b, codec, p := publisherBed(t)
	ctx := context.Background()
	first := resultGroup(t, b.q, codec, "b1", 2)
	errs := make([]error, 2)
	p.Publish(ctx, first, errs)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	second := func(id string) *nats.Msg {
		msg, err := b.q.ResultMsg(nil, codec, "b1", id, "error", Tokens{}, []byte(`{"second":true}`), 0)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	p.Publish(ctx, []*nats.Msg{second("id-0")}, errs[:1])
	if errs[0] != nil {
		t.Errorf("second result through the publisher: %v, want stored", errs[0])
	}
	if first, err := b.q.PublishResult(ctx, second("id-1")); err != nil || first {
		t.Errorf("second result through PublishResult: first %v, %v; want stored, not first", first, err)
	}
	if first, err := b.q.PublishResult(ctx, second("id-2")); err != nil || !first {
		t.Errorf("first result through PublishResult: first %v, %v", first, err)
	}
	for _, id := range []string{"id-0", "id-1"} {
		m, err := b.q.Results.GetLastMsgForSubject(ctx, b.q.Names.ResultSubject("b1", id))
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Data) != `{"custom_id":"`+id+`"}` || m.Header.Get(HeaderStatus) != "ok" || m.Header.Get(jetstream.MsgIDHeader) != "" {
			t.Errorf("%s: stored %s %v, want the first result and no Nats-Msg-Id", id, m.Data, m.Header)
		}
	}
	info, err := b.q.Results.Info(ctx)
	if err != nil || info.State.Msgs != 3 {
		t.Fatalf("results stream: %v, %+v", err, info)
	}

	refused := second("id-9")
	refuse(refused)
	if _, err := b.q.PublishResult(ctx, refused); err == nil || ResultStored(err) {
		t.Errorf("a result refused for its expected sequence: %v, want an error that is not 'stored'", err)
	}
}

// TestSetupMakesTheFirstResultFinal: Setup turns a results stream made by an older version
// (which replaced a job's result with a later one) into one that keeps the first.
func TestSetupMakesTheFirstResultFinal(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	cfg := b.q.Results.CachedInfo().Config
	cfg.Discard, cfg.DiscardNewPerSubject = jetstream.DiscardOld, false
	if _, err := b.q.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	q, err := Setup(ctx, b.q.JS, Config{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := q.Results.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Config; c.Discard != jetstream.DiscardNew || !c.DiscardNewPerSubject || c.MaxMsgsPerSubject != 1 {
		t.Fatalf("results stream after Setup: discard %v, per subject %v, max per subject %d", c.Discard, c.DiscardNewPerSubject, c.MaxMsgsPerSubject)
	}
}

// TestResultPublisherCutOffFromItsServer: results published while the connection is down,
// beyond what nats.go buffers for the reconnect, fail as "the store is unavailable now" (to
// be held and tried again), not as refused (which would have their jobs sampled again).
func TestResultPublisherCutOffFromItsServer(t *testing.T) {
	t.Parallel()
	b, codec, p := publisherBed(t, nats.ReconnectBufSize(2048))
	ctx := context.Background()

	b.emb.Shutdown()
	for b.nc.Status() == nats.CONNECTED {
		time.Sleep(time.Millisecond)
	}
	msgs := resultGroup(t, b.q, codec, "b1", 60) // about 200 bytes each: more than 2 KiB
	errs := make([]error, len(msgs))
	p.Publish(ctx, msgs, errs)
	buffered, refused := 0, 0
	for i, err := range errs {
		switch {
		case err == nil:
			t.Fatalf("result %d stored with the server down", i)
		case !StoreUnavailable(err):
			t.Errorf("result %d: %v: not taken for a store that is unavailable now", i, err)
		case errors.Is(err, nats.ErrReconnectBufExceeded):
			refused++
		default:
			buffered++
		}
	}
	if buffered == 0 || refused == 0 {
		t.Errorf("%d results buffered for the reconnect and %d refused by a full buffer; want some of each", buffered, refused)
	}
}

// TestResultTokensRideInAHeader: a result's tokens are read back from its stored headers; a
// message reused for a result without tokens loses the header; values that are not three
// counts read as none.
func TestResultTokensRideInAHeader(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	codec := newCodec(t, 0)
	used := Tokens{Prompt: 1200, Completion: 35, CacheHit: 300}
	var msg *nats.Msg // reused, as a worker reuses its result messages
	for _, r := range []struct {
		id, status string
		tokens     Tokens
	}{{"a", "ok", used}, {"b", "error", Tokens{}}} {
		var err error
		if msg, err = b.q.ResultMsg(msg, codec, "b1", r.id, r.status, r.tokens, []byte(`{}`), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := b.q.PublishResult(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[string]Tokens{"a": used, "b": {}} {
		stored, err := b.q.Results.GetLastMsgForSubject(ctx, b.q.Names.ResultSubject("b1", id))
		if err != nil {
			t.Fatal(err)
		}
		if got := ResultTokens(stored.Header); got != want {
			t.Errorf("result %s: tokens %+v, want %+v (header %q)", id, got, want, stored.Header.Get(HeaderTokens))
		}
	}
	for _, bad := range []string{"", "1 2", "1 2 3 4", "1 x 3", "1 -2 3", "1  2 3"} {
		if got := ResultTokens(nats.Header{HeaderTokens: {bad}}); got != (Tokens{}) {
			t.Errorf("ResultTokens(%q) = %+v, want none", bad, got)
		}
	}
}

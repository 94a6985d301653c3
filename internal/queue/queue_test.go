package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
)

type testBundle struct {
	emb *Embedded
	nc  *nats.Conn
	q   *Queue
}

func setup(t *testing.T, cfg Config, opts ...nats.Option) *testBundle {
	t.Helper()
	return setupIn(t, t.TempDir(), cfg, opts...)
}

// setupIn is setup with the embedded server's store in dir, so that a test can start a
// server on the store of one it stopped.
func setupIn(t *testing.T, dir string, cfg Config, opts ...nats.Option) *testBundle {
	t.Helper()
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	b := setupOn(t, emb.ClientURL(), cfg, opts...)
	b.emb = emb
	return b
}

// setupOn is setup on the server at url.
func setupOn(t *testing.T, url string, cfg Config, opts ...nats.Option) *testBundle {
	t.Helper()
	js := connect(t, url, t.Name(), opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := Setup(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{nc: js.Conn(), q: q}
}

// connect connects to url as name until the test ends.
func connect(t *testing.T, url, name string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := Connect(ConnectConfig{URL: url, Name: name}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// publishJob publishes a job with customID to batch and waits for the stream's ack.
func publishJob(t *testing.T, q *Queue, batch, customID string) {
	t.Helper()
	f, err := q.PublishJobAsync(batch, customID, []byte(`{"custom_id":"`+customID+`"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Ok():
	case err := <-f.Err():
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no ack")
	}
}

func TestSetupIsIdempotentAndNamesFollowPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Prefix: "fleet-a"})
	ctx := context.Background()
	if _, err := Setup(ctx, b.q.JS, Config{Prefix: "fleet-a"}); err != nil {
		t.Fatalf("second setup: %v", err)
	}
	info, err := b.q.Jobs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Name != "FLEET_A_JOBS" || info.Config.Retention != jetstream.WorkQueuePolicy {
		t.Fatalf("jobs stream = %s %v", info.Config.Name, info.Config.Retention)
	}
	c, err := b.q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Ten deliveries to work on, and one for the dead letter.
	if got := c.CachedInfo().Config; got.AckPolicy != jetstream.AckExplicitPolicy || got.MaxDeliver != 11 || got.AckWait != 30*time.Second {
		t.Fatalf("consumer config = %+v", got)
	}
	if b.q.Config.MaxDeliver != 10 {
		t.Fatalf("MaxDeliver read back as %d, want 10", b.q.Config.MaxDeliver)
	}
	if _, err := NewNames("Bad.Prefix"); err == nil {
		t.Fatal("a prefix with a dot and capitals was accepted")
	}
	// fleet_a names the same streams: it is refused, by Setup and by Bind, and fleet-a's
	// streams keep their subjects.
	for name, ensure := range map[string]func(context.Context, jetstream.JetStream, Config) (*Queue, error){"Setup": Setup, "Bind": Bind} {
		_, err := ensure(ctx, b.q.JS, Config{Prefix: "fleet_a"})
		if err == nil || !strings.Contains(err.Error(), "stream FLEET_A_JOBS holds subject fleet-a.jobs.*, of another prefix than fleet_a") {
			t.Errorf("%s of prefix fleet_a beside fleet-a: %v", name, err)
		}
	}
	if info, err := b.q.Jobs.Info(ctx); err != nil || info.Config.Subjects[0] != "fleet-a.jobs.*" {
		t.Fatalf("fleet-a's jobs stream after fleet_a's setup: %v, %v", info.Config.Subjects, err)
	}
}

// TestTheDeliveryForTheDeadLetterIsReadBack: MaxDeliver counts the deliveries a job is worked
// on. Bind reads it from the consumer as Setup left it: one less than the server's, which
// keeps a delivery for the dead letter; all of them for a consumer of an earlier version,
// which keeps none, until a worker sets it up again; and no limit as no limit.
func TestTheDeliveryForTheDeadLetterIsReadBack(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxDeliver: 4})
	ctx := context.Background()
	bound := func() int {
		t.Helper()
		q, err := Bind(ctx, b.q.JS, Config{MaxDeliver: 7}) // submit's flags do not count
		if err != nil {
			t.Fatal(err)
		}
		return q.Config.MaxDeliver
	}
	if got := bound(); got != 4 {
		t.Fatalf("bound: MaxDeliver %d, want 4", got)
	}

	earlier := jetstream.ConsumerConfig{Durable: ConsumerName, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5}
	if _, err := b.q.JS.UpdateConsumer(ctx, b.q.Names.JobsStream(), earlier); err != nil {
		t.Fatal(err)
	}
	if got := bound(); got != 5 {
		t.Fatalf("bound to an earlier version's consumer: MaxDeliver %d, want 5", got)
	}
	q, err := Setup(ctx, b.q.JS, Config{MaxDeliver: 5})
	if err != nil {
		t.Fatal(err)
	}
	c, err := q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxDeliver; got != 6 || q.Config.MaxDeliver != 5 || bound() != 5 {
		t.Fatalf("set up again: the server's MaxDeliver %d, read back %d and %d; want 6, 5, 5", got, q.Config.MaxDeliver, bound())
	}

	if q, err = Setup(ctx, b.q.JS, Config{MaxDeliver: -1}); err != nil {
		t.Fatal(err)
	}
	if c, err = q.Consumer(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxDeliver; got != -1 || q.Config.MaxDeliver != -1 {
		t.Fatalf("no limit: the server's MaxDeliver %d, read back %d; want -1 both", got, q.Config.MaxDeliver)
	}
}

// TestTheConsumerIsNotChangedUnderRunningWorkers: each worker reads the consumer's ack wait and
// deliveries once, at its setup. While workers run (their presence notes, or, with nobody
// noting them, their pull requests waiting), a setup that would shorten the ack wait or
// change the deliveries is refused and changes nothing; a longer ack wait, or the same
// settings, are set up; and any change once no worker runs.
func TestTheConsumerIsNotChangedUnderRunningWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{AckWait: 30 * time.Second, MaxDeliver: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	consumer := func() jetstream.ConsumerConfig {
		t.Helper()
		c, err := b.q.Consumer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c.CachedInfo().Config
	}
	refused := func(cfg Config, want string) {
		t.Helper()
		before := consumer()
		if _, err := Setup(ctx, b.q.JS, cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("setup %+v under running workers: %v, want refused for %q", cfg, err, want)
		}
		if after := consumer(); after.AckWait != before.AckWait || after.MaxDeliver != before.MaxDeliver {
			t.Errorf("a refused setup changed the consumer: ack wait %v, max deliver %d; was %v, %d", after.AckWait, after.MaxDeliver, before.AckWait, before.MaxDeliver)
		}
	}
	accepted := func(cfg Config) {
		t.Helper()
		q, err := Setup(ctx, b.q.JS, cfg)
		if err != nil {
			t.Fatalf("setup %+v: %v", cfg, err)
		}
		if q.Config.AckWait != cfg.AckWait || q.Config.MaxDeliver != cfg.MaxDeliver {
			t.Fatalf("setup %+v: read back ack wait %v, max deliver %d", cfg, q.Config.AckWait, q.Config.MaxDeliver)
		}
	}

	// Nobody notes presence, and a worker's pull request waits.
	req, err := b.nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	pull, _ := json.Marshal(map[string]any{"batch": 1, "expires": int64(20 * time.Second)})
	if err := b.nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+b.q.Names.JobsStream()+"."+ConsumerName, req.Subject, pull); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := b.q.Consumer(ctx)
		if err == nil && c.CachedInfo().NumWaiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pull request does not wait")
		}
	}
	refused(Config{AckWait: time.Second, MaxDeliver: 4}, "pull requests wait")
	_ = req.Unsubscribe()

	// A worker notes its presence.
	noteRunningWorker(t, b, "w1")
	refused(Config{AckWait: time.Second, MaxDeliver: 4}, "a shorter ack wait (1s) than the consumer's (30s)")
	refused(Config{AckWait: 30 * time.Second, MaxDeliver: 9}, "another max deliver (9) than the consumer's (4)")
	refused(Config{AckWait: 30 * time.Second, MaxDeliver: -1}, "another max deliver (-1) than the consumer's (4)")
	accepted(Config{AckWait: 30 * time.Second, MaxDeliver: 4})
	accepted(Config{AckWait: time.Minute, MaxDeliver: 4})

	// The worker stops.
	if err := b.q.ForgetPresence(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	accepted(Config{AckWait: time.Second, MaxDeliver: 9})
}

// noteRunningWorker notes the presence of a running worker named id, as a worker does in the
// backoff bucket (made here if need be), and returns once a setup will find it: a write to the
// bucket after the note is stored.
func noteRunningWorker(t *testing.T, b *testBundle, id string) {
	t.Helper()
	ctx := context.Background()
	kv, err := b.q.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.q.Names.BackoffBucket()})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.q.NotePresence(id, Presence{Host: "host-" + id}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "test-sync", nil); err != nil { // stored after the note
		t.Fatal(err)
	}
}

// TestAMaxDeliverOfMaxIntIsNoLimit: the largest int as --max-deliver is no limit, as -1 is,
// and a worker started again with it joins workers that run with it. The consumer's delivery
// more wrapped around to a negative MaxDeliver, which the server stores as -1, so every later
// setup found the consumer set up otherwise and was refused while workers ran.
func TestAMaxDeliverOfMaxIntIsNoLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{MaxDeliver: math.MaxInt})
	ctx := context.Background()
	c, err := b.q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxDeliver; got != -1 || b.q.Config.MaxDeliver != -1 {
		t.Fatalf("the server's MaxDeliver %d, read back %d; want -1 both", got, b.q.Config.MaxDeliver)
	}
	noteRunningWorker(t, b, "w1")
	if _, err := Setup(ctx, b.q.JS, Config{MaxDeliver: 4}); err == nil || !strings.Contains(err.Error(), "another max deliver (4)") {
		t.Fatalf("a setup with another max deliver under the running worker: %v, want refused", err)
	}
	if _, err := Setup(ctx, b.q.JS, Config{MaxDeliver: math.MaxInt}); err != nil {
		t.Fatalf("a worker started again with the same --max-deliver: %v", err)
	}
}

func TestPublishJobTwiceStoresItOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for range 2 {
		publishJob(t, b.q, "b1", "job-1")
	}
	info, err := b.q.Jobs.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("jobs stream holds %d messages, want 1", info.State.Msgs)
	}
}

func TestResultsAreStoredOncePerJobAndLargeOnesCompressed(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	codec := newCodec(t, 1024)
	publish := func(msg *nats.Msg, customID string, data []byte, maxPayload int64) (*nats.Msg, error) {
		msg, err := b.q.ResultMsg(msg, codec, "b1", customID, "ok", Tokens{}, data, maxPayload)
		if err != nil {
			return nil, err
		}
		_, err = b.q.PublishResult(ctx, msg)
		return msg, err
	}

	if has, err := b.q.HasResult(ctx, "b1", "a.b c"); err != nil || has {
		t.Fatalf("HasResult before publish = %v, %v", has, err)
	}
	big := bytes.Repeat([]byte(`{"text":"the same words again"}`), 2000)
	if _, err := publish(nil, "a.b c", big, 1<<20); err != nil {
		t.Fatal(err)
	}
	reused, err := publish(nil, "a.b c", big, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if has, err := b.q.HasResult(ctx, "b1", "a.b c"); err != nil || !has {
		t.Fatalf("HasResult after publish = %v, %v", has, err)
	}
	msg, err := b.q.Results.GetLastMsgForSubject(ctx, b.q.Names.ResultSubject("b1", "a.b c"))
	if err != nil {
		t.Fatal(err)
	}
	if msg.Header.Get(HeaderContentEncoding) != "zstd" || len(msg.Data) >= len(big)/4 {
		t.Fatalf("stored %d bytes with encoding %q; want zstd, well under %d", len(msg.Data), msg.Header.Get(HeaderContentEncoding), len(big))
	}
	if msg.Header.Get(HeaderStatus) != "ok" || msg.Header.Get(HeaderCustomID) != "a.b c" {
		t.Fatalf("headers = %v", msg.Header)
	}
	got, err := codec.Decode(msg.Header, msg.Data)
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("decoded %d bytes (err %v), want the original %d", len(got), err, len(big))
	}
	info, err := b.q.Results.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("results stream holds %d messages, want 1", info.State.Msgs)
	}

	// A message reused for a small result after a compressed one loses its Content-Encoding.
	small := []byte(`{"text":"short"}`)
	if _, err := publish(reused, "small", small, 1<<20); err != nil {
		t.Fatal(err)
	}
	msg, err = b.q.Results.GetLastMsgForSubject(ctx, b.q.Names.ResultSubject("b1", "small"))
	if err != nil {
		t.Fatal(err)
	}
	if enc := msg.Header.Get(HeaderContentEncoding); enc != "" || !bytes.Equal(msg.Data, small) {
		t.Fatalf("small result on a reused message: encoding %q, data %q; want none, %q", enc, msg.Data, small)
	}
	if msg.Header.Get(HeaderCustomID) != "small" {
		t.Fatalf("small result on a reused message: headers = %v", msg.Header)
	}

	random := make([]byte, 128<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	_, err = publish(nil, "too-big", random, 64<<10)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized result: err = %v, want ErrTooLarge", err)
	}
}

// TestEveryResultStoredCanBeDecoded: a reader (submit) decodes a result up to the codec's
// bound (MaxResultBytes), whatever it declares, and a result's JSON compresses far below the
// server's max payload: 16 samples of 32,768 of Qwen3's longest token (128 spaces) with OpenAI
// logprobs are 266 MiB of JSON in 37 KiB. Such a result was stored, and submit stopped at it,
// unable to decode it, leaving the batch's later results unwritten on every run. ResultMsg
// refuses it now (ErrTooLarge), as it refuses one over the max payload, and the worker stores
// an error result in its place.
func TestEveryResultStoredCanBeDecoded(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	codec := newCodec(t, 0)
	codec.maxDecoded = 1 << 20 // MaxResultBytes, made small for the test
	at := bytes.Repeat([]byte(" "), codec.maxDecoded)
	msg, err := b.q.ResultMsg(nil, codec, "b1", "at", "ok", Tokens{}, at, 1<<20)
	if err != nil {
		t.Fatalf("a result at the bound: %v", err)
	}
	if _, err := b.q.PublishResult(ctx, msg); err != nil {
		t.Fatal(err)
	}
	stored, err := b.q.Results.GetLastMsgForSubject(ctx, b.q.Names.ResultSubject("b1", "at"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := codec.Decode(stored.Header, stored.Data); err != nil || len(got) != len(at) {
		t.Fatalf("a result at the bound decoded to %d bytes, %v; want %d", len(got), err, len(at))
	}

	over := append(at, ' ')
	msg, err = b.q.ResultMsg(nil, codec, "b1", "over", "ok", Tokens{}, over, 1<<20)
	if !errors.Is(err, ErrTooLarge) {
		if err == nil {
			_, err = codec.Decode(msg.Header, msg.Data)
		}
		t.Fatalf("a result of %d bytes, over the bound of %d, was made into a message of %d bytes (decoding it: %v); want ErrTooLarge",
			len(over), codec.maxDecoded, len(msg.Data), err)
	}
}

func TestResultsStoredCountsOneBatchAndLeavesNoConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	codec := newCodec(t, 0)
	for batch, ids := range map[string][]string{"b1": {"x", "y", "z", "y"}, "b10": {"x"}} {
		for _, id := range ids { // y twice: a job's second result is refused, not counted
			msg, err := b.q.ResultMsg(nil, codec, batch, id, "ok", Tokens{}, []byte(`{}`), 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.q.PublishResult(ctx, msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	for batch, want := range map[string]int{"b1": 3, "b10": 1, "b2": 0} {
		if n, err := b.q.ResultsStored(ctx, batch); err != nil || n != want {
			t.Errorf("ResultsStored(%s) = %d, %v; want %d", batch, n, err, want)
		}
	}
	info, err := b.q.Results.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Errorf("%d consumers left on the results stream, want none", info.State.Consumers)
	}
}

func TestManifestCompareAndSwap(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	m := Manifest{BatchID: "b1", Status: BatchPublishing, CreatedAt: time.Now()}
	rev, err := b.q.PutManifest(ctx, m, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.q.PutManifest(ctx, m, 0); err == nil {
		t.Fatal("creating an existing manifest succeeded")
	}
	m.Jobs = 5
	if _, err := b.q.PutManifest(ctx, m, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := b.q.PutManifest(ctx, m, rev); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		t.Fatalf("stale revision: err = %v", err)
	}
	got, err := b.q.UpdateManifest(ctx, "b1", func(m *Manifest) error { m.Status = BatchCancelled; return nil })
	if err != nil || got.Status != BatchCancelled || got.Jobs != 5 {
		t.Fatalf("UpdateManifest = %+v, %v", got, err)
	}
	list, err := b.q.Manifests(ctx)
	if err != nil || len(list) != 1 || list[0].BatchID != "b1" {
		t.Fatalf("Manifests = %+v, %v", list, err)
	}
	if _, _, err := b.q.GetManifest(ctx, "nope"); !errors.Is(err, ErrNoBatch) {
		t.Fatalf("missing batch: err = %v", err)
	}
}

// TestManifestsMakesNoRequestPerBatch lists many batches, with one deleted and one rewritten,
// and counts the message-get requests on the batches bucket's stream: the values come with
// one watch, so that listing on a remote server costs no round trip per batch.
func TestManifestsMakesNoRequestPerBatch(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	const n = 40
	for i := range n {
		m := Manifest{BatchID: fmt.Sprintf("b%02d", i), Status: BatchSubmitted, Jobs: i, CreatedAt: time.Now()}
		if _, err := b.q.PutManifest(ctx, m, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.q.Batches.Delete(ctx, "b07"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.q.UpdateManifest(ctx, "b03", func(m *Manifest) error { m.Status = BatchCancelled; return nil }); err != nil {
		t.Fatal(err)
	}

	nc := b.q.JS.Conn()
	gets := make(chan *nats.Msg, 4*n)
	stream := "KV_" + b.q.Batches.Bucket()
	for _, subject := range []string{"$JS.API.DIRECT.GET." + stream + ".>", "$JS.API.DIRECT.GET." + stream, "$JS.API.STREAM.MSG.GET." + stream} {
		sub, err := nc.ChanSubscribe(subject, gets)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	list, err := b.q.Manifests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil { // every request sent before has reached the subscriptions
		t.Fatal(err)
	}
	if len(gets) != 0 {
		t.Errorf("Manifests made %d get requests for %d batches, want none", len(gets), n-1)
	}
	var ids []string
	for _, m := range list {
		ids = append(ids, m.BatchID)
		if want := fmt.Sprintf("b%02d", m.Jobs); m.BatchID != want {
			t.Errorf("manifest %s holds the jobs of %s", m.BatchID, want)
		}
		if (m.BatchID == "b03") != (m.Status == BatchCancelled) {
			t.Errorf("manifest %s: status %s", m.BatchID, m.Status)
		}
	}
	if len(list) != n-1 || slices.Contains(ids, "b07") || ids[len(ids)-1] != "b03" {
		t.Fatalf("Manifests = %v; want the %d not deleted, the rewritten b03 last", ids, n-1)
	}
}

func TestNamesAndTokens(t *testing.T) {
	t.Parallel()
	n, _ := NewNames("")
	if got := n.ResultSubject("b", "x"); !strings.HasPrefix(got, "tinkerfleet.results.b.") || strings.Count(got, ".") != 3 {
		t.Fatalf("ResultSubject = %q", got)
	}
	// The first 120 bits of SHA-256("a") (ca978112ca1bbdca…), lower-case base32: stable across
	// processes and versions, since results already stored are found by it.
	if got := JobToken("a"); got != "zklycewkdo64v6wcggzzui64" || JobToken("b") == got {
		t.Fatalf("JobToken(a) = %q: not the stable digest", got)
	}
	if key, ok := ParseJobToken(JobToken("a")); !ok || key != JobKeyOf("a") || key == JobKeyOf("b") {
		t.Fatalf("ParseJobToken(JobToken(a)) = %x, %v; want %x", key, ok, JobKeyOf("a"))
	}
	for _, bad := range []string{"", "zklycewkdo64v6wcggzzui6", "zklycewkdo64v6wcggzzui64a", "ZKLYCEWKDO64V6WCGGZZUI64", "zklycewkdo64v6wcggzzui61"} {
		if key, ok := ParseJobToken(bad); ok {
			t.Errorf("ParseJobToken(%q) = %x, true: not a job token", bad, key)
		}
	}
	if n.BatchFromJobSubject("tinkerfleet.jobs.b-1") != "b-1" || n.BatchFromJobSubject("other.jobs.x") != "" ||
		n.BatchFromJobSubject("tinkerfleet.jobs.*") != "" || n.BatchFromJobSubject("tinkerfleet.jobs.>") != "" {
		t.Fatal("BatchFromJobSubject")
	}
	for _, bad := range []string{"", "a.b", "a b", "-x", strings.Repeat("x", 65)} {
		if ValidateBatchID(bad) == nil {
			t.Errorf("batch id %q accepted", bad)
		}
	}
}

func TestBindLeavesTheFleetsConfigurationAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{AckWait: 5 * time.Second, MaxAckPending: 64, DuplicateWindow: time.Hour})
	ctx := context.Background()
	q, err := Bind(ctx, b.q.JS, Config{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config; got.AckWait != 5*time.Second || got.MaxAckPending != 64 {
		t.Fatalf("Bind changed the consumer: ack wait %v, max ack pending %d", got.AckWait, got.MaxAckPending)
	}
	info, err := q.Jobs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Duplicates != time.Hour {
		t.Fatalf("Bind changed the jobs stream: duplicates window %v", info.Config.Duplicates)
	}

	// On an empty server, Bind creates what publishing needs.
	fresh := setup(t, Config{Prefix: "other"})
	if _, err := Bind(ctx, fresh.q.JS, Config{Prefix: "brand-new"}); err != nil {
		t.Fatalf("Bind on a new prefix: %v", err)
	}
}

// TestStreamFlagsReachTheStreams: --duplicate-window and --results-max-age (or their
// environment variables) size the streams that Setup makes.
func TestStreamFlagsReachTheStreams(t *testing.T) {
	t.Parallel()
	var cfg Config
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	env := map[string]string{"TINKERFLEET_RESULTS_MAX_AGE": "24h"}
	set := envflag.New(fs, func(k string) string { return env[k] })
	cfg.RegisterFlags(set)
	if err := fs.Parse([]string{"--duplicate-window", "10m"}); err != nil {
		t.Fatal(err)
	}
	if err := set.Err(); err != nil {
		t.Fatal(err)
	}
	b := setup(t, cfg)
	ctx := context.Background()
	jobsInfo, err := b.q.Jobs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resultsInfo, err := b.q.Results.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := jobsInfo.Config.Duplicates; got != 10*time.Minute {
		t.Errorf("jobs duplicate window %v; want 10m", got)
	}
	if got := resultsInfo.Config.Duplicates; got != 10*time.Minute {
		t.Errorf("results duplicate window %v; want 10m", got)
	}
	if got := resultsInfo.Config.MaxAge; got != 24*time.Hour {
		t.Errorf("results max age %v; want 24h", got)
	}
}

// TestTheLargestJobsDeadLetterCopyFits: a job as large as submit lets through (the max payload
// less JobHeaderRoom), with the longest batch and custom ids, is stored, and so is its
// dead-letter copy however long the reason: the reason is cut, at a character's start.
func TestTheLargestJobsDeadLetterCopyFits(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	// The longest custom ids: a plain one, and one that a space begins, which its headers
	// carry bracketed, with the mark that says so, beside the longest Nats-Msg-Id.
	for _, customID := range []string{strings.Repeat("c", 256), " " + strings.Repeat("c", 255)} {
		largestJobAndDeadCopy(t, b, customID)
	}
}

func largestJobAndDeadCopy(t *testing.T, b *testBundle, customID string) {
	t.Helper()
	// Not jetstream's 5 s for a context without a deadline: a megabyte read back as base64 in
	// JSON, under -race, on a loaded machine, took longer.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	batch := strings.Repeat("b", 64)
	data := bytes.Repeat([]byte("x"), int(b.nc.MaxPayload())-JobHeaderRoom)
	fut, err := b.q.PublishJobAsync(batch, customID, data, true)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-fut.Ok():
	case err := <-fut.Err():
		t.Fatalf("the largest job was not stored: %v", err)
	case <-ctx.Done():
		t.Fatal("no ack for the largest job")
	}
	reason := strings.Repeat("é", 8<<10) // a long error, two bytes a character
	if err := b.q.PublishDead(ctx, batch, customID, reason, data); err != nil {
		t.Fatalf("the dead-letter copy of the largest job: %v", err)
	}
	dead, err := b.q.Dead.GetLastMsgForSubject(ctx, b.q.Names.DeadSubject(batch))
	if err != nil {
		t.Fatalf("read the dead-letter copy: %v", err)
	}
	got := dead.Header.Get(HeaderDeadReason)
	if len(dead.Data) != len(data) || len(got) > maxDeadReason+len("…") || !utf8.ValidString(got) || !strings.HasPrefix(reason, strings.TrimSuffix(got, "…")) {
		t.Errorf("dead copy: %d bytes of %d, reason %d bytes (%q…)", len(dead.Data), len(data), len(got), got[:min(len(got), 20)])
	}
	if got := CustomID(dead.Header); got != customID {
		t.Errorf("dead copy of %q: custom id %q", customID, got)
	}
}

// TestCustomIDsWithSpacesAroundThemKeepTheirIdentity: nats.go trims the spaces around a
// header value, and a custom id may begin or end with spaces: "x " was dropped as a duplicate
// of "x" (their Nats-Msg-Ids were one), and " y" reached its worker as "y". Each is a job of
// its own, and its messages (job, copy published again, result) carry it whole.
func TestCustomIDsWithSpacesAroundThemKeepTheirIdentity(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	codec := newCodec(t, 0)
	ids := []string{"x", "x ", " y", "   ", "[z]"}
	for _, id := range ids {
		f, err := b.q.PublishJobAsync("b1", id, []byte(id), false)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				t.Errorf("job %q was dropped as another job's duplicate", id)
			}
		case err := <-f.Err():
			t.Fatal(err)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	for i, id := range ids {
		raw, err := b.q.Jobs.GetMsg(ctx, uint64(i+1))
		if err != nil {
			t.Fatalf("job %q: %v", id, err)
		}
		if got := CustomID(raw.Header); got != id || string(raw.Data) != id {
			t.Errorf("job %q is stored as %q (payload %q)", id, got, raw.Data)
		}
		msg, err := b.q.ResultMsg(nil, codec, "b1", id, "ok", Tokens{}, []byte("{}"), 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.q.PublishResult(ctx, msg); err != nil {
			t.Fatal(err)
		}
		res, err := b.q.Results.GetLastMsgForSubject(ctx, b.q.Names.ResultSubject("b1", id))
		if err != nil || CustomID(res.Header) != id {
			t.Errorf("result of %q: %v, custom id %q", id, err, CustomID(res.Header))
		}
	}
	// A header map reused for a plain id loses the mark.
	h := nats.Header{}
	setCustomID(h, " y")
	setCustomID(h, "[z]")
	if got := CustomID(h); got != "[z]" {
		t.Errorf("a reused header: %q, want [z]", got)
	}
}

// closeAfterWatch is a bucket whose WatchAll runs after, a connection closing, say, once the
// watch is made.
type closeAfterWatch struct {
	jetstream.KeyValue
	after func()
}

func (c closeAfterWatch) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := c.KeyValue.WatchAll(ctx, opts...)
	if err == nil {
		c.after()
	}
	return w, err
}

// TestManifestsSaysSoWhenItsWatchEnds: nats.go closes a watch's channel when its connection
// closes or its consumer cannot be made again; a closed channel read as the end of the initial
// values returned a part of the list, or none, as the whole.
func TestManifestsSaysSoWhenItsWatchEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	const n = 600
	for i := range n {
		if _, err := b.q.PutManifest(ctx, Manifest{BatchID: fmt.Sprintf("b%03d", i), Status: BatchSubmitted}, 0); err != nil {
			t.Fatal(err)
		}
	}
	q := *b.q
	q.Batches = closeAfterWatch{KeyValue: b.q.Batches, after: b.nc.Close}
	if list, err := q.Manifests(ctx); err == nil && len(list) < n {
		t.Fatalf("Manifests returned %d of %d manifests, and no error", len(list), n)
	}
}

package fleettest

import (
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// APIKey is the Tinker key the simulators of Sim accept.
const APIKey = "tml-fleettest.not-a-real-key"

// NATS starts an embedded nats-server with JetStream on a random port, storing in a temporary
// directory, and shuts it down when the test ends.
func NATS(t testing.TB) *queue.Embedded {
	t.Helper()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	return emb
}

// ClosedURL returns an http:// URL of a loopback port that nobody listens on (it was free a
// moment ago): a service that cannot be reached.
func ClosedURL(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	return url
}

// Sim serves a simulator over loopback HTTP and returns it with its base URL. It accepts
// APIKey; a zero LongPollWait becomes 200 ms so that polls turn over quickly.
func Sim(t testing.TB, cfg tinkersim.Config) (*tinkersim.Server, string) {
	t.Helper()
	cfg.APIKeys = []string{APIKey}
	if cfg.LongPollWait == 0 {
		cfg.LongPollWait = 200 * time.Millisecond
	}
	sim, err := tinkersim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	t.Cleanup(func() { ts.Close(); sim.Close() })
	return sim, ts.URL
}

// Queue connects to url on a connection of its own (closed when the test ends) and sets the
// queue up with cfg, as a worker does.
func Queue(t testing.TB, url string, cfg queue.Config, opts ...nats.Option) *queue.Queue {
	t.Helper()
	nc, err := queue.Connect(queue.ConnectConfig{URL: url, Name: t.Name()}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := queue.Setup(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// Publish publishes the jobs of batch and waits until the stream has stored every one.
// Failed publishes (a leader election on a cluster) are retried with the same message id,
// which the stream deduplicates.
func Publish(t testing.TB, q *queue.Queue, batch string, js []jobs.Job) {
	t.Helper()
	pending := js
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == 5 {
			t.Fatalf("%d jobs still unpublished after 5 attempts", len(pending))
		}
		type pub struct {
			job jobs.Job
			f   jetstream.PubAckFuture
		}
		var (
			pubs   []pub
			failed []jobs.Job
		)
		for _, j := range pending {
			data, err := j.Encode()
			if err != nil {
				t.Fatal(err)
			}
			f, err := q.PublishJobAsync(batch, j.CustomID, data, false)
			if err != nil {
				failed = append(failed, j)
				continue
			}
			pubs = append(pubs, pub{j, f})
		}
		for _, p := range pubs {
			select {
			case <-p.f.Ok():
			case <-p.f.Err():
				failed = append(failed, p.job)
			case <-time.After(30 * time.Second):
				failed = append(failed, p.job)
			}
		}
		pending = failed
	}
}

// Results waits (up to timeout) until want jobs of batch have a result, then reads every
// stored result message. It returns the results by custom id and how many messages each
// custom id has (more than one is a duplicate).
func Results(t testing.TB, q *queue.Queue, batch string, want int, timeout time.Duration) (map[string]jobs.Result, map[string]int) {
	t.Helper()
	results, counts := map[string]jobs.Result{}, map[string]int{}
	for _, data := range RawResults(t, q, batch, want, timeout) {
		var r jobs.Result
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatalf("result %s: %v", data, err)
		}
		results[r.CustomID] = r
		counts[r.CustomID]++
	}
	return results, counts
}

// RawResults waits (up to timeout) until want jobs of batch have a result, then reads every
// stored result message and returns their payloads, decompressed, in the stream's order.
//
// It reads as many messages as the server counts once the wait is over. It stopped at the
// first empty fetch before, and in a cluster just after a node was stopped, the first fetch
// of a fresh consumer could come back empty with every result stored.
func RawResults(t testing.TB, q *queue.Queue, batch string, want int, timeout time.Duration) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	deadline := time.Now().Add(timeout)
	var stored int
	for {
		var err error
		if stored, err = q.ResultsStored(ctx, batch); err != nil {
			t.Fatal(err)
		}
		if stored >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if stored == 0 {
		return nil
	}
	codec, err := queue.NewCodec(0)
	if err != nil {
		t.Fatal(err)
	}
	defer codec.Close()
	it, err := q.ReadResults(ctx, batch, false)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	out := make([][]byte, 0, stored)
	for read := 0; read < stored; read++ {
		m, err := it.Next(jetstream.NextMaxWait(30 * time.Second))
		if err != nil {
			t.Fatalf("read %d of the %d results of %s stored: %v", read, stored, batch, err)
		}
		data, err := codec.Decode(nats.Header(m.Headers()), m.Data())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
	return out
}

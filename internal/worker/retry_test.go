package worker

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestRetryNotesAreHeldToOneABatchASecond: a burst of retries of one batch is noted once a
// second; another batch has its own second; batches not noted lately are forgotten.
func TestRetryNotesAreHeldToOneABatchASecond(t *testing.T) {
	t.Parallel()
	var n retryNotes
	t0 := time.Unix(1_000_000, 0)
	steps := []struct {
		batch string
		at    time.Duration
		due   bool
	}{
		{"a", 0, true},
		{"a", 10 * time.Millisecond, false},
		{"b", 500 * time.Millisecond, true},
		{"a", 999 * time.Millisecond, false},
		{"a", time.Second, true},
		{"b", 1200 * time.Millisecond, false},
		{"b", 1500 * time.Millisecond, true},
		{"c", 5 * time.Second, true},
	}
	for _, s := range steps {
		if got := n.due(s.batch, t0.Add(s.at)); got != s.due {
			t.Errorf("%s at %v: due %v, want %v", s.batch, s.at, got, s.due)
		}
	}
	if len(n.last) != 1 {
		t.Errorf("remembers %d batches, want only the one noted last second", len(n.last))
	}
}

// TestJobsSentBackTogetherLogOneInfoLine: when every job in hand fails at once (a Tinker
// outage past the client's own retries), the worker says so at info once, with how many it
// sent back, and each job's line at debug: one info line per job flooded the log with one
// line per job slot at each failure.
func TestJobsSentBackTogetherLogOneInfoLine(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 2}, tinkersim.Config{Capacity: 64, BaseLatency: 200 * time.Millisecond,
		Faults: []tinkersim.Fault{{Kind: tinkersim.FaultFailed, Category: "server"}}})
	var logs fleettest.Buffer
	w := b.open(t, b.connect(t), Config{Concurrency: 32, RetryDelay: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	run(t, w)
	const n = 24
	publishJobs(t, b.results, "outage", tokenJobs("o", n))
	waitResults(t, b.results, "outage", n, 30*time.Second)

	wantThinned(t, &logs, "job will be retried", "sent_back", n)
}

// wantThinned fails unless the n lines of msg in logs (a text handler's, at debug) are one
// at info (two, across thinnedEvery) that counts them under countKey, and the rest at debug.
func wantThinned(t *testing.T, logs *fleettest.Buffer, msg, countKey string, n int) {
	t.Helper()
	var info, debug, counted int
	for _, line := range strings.Split(logs.String(), "\n") {
		switch {
		case !strings.Contains(line, msg):
		case strings.Contains(line, "level=INFO"):
			info++
			if strings.Contains(line, " "+countKey+"=") {
				counted++
			}
		case strings.Contains(line, "level=DEBUG"):
			debug++
		}
	}
	if info < 1 || info > 2 || info+debug != n {
		t.Errorf("%d jobs: %d info lines and %d debug lines of %q, want 1 info line (2 across an interval) and the rest at debug", n, info, debug, msg)
	}
	if counted != info {
		t.Errorf("%d of %d info lines of %q say how many under %s:\n%s", counted, info, msg, countKey, logs.String())
	}
}

// watchNotes subscribes to the messages published under keys in q's backoff bucket.
func watchNotes(t *testing.T, q *queue.Queue, keys string) *nats.Subscription {
	t.Helper()
	nc := q.JS.Conn()
	sub, err := nc.SubscribeSync("$KV." + q.Names.BackoffBucket() + "." + keys)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// TestRetryNotesLeaveOutPausesOfTheFleet: a job put off for a pause of the fleet is not
// noted (submit reads the pause itself); one that failed is, with its delivery and wait.
func TestRetryNotesLeaveOutPausesOfTheFleet(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{})
	sub := watchNotes(t, b.results, "retry.>")
	w := &Worker{cfg: Config{Queue: b.results}, maxDeliver: 7}
	w.noteRetry("b-paused", "q-1", 2, time.Minute, fmt.Errorf("job: %w", errBackingOff))
	w.noteRetry("b-failed", "q-2", 3, 20*time.Second, errors.New("tokenizer hub unreachable"))
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var note queue.RetryNote
	if err := json.Unmarshal(msg.Data, &note); err != nil {
		t.Fatal(err)
	}
	want := queue.RetryNote{CustomID: "q-2", Delivery: 3, MaxDeliver: 7, RetryInMS: 20000, Error: "tokenizer hub unreachable"}
	if msg.Subject != "$KV."+b.results.Names.BackoffBucket()+".retry.b-failed" || note != want {
		t.Errorf("noted %s %+v, want b-failed's %+v", msg.Subject, note, want)
	}
	if more, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("noted more: %s %s", more.Subject, more.Data)
	}
}

// TestServiceNotesLeaveOut429sAndComeOnceASecond: a retry of a request the service failed is
// noted with the status the client's event carries; a 429 (a pause of the fleet) and
// requests that were not retried are not; other retries within the second are not. (The
// client fills the status in from the error, and warns in the log: internal/tinker's
// TestDialWarnsWhileItCannotReachTheService.)
func TestServiceNotesLeaveOut429sAndComeOnceASecond(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{})
	sub := watchNotes(t, b.results, ">")
	w := &Worker{cfg: Config{Queue: b.results}}
	unavailable := &tinker.StatusError{Method: "POST", Endpoint: "asample", StatusCode: 503, Body: "down"}
	w.noteServiceRetry(tinker.Event{Kind: tinker.EventRetry, Endpoint: "asample", StatusCode: 429, Delay: time.Second,
		Err: &tinker.StatusError{Method: "POST", Endpoint: "asample", StatusCode: 429}})
	w.noteServiceRetry(tinker.Event{Kind: tinker.EventRequest, Endpoint: "asample", StatusCode: 503, Err: unavailable})
	w.noteServiceRetry(tinker.Event{Kind: tinker.EventRetry, Endpoint: "asample", SamplerID: "s-1", StatusCode: 503, Delay: 2 * time.Second, Err: unavailable})
	w.noteServiceRetry(tinker.Event{Kind: tinker.EventRetry, Endpoint: "retrieve_future", SamplerID: "s-1", Delay: time.Second, Err: errors.New("connection reset")})
	w.noteServiceRetry(tinker.Event{Kind: tinker.EventRetry, Endpoint: "session_heartbeat", Delay: time.Second, Err: errors.New("connection reset")})

	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var note queue.ServiceNote
	if err := json.Unmarshal(msg.Data, &note); err != nil {
		t.Fatal(err)
	}
	want := queue.ServiceNote{Endpoint: "asample", Status: 503, RetryInMS: 2000, Error: unavailable.Error()}
	if !strings.HasSuffix(msg.Subject, ".service.retry") || note != want {
		t.Errorf("noted %s %+v, want %+v", msg.Subject, note, want)
	}
	if more, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("noted more: %s %s", more.Subject, more.Data)
	}
}

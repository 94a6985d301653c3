package queue

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestPresentCountsTheWorkersThatNotedThemselvesLately: a worker runs from its note until
// it removes it, or until its latest note is older than the window: then it went silent (a
// crashed worker), until its note is older than what the reader asks for. The notes of other
// kinds in the bucket are not workers; without the bucket nobody can tell.
func TestPresentCountsTheWorkersThatNotedThemselvesLately(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if a, known, err := b.q.Present(ctx, PresenceWindow, PresenceWindow); known || err != nil || len(a.Running)+len(a.Silent) != 0 {
		t.Fatalf("without the backoff bucket: %+v known %v, err %v; want unknown", a, known, err)
	}
	// The bucket is the fleet's backoff bucket, which the workers' internal/backoff creates.
	kv, err := b.q.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.q.Names.BackoffBucket()})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(ps []Presence) []string {
		var ids []string
		for _, p := range ps {
			ids = append(ids, p.Worker+"@"+p.Host)
		}
		slices.Sort(ids)
		return ids
	}
	// attendance returns the running and the silent workers.
	attendance := func(window, since time.Duration) (running, silent []string) {
		t.Helper()
		// The notes are published without waiting, and a flush does not wait for the stream
		// to store them. A put on the same connection, answered once stored, comes after them.
		if _, err := kv.Put(ctx, "test-sync", nil); err != nil {
			t.Fatal(err)
		}
		a, known, err := b.q.Present(ctx, window, since)
		if err != nil || !known {
			t.Fatalf("present: known %v, err %v", known, err)
		}
		for _, p := range a.Running {
			if p.At.IsZero() || a.Now.Sub(p.At) > window {
				t.Errorf("worker %s noted at %v runs, outside the window of %v before %v", p.Worker, p.At, window, a.Now)
			}
		}
		return ids(a.Running), ids(a.Silent)
	}
	present := func(window time.Duration) []string {
		t.Helper()
		running, _ := attendance(window, window)
		return running
	}
	if got := present(PresenceWindow); len(got) != 0 {
		t.Fatalf("an empty bucket: %v", got)
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		if err := b.q.NotePresence(id, Presence{Host: "host-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	// What else the bucket holds is not a worker.
	if err := b.q.NoteServiceRetry(ServiceNote{Endpoint: "asample", Status: 503}); err != nil {
		t.Fatal(err)
	}
	if got := present(PresenceWindow); !slices.Equal(got, []string{"w1@host-w1", "w2@host-w2", "w3@host-w3"}) {
		t.Fatalf("three workers noted: %v", got)
	}

	if err := b.q.ForgetPresence(ctx, "w2"); err != nil {
		t.Fatal(err)
	}
	if got := present(PresenceWindow); !slices.Equal(got, []string{"w1@host-w1", "w3@host-w3"}) {
		t.Fatalf("once w2 stopped: %v", got)
	}

	// w3 goes on noting itself; w1 stopped without a word (a crash): its note ages out.
	time.Sleep(600 * time.Millisecond)
	if err := b.q.NotePresence("w3", Presence{Host: "host-w3"}); err != nil {
		t.Fatal(err)
	}
	running, silent := attendance(500*time.Millisecond, PresenceWindow)
	if !slices.Equal(running, []string{"w3@host-w3"}) || !slices.Equal(silent, []string{"w1@host-w1"}) {
		t.Fatalf("with w1's note older than the window: running %v, silent %v", running, silent)
	}
	// Asked only for the window, the reader does not see w1 at all.
	if running, silent := attendance(500*time.Millisecond, 500*time.Millisecond); !slices.Equal(running, []string{"w3@host-w3"}) || len(silent) != 0 {
		t.Fatalf("asked for the window alone: running %v, silent %v", running, silent)
	}
}

// TestSilenceTellsOfAWorkerWhoseNotesStopped: of three workers noting themselves, one removes
// its note (it stopped and said so) and one stops without a word (a crash); only the second
// is silent, once, when the notes of the others have moved the server's time past its last
// by the window. A worker noted before the watch began is not followed.
func TestSilenceTellsOfAWorkerWhoseNotesStopped(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := b.q.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.q.Names.BackoffBucket()})
	if err != nil {
		t.Fatal(err)
	}
	note := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if err := b.q.NotePresence(id, Presence{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	note("before") // noted before the watch, never again
	// The note is published without waiting; a put on the same connection, answered once
	// stored, comes after it, so the watch (of updates only) begins after it is stored.
	if _, err := kv.Put(ctx, "test-sync", nil); err != nil {
		t.Fatal(err)
	}
	told := make(chan string, 16)
	s := &Silence{Window: 300 * time.Millisecond}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- s.Watch(watchCtx, b.q, func(id string) { told <- id }) }()
	defer func() {
		stopWatch()
		if err := <-watched; err != nil {
			t.Errorf("watch: %v", err)
		}
	}()
	// The watch has begun (updates only) once the bucket's stream has its consumer.
	for {
		info, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.(*jetstream.KeyValueBucketStatus).StreamInfo().State.Consumers > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	note("runs", "stops", "crashes")
	time.Sleep(50 * time.Millisecond)
	if err := b.q.ForgetPresence(ctx, "stops"); err != nil {
		t.Fatal(err)
	}
	// Only "runs" goes on: about a second of notes, three windows.
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		note("runs")
	}
	select {
	case id := <-told:
		if id != "crashes" {
			t.Fatalf("silent: %s, want crashes", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no worker was told silent")
	}
	select {
	case id := <-told:
		t.Fatalf("then %s was told silent too; want crashes alone, once", id)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestNobodyIsSilentAfterAnOutage: while the server is away no note comes from anyone; the
// first note after it is more than a window past every other worker's last, which made each
// of them silent (and each forgot its part of the capacity, the fleet bursting into 429s),
// though they all note again a moment later. A worker that then stays silent still is told.
func TestNobodyIsSilentAfterAnOutage(t *testing.T) {
	t.Parallel()
	s := &Silence{Window: 15 * time.Second, last: map[string]time.Time{}}
	var told []string
	silent := func(id string) { told = append(told, id) }
	t0 := time.Unix(1000, 0)
	s.saw("a", true, t0, silent)
	s.saw("b", true, t0.Add(time.Second), silent)
	s.saw("c", true, t0.Add(2*time.Second), silent)
	s.saw("a", true, t0.Add(40*time.Second), silent) // the server is back after 38 s
	s.saw("b", true, t0.Add(41*time.Second), silent)
	if len(told) != 0 {
		t.Fatalf("told silent after an outage: %v", told)
	}
	for at := 45 * time.Second; at <= 60*time.Second; at += 5 * time.Second { // c never notes again
		s.saw("a", true, t0.Add(at), silent)
		s.saw("b", true, t0.Add(at), silent)
	}
	if !slices.Equal(told, []string{"c"}) {
		t.Fatalf("told %v, want c, which noted nothing after the outage", told)
	}
}

package backoff

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
)

const testAccount = "acct0123"

func startServer(t testing.TB, dir string, port int) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("new server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	// Registered before any client: cleanups run last-in first-out, so the
	// fleets close (and delete their consumers) while the server is up.
	t.Cleanup(func() { stopServer(s) })
	return s
}

func stopServer(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

func connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func open(t testing.TB, js jetstream.JetStream, cfg Config) *Fleet {
	t.Helper()
	if cfg.Account == "" {
		cfg.Account = testAccount
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := Open(ctx, js, cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func near(a, b time.Time, tol time.Duration) bool {
	d := a.Sub(b)
	return d < tol && d > -tol
}

// three independent watchers on three connections
func threeFleets(t *testing.T, url string, cfgs ...Config) []*Fleet {
	t.Helper()
	var fs []*Fleet
	for i := range 3 {
		var cfg Config
		if i < len(cfgs) {
			cfg = cfgs[i]
		}
		_, js := connect(t, url)
		fs = append(fs, open(t, js, cfg))
	}
	return fs
}

func TestSignalSeenByOthers(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	fs := threeFleets(t, s.ClientURL())
	for _, f := range fs {
		if f.Active() || !f.Until().IsZero() {
			t.Fatalf("fresh fleet active: %+v", f.State())
		}
	}
	before := time.Now()
	if err := fs[0].Signal(ctxT(t), ReasonRateLimited, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if !fs[0].Active() {
		t.Fatal("signaller not active right after Signal")
	}
	for i, f := range fs {
		eventually(t, "watcher sees the signal", func() bool { return f.State().Revision > 0 && f.Active() })
		st := f.State()
		if st.Reason != ReasonRateLimited {
			t.Fatalf("fleet %d reason %q", i, st.Reason)
		}
		if want := before.Add(30 * time.Second); !near(st.Until, want, time.Second) {
			t.Fatalf("fleet %d until %v, want ≈ %v", i, st.Until, want)
		}
		if !f.Recent(10 * time.Second) {
			t.Fatalf("fleet %d not recent", i)
		}
	}
	// All three agree on the deadline (same server-time record).
	if !near(fs[1].Until(), fs[2].Until(), 50*time.Millisecond) {
		t.Fatalf("watchers disagree: %v vs %v", fs[1].Until(), fs[2].Until())
	}
	// The watch delivered it live: nobody had to re-watch.
	for i, f := range fs {
		if n := f.watches.Load(); n != 1 {
			t.Fatalf("fleet %d created %d watchers, want 1", i, n)
		}
	}
	// A second Signal covered by the current deadline writes nothing.
	rev := fs[0].State().Revision
	if err := fs[1].Signal(ctxT(t), ReasonPausedCapacity, time.Second); err != nil {
		t.Fatal(err)
	}
	if got := fs[1].State(); got.Reason != ReasonRateLimited || got.Revision != rev {
		t.Fatalf("covered signal changed state: %+v (rev was %d)", got, rev)
	}
}

func TestShorterNeverShortens(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	fs := threeFleets(t, s.ClientURL())
	ctx := ctxT(t)
	if err := fs[0].Signal(ctx, "long", time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, "f1 sees long", func() bool { return fs[1].State().Reason == "long" })
	long := fs[1].Until()
	// Force a write despite the in-memory shortcut: a fresh watcher with no
	// state yet would still read the key and refuse to shorten.
	if err := fs[1].Signal(ctx, "short", time.Second); err != nil {
		t.Fatal(err)
	}
	if got := fs[1].Until(); got.Before(long) {
		t.Fatalf("shortened: %v < %v", got, long)
	}
	// Write a shorter record through the CAS path directly: Floor carries the
	// longer deadline, so the stored deadline does not move back.
	kv := fs[2].kv
	e, err := kv.Get(ctx, testAccount)
	if err != nil {
		t.Fatal(err)
	}
	r, _ := decode(e)
	cur, _, _ := r.deadline(e.Created())
	val, _ := json.Marshal(record{Floor: cur, D: int64(time.Second), Reason: "short", FloorReason: "long"})
	if _, err := kv.Update(ctx, testAccount, val, e.Revision()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "f0 sees the new revision", func() bool { return fs[0].State().Revision > e.Revision() })
	// In the server's clock: each fleet's local Until subtracts its own bound of the clock
	// offset, and two fleets' bounds differ by up to a probe's latency (6 ms once, under -race
	// on a loaded machine), so comparing f0's Until with f1's could fail on timing alone.
	if st, dl := fs[0].State(), fs[0].deadline.Load(); dl < cur || st.Reason != "long" {
		t.Fatalf("after short record: %+v, deadline %d < the long one's %d (server ns)", st, dl, cur)
	}
	// f0 never moves its deadline back whatever it reads; the stored record is what a fleet
	// that starts now would read.
	e2, err := kv.Get(ctx, testAccount)
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := decode(e2)
	if dl, why, _ := r2.deadline(e2.Created()); dl < cur || why != "long" {
		t.Fatalf("stored record's deadline %d (%s) < the long one's %d", dl, why, cur)
	}
}

func TestConcurrentSignalsOnlyExtend(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	type obs struct{ until []time.Time }
	var mu sync.Mutex
	seen := make([]obs, 3)
	var cfgs []Config
	for i := range 3 {
		cfgs = append(cfgs, Config{OnChange: func(st State) {
			mu.Lock()
			seen[i].until = append(seen[i].until, st.Until)
			mu.Unlock()
		}})
	}
	fs := threeFleets(t, s.ClientURL(), cfgs...)
	ctx := ctxT(t)
	type call struct {
		start time.Time
		d     time.Duration
	}
	var calls []call
	var callsMu sync.Mutex
	var wg sync.WaitGroup
	for i, f := range fs {
		for g := range 4 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(g)))
				for j := range 15 {
					// Mostly growing durations, so many signals really
					// extend and contend; some shorter ones must not win.
					d := time.Duration(j*100+rng.IntN(50)) * time.Millisecond
					start := time.Now()
					if err := f.Signal(ctx, "r", d); err != nil {
						t.Error(err)
						return
					}
					callsMu.Lock()
					calls = append(calls, call{start, d})
					callsMu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	// Every watcher converges on the stored deadline.
	e, err := fs[0].kv.Get(ctx, testAccount)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range fs {
		eventually(t, "watcher converges", func() bool { return f.State().Revision >= e.Revision() })
		until := f.Until()
		// No signal was lost: the deadline covers start+d of every call, up to
		// the coalescing slack (one clock on this machine; allow the probe's few ms).
		for _, c := range calls {
			slack := min(c.d/10, 250*time.Millisecond)
			if until.Before(c.start.Add(c.d - slack).Add(-20 * time.Millisecond)) {
				t.Fatalf("fleet %d: until %v does not cover a signal of %v started %v", i, until, c.d, c.start)
			}
		}
		mu.Lock()
		u := seen[i].until
		for j := 1; j < len(u); j++ {
			if u[j].Before(u[j-1].Add(-5 * time.Millisecond)) { // offset re-probes may jitter by µs
				t.Fatalf("fleet %d: deadline went back from %v to %v", i, u[j-1], u[j])
			}
		}
		mu.Unlock()
	}
	t.Logf("%d signals, final revision %d", len(calls), e.Revision())
}

func TestStateSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, dir, -1)
	url := s.ClientURL()
	tcpPort := s.Addr().(*net.TCPAddr).Port
	_, js := connect(t, url)
	watcher := open(t, js, Config{})
	_, js2 := connect(t, url)
	signaller := open(t, js2, Config{})
	if err := signaller.Signal(ctxT(t), "before", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	eventually(t, "watcher sees signal", func() bool { return watcher.State().Reason == "before" })
	want := watcher.Until()
	stopServer(s)

	s2 := startServer(t, dir, tcpPort)
	// A newcomer reads the persisted state.
	_, js3 := connect(t, s2.ClientURL())
	newcomer := open(t, js3, Config{})
	if got := newcomer.Until(); !near(got, want, 50*time.Millisecond) {
		t.Fatalf("after restart until %v, want %v", got, want)
	}
	// The old watcher reconnected and sees a later signal.
	if err := newcomer.Signal(ctxT(t), "after", 40*time.Minute); err != nil { // within MaxPause
		t.Fatal(err)
	}
	eventually(t, "old watcher sees signal after restart", func() bool { return watcher.State().Reason == "after" })
	if !watcher.Until().After(want.Add(29 * time.Minute)) {
		t.Fatalf("old watcher until %v", watcher.Until())
	}
	// Close while s2 is up (its cleanup runs before the fleets' cleanups).
	for _, f := range []*Fleet{watcher, signaller, newcomer} {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWatchRecoversAfterDisconnect(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	nc, js := connect(t, s.ClientURL())
	watcher := open(t, js, Config{})
	_, js2 := connect(t, s.ClientURL())
	signaller := open(t, js2, Config{})
	for round := range 3 {
		reconnects := nc.Stats().Reconnects
		if err := nc.ForceReconnect(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "reconnected", func() bool { return nc.Stats().Reconnects > reconnects && nc.IsConnected() })
		reason := "after-reconnect-" + string(rune('a'+round))
		if err := signaller.Signal(ctxT(t), reason, time.Duration(round+1)*10*time.Minute); err != nil {
			t.Fatal(err)
		}
		eventually(t, "watcher sees signal after reconnect", func() bool { return watcher.State().Reason == reason })
	}
	if n := watcher.watches.Load(); n < 2 {
		t.Fatalf("watcher never re-watched (%d watchers)", n)
	}
	// No consumer leaked: only the two live watchers' consumers remain.
	eventually(t, "old watch consumers removed", func() bool {
		st, err := js2.Stream(ctxT(t), "KV_"+DefaultBucket)
		if err != nil {
			return false
		}
		n := 0
		for range st.ListConsumers(ctxT(t)).Info() {
			n++
		}
		return n <= 2
	})
}

// One watcher's clock is an hour (and a bit) off. It still observes pauses of
// the right length in its own clock's terms, and its signals give everyone
// else pauses of the right length.
func TestSkewedClock(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	const skew = -(time.Hour + 1234*time.Millisecond)
	skewed := func() time.Time { return time.Now().Add(skew) }
	_, js := connect(t, s.ClientURL())
	good := open(t, js, Config{})
	_, js2 := connect(t, s.ClientURL())
	bad := open(t, js2, Config{Now: skewed})

	const d = 10 * time.Minute
	if err := good.Signal(ctxT(t), "from-good", d); err != nil {
		t.Fatal(err)
	}
	eventually(t, "skewed watcher sees signal", func() bool { return bad.State().Reason == "from-good" })
	if pause := bad.Until().Sub(skewed()); pause > d+50*time.Millisecond || pause < d-time.Second {
		t.Fatalf("skewed watcher observes a pause of %v, want ≈ %v", pause, d)
	}
	if pause := time.Until(good.Until()); pause > d+50*time.Millisecond || pause < d-time.Second {
		t.Fatalf("good watcher observes %v", pause)
	}
	// Its view in real time is the same deadline.
	if !near(bad.Until().Add(-skew), good.Until(), 50*time.Millisecond) {
		t.Fatalf("views differ: %v vs %v", bad.Until().Add(-skew), good.Until())
	}

	// The skewed machine signals a longer pause; the good one sees its length.
	const d2 = 20 * time.Minute
	if err := bad.Signal(ctxT(t), "from-bad", d2); err != nil {
		t.Fatal(err)
	}
	eventually(t, "good watcher sees skewed signal", func() bool { return good.State().Reason == "from-bad" })
	if pause := time.Until(good.Until()); pause > d2+50*time.Millisecond || pause < d2-time.Second {
		t.Fatalf("good watcher observes %v after skewed signal, want ≈ %v", pause, d2)
	}

	// Wait on the skewed watcher lasts the real duration of a short pause.
	s3 := startServer(t, t.TempDir(), -1)
	_, js3 := connect(t, s3.ClientURL())
	bad3 := open(t, js3, Config{Now: skewed})
	_, js4 := connect(t, s3.ClientURL())
	good3 := open(t, js4, Config{})
	const short = 150 * time.Millisecond
	start := time.Now()
	if err := good3.Signal(ctxT(t), "short", short); err != nil {
		t.Fatal(err)
	}
	eventually(t, "skewed sees short", func() bool { return bad3.State().Reason == "short" })
	if err := bad3.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < short-10*time.Millisecond {
		t.Fatalf("skewed watcher waited only %v of a %v pause", el, short)
	}
}

func TestFleetWaitWakesOnExtension(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	fs := threeFleets(t, s.ClientURL())
	ctx := ctxT(t)
	if err := fs[1].Wait(ctx); err != nil {
		t.Fatalf("Wait with no backoff: %v", err)
	}
	start := time.Now()
	// 500 ms: f1 must see a and start waiting before a ends, however loaded the machine.
	if err := fs[0].Signal(ctx, "a", 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, "f1 sees a", func() bool { return fs[1].Active() })
	done := make(chan time.Duration, 1)
	go func() {
		if err := fs[1].Wait(ctx); err != nil {
			t.Error(err)
		}
		done <- time.Since(start)
	}()
	// Extend while f1 waits: it must re-block until the new deadline.
	if err := fs[2].Signal(ctx, "b", 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	el := <-done
	if el < 1490*time.Millisecond {
		t.Fatalf("Wait returned after %v, before the extended deadline; f1 %+v f2 %+v start %v", el, fs[1].State(), fs[2].State(), start)
	}
	// Cancellation.
	if err := fs[0].Signal(ctx, "c", time.Hour); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if err := fs[0].Wait(cctx); err == nil {
		t.Fatal("Wait returned nil during an hour-long backoff")
	}
}

func TestOpenValidates(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	_, js := connect(t, s.ClientURL())
	if _, err := Open(ctxT(t), js, Config{Account: "bad key*"}); err == nil {
		t.Fatal("invalid key accepted")
	}
	if _, err := Open(ctxT(t), js, Config{}); err == nil {
		t.Fatal("empty account accepted")
	}
	f := open(t, js, Config{Bucket: "other_bucket"})
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
}

func TestBurstOfSignalsIsOneWrite(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	fs := threeFleets(t, s.ClientURL())
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			if err := fs[i%3].Signal(ctxT(t), ReasonRateLimited, time.Second); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, f := range fs {
		eventually(t, "watchers see the burst", func() bool { return f.State().Revision > 0 })
	}
	// One write per fleet member at the most (each may race the others' first write).
	if rev := fs[0].State().Revision; rev > 3 {
		t.Fatalf("60 simultaneous 1 s signals made %d writes", rev)
	}
}

func TestSignalBacksOffLocallyWhenNATSIsDown(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	_, js := connect(t, s.ClientURL())
	f := open(t, js, Config{})
	s.Shutdown()
	s.WaitForShutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	before := time.Now()
	if err := f.Signal(ctx, ReasonRateLimited, 3*time.Second); err == nil {
		t.Fatal("Signal reported success with the server down")
	}
	if !f.Active() || f.Until().Before(before.Add(3*time.Second-50*time.Millisecond)) {
		t.Fatalf("with NATS down the signalling worker does not back off: until %v", f.Until())
	}
}

// TestASignalThatFailedIsNotTakenAsWritten: a Signal that could not be written (NATS
// unreachable for a moment, its context ended) still backs the worker off on its own copy
// of the deadline. The next 429s of the same worker found that copy covering them and
// returned without writing, so the rest of the fleet never learned of the pause.
func TestASignalThatFailedIsNotTakenAsWritten(t *testing.T) {
	_, a, b, _ := twoFleets(t, time.Hour)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Signal(ended, ReasonRateLimited, time.Hour); err == nil {
		t.Fatal("a Signal with its context ended reported success")
	}
	if !a.Active() {
		t.Fatal("the worker whose Signal failed does not back off")
	}
	if err := a.Signal(ctxT(t), ReasonRateLimited, time.Hour); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the other worker to see the pause", b.Active)
}

func TestWaitersWakeSpreadOverTheJitterAndRecheck(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	_, js := connect(t, s.ClientURL())
	f := open(t, js, Config{WakeJitter: 400 * time.Millisecond})
	if err := f.Wait(ctxT(t)); err != nil { // not paused: returns at once, no jitter
		t.Fatal(err)
	}
	if err := f.Signal(ctxT(t), ReasonRateLimited, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	until := f.Until()
	const n = 40
	woke := make(chan time.Time, n)
	for range n {
		go func() {
			if err := f.Wait(ctxT(t)); err != nil {
				t.Error(err)
			}
			woke <- time.Now()
		}()
	}
	var first, last time.Time
	for range n {
		w := <-woke
		if w.Before(until) {
			t.Fatalf("a waiter woke %v before the deadline", until.Sub(w))
		}
		if first.IsZero() || w.Before(first) {
			first = w
		}
		if w.After(last) {
			last = w
		}
	}
	if spread := last.Sub(first); spread < 100*time.Millisecond {
		t.Fatalf("40 waiters woke within %v of each other; want them spread over the 400ms jitter", spread)
	}

	// A signal during a waiter's jitter holds it back: it re-checks the deadline before it
	// returns. (A fixed jitter makes the timing certain.)
	f.jitter = func() time.Duration { return 300 * time.Millisecond }
	if err := f.Signal(ctxT(t), ReasonRateLimited, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	returned := make(chan time.Time, 1)
	go func() {
		if err := f.Wait(ctxT(t)); err != nil {
			t.Error(err)
		}
		returned <- time.Now()
	}()
	time.Sleep(time.Until(f.Until()) + 50*time.Millisecond) // past the deadline, inside the jitter
	if err := f.Signal(ctxT(t), ReasonRateLimited, time.Second); err != nil {
		t.Fatal(err)
	}
	extended := f.Until()
	if at := <-returned; at.Before(extended) {
		t.Fatalf("a waiter in its jitter returned %v before the extended deadline", extended.Sub(at))
	}
}

// TestABucketMadeAgainIsFollowed: a bucket deleted and created again (an operator's
// `nats kv rm`, a store lost) numbers its revisions from 1 again, while a running watch waits
// for one past the last it saw and hears nothing. The stream's creation time, read at every
// resync, says it is another bucket: the worker watches it from its start, and learns a pause
// signalled there, even one whose revision equals the last it saw in the old bucket.
func TestABucketMadeAgainIsFollowed(t *testing.T) {
	t.Parallel()
	url, w, sig, js := twoFleets(t, 200*time.Millisecond)
	if err := sig.Signal(ctxT(t), "old", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker to see revision 1", func() bool { return w.State().Revision == 1 })
	watches := w.watches.Load()
	if err := js.DeleteKeyValue(ctxT(t), DefaultBucket); err != nil {
		t.Fatal(err)
	}
	_, js3 := connect(t, url)
	fresh := open(t, js3, Config{}) // makes the bucket again, as a worker starting now does
	eventually(t, "the worker to watch the new bucket", func() bool { return w.watches.Load() > watches })
	if err := fresh.Signal(ctxT(t), ReasonRateLimited, time.Hour); err != nil { // revision 1 again
		t.Fatal(err)
	}
	eventually(t, "the worker to see the pause in the new bucket", w.Active)
}

// TestADeletedBucketIsMadeAgain: with the bucket gone every Signal failed, and no worker
// learned another's 429 until one restarted. A running worker now makes it again.
func TestADeletedBucketIsMadeAgain(t *testing.T) {
	t.Parallel()
	_, a, b, js := twoFleets(t, 100*time.Millisecond)
	if err := js.DeleteKeyValue(ctxT(t), DefaultBucket); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bucket to be made again", func() bool {
		_, err := js.KeyValue(ctxT(t), DefaultBucket)
		return err == nil
	})
	eventually(t, "a signal to go through", func() bool { return b.Signal(ctxT(t), ReasonRateLimited, time.Hour) == nil })
	eventually(t, "the other worker to see the pause", a.Active)
}

// TestOpenRidesOutAServerThatCannotMakeTheBucketYet: a worker starting just after the
// bucket was deleted met the server's "error creating store for stream" (a 500: nats-server
// removes an account's emptied store directories in the background, and the new stream's
// directory was made under them meanwhile) and did not start. The server here fails the
// bucket's creation with the same error (a file where the stream's directory goes) until
// it has been asked twice; Open asks again and starts.
func TestOpenRidesOutAServerThatCannotMakeTheBucketYet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServer(t, dir, -1)
	nc, js := connect(t, s.ClientURL())
	streams := filepath.Join(dir, "jetstream", server.DEFAULT_GLOBAL_ACCOUNT, "streams")
	blocker := filepath.Join(streams, "KV_"+DefaultBucket)
	if err := os.MkdirAll(streams, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	creates := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe("$JS.API.STREAM.CREATE.KV_"+DefaultBucket, creates)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	go func() { // ends at the second request, or with the test
		for range 2 {
			select {
			case <-creates:
			case <-ctx.Done():
				return
			}
		}
		_ = os.Remove(blocker)
	}()
	a := open(t, js, Config{})
	_, js2 := connect(t, s.ClientURL())
	b := open(t, js2, Config{})
	if err := a.Signal(ctxT(t), ReasonRateLimited, time.Hour); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the other worker to see the pause", b.Active)
}

// twoFleets starts a server and two Fleets on it, each on a connection of its own and
// resyncing every resync; js is the second's.
func twoFleets(t *testing.T, resync time.Duration) (url string, a, b *Fleet, js jetstream.JetStream) {
	t.Helper()
	s := startServer(t, t.TempDir(), -1)
	_, jsA := connect(t, s.ClientURL())
	a = open(t, jsA, Config{Resync: resync})
	_, js = connect(t, s.ClientURL())
	b = open(t, js, Config{Resync: resync})
	return s.ClientURL(), a, b, js
}

// TestAServerThatLostItsStoreGetsTheBucketAgain: a NATS server restarted without its store
// (no persistent volume) comes back with no backoff bucket. The workers reconnect, and their
// watches, made again at once, fail with the older nats package's "stream not found", which
// was not taken for a bucket gone: they retried for ever, never reaching the resync that
// makes the bucket again, every Signal failed, and no worker learned another's 429 until one
// restarted.
func TestAServerThatLostItsStoreGetsTheBucketAgain(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	port := s.Addr().(*net.TCPAddr).Port
	_, js := connect(t, s.ClientURL())
	fleets := threeFleets(t, s.ClientURL())
	if err := fleets[0].Signal(ctxT(t), ReasonRateLimited, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for i, f := range fleets {
		eventually(t, fmt.Sprintf("fleet %d to see the first pause", i), func() bool { return f.State().Revision == 1 })
	}
	stopServer(s)
	startServer(t, t.TempDir(), port) // the same address, an empty store
	closeBeforeTheServerStops(t, fleets...)
	eventually(t, "the bucket to be made again", func() bool {
		_, err := js.KeyValue(ctxT(t), DefaultBucket)
		return err == nil
	})
	if err := fleets[0].Signal(ctxT(t), ReasonRateLimited, time.Hour); err != nil {
		t.Fatal(err)
	}
	for i, f := range fleets[1:] {
		eventually(t, fmt.Sprintf("fleet %d to see the pause", i+1), f.Active)
	}
}

// TestABurstOfSignalsWhileNATSIsDownWritesOneAtATime: after a Signal whose write failed (NATS
// unreachable), the next Signals of the same worker try the write again, so that the fleet
// learns of the pause once NATS is back; but one at a time: each write waits out its timeout
// while NATS is down, and a burst of 429s made as many waits (and warnings), one per sample.
func TestABurstOfSignalsWhileNATSIsDownWritesOneAtATime(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	_, js := connect(t, s.ClientURL())
	f := open(t, js, Config{})
	stopServer(s)
	failed, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := f.Signal(failed, ReasonRateLimited, time.Hour); err == nil {
		t.Fatal("a Signal with NATS down reported success")
	}
	const burst = 20
	quick := make(chan bool, burst)
	var wg sync.WaitGroup
	for range burst {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			start := time.Now()
			f.Signal(ctx, ReasonRateLimited, time.Minute)
			quick <- time.Since(start) < time.Second
		})
	}
	wg.Wait()
	close(quick)
	waited := 0
	for q := range quick {
		if !q {
			waited++
		}
	}
	if waited != 1 {
		t.Fatalf("%d of a burst of %d Signals waited on NATS, want 1", waited, burst)
	}
}

// TestAWorkerWhoseWatchCameBackAfterAnotherMadeTheBucketAgainSeesItsPauses: a server back
// without its store has no bucket; one worker makes it again, and another, whose watch failed
// with "stream not found" meanwhile, watches it on its next try. The new bucket's revisions
// start again from 1: a watch resuming after the last revision seen in the old one missed
// every pause up to it, until the next resync (10 s by default). Here the worker may not make
// the bucket itself, which fixes the order of the race it lost one time in two in
// TestAServerThatLostItsStoreGetsTheBucketAgain.
func TestAWorkerWhoseWatchCameBackAfterAnotherMadeTheBucketAgainSeesItsPauses(t *testing.T) {
	users := []*server.User{
		{Username: "admin", Password: "admin"},
		{Username: "worker", Password: "worker", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.STREAM.CREATE.>"}}}},
	}
	start := func(port int) *server.Server {
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true,
			StoreDir: t.TempDir(), NoLog: true, NoSigs: true, Users: users})
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		t.Cleanup(func() { stopServer(s) })
		return s
	}
	s := start(-1)
	port := s.Addr().(*net.TCPAddr).Port
	url := func(user string) string { return fmt.Sprintf("nats://%s:%s@127.0.0.1:%d", user, user, port) }
	_, admin := connect(t, url("admin"))
	nc, _ := connect(t, url("worker"))
	// Its refused requests to make the bucket go unanswered: a short wait for each.
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	other := open(t, admin, Config{}) // makes the bucket
	var logs fleettest.Buffer
	f := open(t, js, Config{Resync: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := other.Signal(ctxT(t), ReasonRateLimited, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first pause seen", func() bool { return f.State().Revision == 1 })
	other.Close()

	stopServer(s)
	start(port) // the same address, an empty store
	closeBeforeTheServerStops(t, f)
	eventually(t, "the worker to fail to make the bucket again", func() bool {
		return strings.Contains(logs.String(), "could not be made again")
	})
	other = open(t, admin, Config{}) // another worker makes it again
	if err := other.Signal(ctxT(t), ReasonRateLimited, time.Hour); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker to see the pause in the bucket made again", f.Active)
}

// closeBeforeTheServerStops closes the fleets before a server started after them stops
// (cleanups run last-in first-out): closing, a fleet deletes its watch consumers, each of
// which waits out the JetStream API timeout (5 s) if the server is gone but its connection
// has not noticed yet (with the connection down, Close skips the delete).
func closeBeforeTheServerStops(t *testing.T, fleets ...*Fleet) {
	t.Cleanup(func() {
		for _, f := range fleets {
			_ = f.Close()
		}
	})
}

// TestAPauseLongerThanMaxPauseIsCapped: the record in the bucket is honoured as written, and
// any client with write access to the bucket (or a bug) could write a duration or a floor of
// years: every worker of the account then waited for it, for ever, and a restart read it
// again. A worker now honours at most MaxPause past the entry's creation, says so once per
// entry, and its next Signal writes the capped deadline as the floor, which mends the record.
func TestAPauseLongerThanMaxPauseIsCapped(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), -1)
	var logs fleettest.Buffer
	_, js := connect(t, s.ClientURL())
	f := open(t, js, Config{Resync: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	kv, err := js.KeyValue(ctxT(t), DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range []record{
		{D: int64(100 * 365 * 24 * time.Hour), Reason: "huge"},
		{Floor: time.Now().Add(50 * 365 * 24 * time.Hour).UnixNano(), D: int64(time.Second), Reason: "short", FloorReason: "huge"},
	} {
		val, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		rev, err := kv.Put(ctxT(t), testAccount, val)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "the worker to take the entry", func() bool {
			return f.State().Revision == rev && f.Until().After(before.Add(MaxPause-time.Second))
		})
		if got := f.Until(); got.After(before.Add(MaxPause + time.Second)) {
			t.Fatalf("entry %d: the worker waits until %v, %v from now; want at most MaxPause (%v)", i, got, time.Until(got).Round(time.Second), MaxPause)
		}
	}
	// A few resyncs, which read the entry again; and past the coalescing slack of the
	// Signal below, which the deadline would cover else.
	time.Sleep(500 * time.Millisecond)
	if n := strings.Count(logs.String(), "capped"); n != 2 {
		t.Errorf("%d warnings of a capped pause for 2 entries, want one each; log:\n%s", n, logs.String())
	}
	// A Signal past the cap writes the capped deadline as its floor: the bucket holds no
	// pause of years any more, for a reader that does not cap (an older worker).
	if err := f.Signal(ctxT(t), ReasonRateLimited, 2*MaxPause); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctxT(t), testAccount)
	if err != nil {
		t.Fatal(err)
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		t.Fatal(err)
	}
	if r.Reason != ReasonRateLimited {
		t.Fatalf("the signal wrote nothing: the bucket holds %+v", r)
	}
	if limit := e.Created().Add(MaxPause); r.Floor > limit.UnixNano() || r.D > int64(MaxPause) {
		t.Errorf("the signal wrote %+v, created %v: past MaxPause", r, e.Created())
	}
}

// TestCloseWithNATSGoneDoesNotWaitForIt: fleets closed while their NATS server is gone (a
// whole stack shut down, a node lost) return at once. A Close could wait for the stop of
// its watcher, whose delete of the watch's consumer waits out nats.go's 5 s API timeout
// while the connection is down (when that stop came before the one nats.go makes as the
// watch's context ends; a worker took 5 s more to stop, about once in five).
func TestCloseWithNATSGoneDoesNotWaitForIt(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	nc, js := connect(t, s.ClientURL())
	fleets := make([]*Fleet, 20)
	for i := range fleets {
		fleets[i] = open(t, js, Config{})
	}
	stopServer(s)
	eventually(t, "the connection to go down", func() bool { return !nc.IsConnected() })
	began := time.Now()
	var closing sync.WaitGroup
	for _, f := range fleets {
		closing.Go(func() { _ = f.Close() })
	}
	closing.Wait()
	if took := time.Since(began); took > time.Second {
		t.Errorf("closing %d fleets took %v with NATS gone, want at most a second", len(fleets), took.Round(time.Millisecond))
	}
}

// TestCloseDoesNotWaitForAStopStartedWithNATSGone: a watch replaced while the connection is
// down (a re-read that failed as the server went, a watch that closed) is stopped in the
// background, and that Stop's consumer delete waits out nats.go's 5 s API timeout. Close
// waited for it: a worker stopped then took 5 s more (CI saw it in
// TestCloseWithNATSGoneDoesNotWaitForIt, a fleet whose first re-read met the server's end).
func TestCloseDoesNotWaitForAStopStartedWithNATSGone(t *testing.T) {
	s := startServer(t, t.TempDir(), -1)
	nc, js := connect(t, s.ClientURL())
	f := open(t, js, Config{})
	w, err := f.watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	stopServer(s)
	eventually(t, "the connection to go down", func() bool { return !nc.IsConnected() })
	f.stop(t.Context(), w) // as the run loop stops a watch it replaces, its context alive
	began := time.Now()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took > time.Second {
		t.Errorf("Close took %v with a watch's stop waiting for NATS, want at most a second", took.Round(time.Millisecond))
	}
}

package share

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		total int
		wants map[string]int
		want  map[string]int
	}{
		{"equal wants", 64, map[string]int{"a": 400, "b": 400, "c": 400, "d": 400}, map[string]int{"a": 16, "b": 16, "c": 16, "d": 16}},
		{"remainder in id order", 10, map[string]int{"c": 9, "a": 9, "b": 9}, map[string]int{"a": 4, "b": 3, "c": 3}},
		{"a small want frees places for the others", 60, map[string]int{"a": 5, "b": 400, "c": 400}, map[string]int{"a": 5, "b": 28, "c": 27}},
		{"places nobody wants are spread", 20, map[string]int{"a": 2, "b": 3}, map[string]int{"a": 10, "b": 10}},
		{"fewer places than workers", 2, map[string]int{"a": 5, "b": 5, "c": 5}, map[string]int{"a": 1, "b": 1}},
		{"a worker that wants nothing", 8, map[string]int{"a": 0, "b": 100}, map[string]int{"b": 8}},
		{"nothing measured", 0, map[string]int{"a": 5}, map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Split(tc.total, tc.wants)
			for id, n := range got { // a zero part is the same as none
				if n == 0 {
					delete(got, id)
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("Split(%d, %v) = %v, want %v", tc.total, tc.wants, got, tc.want)
			}
		})
	}
}

func TestCapacityOfKeepsTheLimitsOfARoundThatMeasuresLess(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		reports []Report
		want    Share
	}{
		{"first round: the peaks", []Report{{Peak: 27}, {Peak: 37}, {}}, Share{Capacity: 64, Measured: 64}},
		{"a round measuring less keeps the limits, with the oldest age",
			[]Report{{Peak: 20, Limit: 32, LimitAge: 10 * time.Second}, {Peak: 25, Limit: 32, LimitAge: 12 * time.Second}},
			Share{Capacity: 64, Measured: 64, Age: 12 * time.Second}},
		{"a worker joins: the limits, not renewed",
			[]Report{{Peak: 30, Limit: 32, LimitAge: 10 * time.Second}, {Peak: 26, Limit: 32, LimitAge: 10 * time.Second}, {Peak: 8}},
			Share{Capacity: 64, Measured: 64, Age: 10 * time.Second}},
		{"a round measuring more takes the peaks", []Report{{Peak: 40}, {Peak: 30, Limit: 32, LimitAge: time.Second}}, Share{Capacity: 70, Measured: 70}},
		{"a worker that sat the round out keeps its part", []Report{{Peak: 20, Limit: 32, LimitAge: 5 * time.Second}}, Share{Capacity: 32, Measured: 32, Age: 5 * time.Second}},
		{"parts of one division keep their limits",
			[]Report{{Peak: 20, Limit: 21, LimitAge: 3 * time.Second, Capacity: 64}, {Peak: 5, Limit: 21, LimitAge: 3 * time.Second, Capacity: 64}, {Peak: 9, Limit: 22, LimitAge: 3 * time.Second, Capacity: 64}},
			Share{Capacity: 64, Measured: 64, Age: 3 * time.Second}},
		{"limits of different divisions over the capacity: the peaks that fill it",
			[]Report{{Peak: 32, Limit: 32, LimitAge: time.Second, Capacity: 64}, {Peak: 30, Limit: 32, LimitAge: time.Second, Capacity: 64}, {Peak: 2, Limit: 32, LimitAge: 2 * time.Second, Capacity: 32}},
			Share{Capacity: 64, Measured: 64, Before: 64}},
		{"a worker joins a round that measures afresh: the peaks, and the capacity the limits were parts of",
			[]Report{{Peak: 14, Limit: 15, LimitAge: 45 * time.Second, Capacity: 64}, {Peak: 15, Limit: 16, LimitAge: 45 * time.Second, Capacity: 64}, {Peak: 15, Limit: 16, LimitAge: 45 * time.Second, Capacity: 64}, {Peak: 15, Limit: 16, LimitAge: 45 * time.Second, Capacity: 64}, {Peak: 5}},
			Share{Capacity: 64, Measured: 64, Before: 64}},
		{"limits of different divisions over the capacity, peaks under it: the largest capacity, with its age",
			[]Report{{Peak: 10, Limit: 32, LimitAge: time.Second, Capacity: 64}, {Peak: 10, Limit: 32, LimitAge: 4 * time.Second, Capacity: 64}, {Peak: 2, Limit: 20, LimitAge: 9 * time.Second, Capacity: 20}},
			Share{Capacity: 64, Measured: 64, Age: 4 * time.Second}},
		{"one division full just under its limits: the peaks, as parts of the capacity measured, with its age",
			[]Report{{Peak: 21, Limit: 22, LimitAge: 3 * time.Second, Capacity: 66}, {Peak: 22, Limit: 22, LimitAge: 3 * time.Second, Capacity: 66}, {Peak: 21, Limit: 22, LimitAge: 3 * time.Second, Capacity: 66}},
			Share{Capacity: 64, Measured: 66, Age: 3 * time.Second}},
		{"one division full under its limits by more than the slack: the limits",
			[]Report{{Peak: 20, Limit: 22, LimitAge: 3 * time.Second, Capacity: 66}, {Peak: 21, Limit: 22, LimitAge: 3 * time.Second, Capacity: 66}, {Peak: 20, Limit: 22, LimitAge: 3 * time.Second, Capacity: 66}},
			Share{Capacity: 66, Measured: 66, Age: 3 * time.Second}},
		{"a division lowered before: the slack is from the capacity measured, not from its limits",
			[]Report{{Peak: 20, Limit: 21, LimitAge: 5 * time.Second, Capacity: 66}, {Peak: 21, Limit: 22, LimitAge: 5 * time.Second, Capacity: 66}, {Peak: 20, Limit: 21, LimitAge: 5 * time.Second, Capacity: 66}},
			Share{Capacity: 64, Measured: 66, Age: 5 * time.Second}},
		{"a division lowered before, full within the slack of the capacity measured: lower again",
			[]Report{{Peak: 21, Limit: 21, LimitAge: 5 * time.Second, Capacity: 66}, {Peak: 21, Limit: 22, LimitAge: 5 * time.Second, Capacity: 66}, {Peak: 20, Limit: 21, LimitAge: 5 * time.Second, Capacity: 66}},
			Share{Capacity: 62, Measured: 66, Age: 5 * time.Second}},
		{"a small capacity has a slack of one place",
			[]Report{{Peak: 7, Limit: 8, LimitAge: time.Second, Capacity: 16}, {Peak: 8, Limit: 8, LimitAge: time.Second, Capacity: 16}},
			Share{Capacity: 15, Measured: 16, Age: time.Second}},
		{"no ratchet: a small division lowered once keeps its limits a place under them",
			[]Report{{Peak: 7, Limit: 7, LimitAge: time.Second, Capacity: 16}, {Peak: 7, Limit: 8, LimitAge: time.Second, Capacity: 16}},
			Share{Capacity: 15, Measured: 16, Age: time.Second}},
		{"limits of workers that do not name their capacity: the limits",
			[]Report{{Peak: 10, Limit: 32, LimitAge: time.Second, Capacity: 64}, {Peak: 10, Limit: 32, LimitAge: time.Second, Capacity: 64}, {Peak: 2, Limit: 32, LimitAge: 2 * time.Second}},
			Share{Capacity: 96, Measured: 96, Age: 2 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reports := map[string]Report{}
			for i, r := range tc.reports {
				reports[fmt.Sprint(i)] = r
			}
			if got := capacityOf(reports); got != tc.want {
				t.Fatalf("capacityOf(%v) = %+v, want %+v", tc.reports, got, tc.want)
			}
		})
	}
}

func TestSplitAddsUpAndFollowsWants(t *testing.T) {
	t.Parallel()
	for total := range 50 {
		for n := 1; n <= 5; n++ {
			wants := map[string]int{}
			sumWant := 0
			for i := range n {
				wants[fmt.Sprint(i)] = (i*7 + total) % 13
				sumWant += wants[fmt.Sprint(i)]
			}
			parts := Split(total, wants)
			sum := 0
			for id, p := range parts {
				sum += p
				if sumWant >= total && p > wants[id] {
					t.Fatalf("Split(%d, %v): %s got %d over its want", total, wants, id, p)
				}
			}
			if sumWant > 0 && sum != total {
				t.Fatalf("Split(%d, %v) = %v adds up to %d", total, wants, parts, sum)
			}
		}
	}
}

func runServer(t *testing.T) jetstream.JetStream {
	t.Helper()
	s, err := server.NewServer(&server.Options{Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "backoff", History: 1}); err != nil {
		t.Fatal(err)
	}
	return js
}

// openBoard opens account's board in js's "backoff" bucket, or fails the test.
func openBoard(t *testing.T, js jetstream.JetStream, account string, cfg Config) *Board {
	t.Helper()
	b, err := Open(context.Background(), js, "backoff", account, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBoardSplitsOneRoundAmongItsWorkers(t *testing.T) {
	t.Parallel()
	js := runServer(t)
	ctx := context.Background()
	open := func(account string) *Board {
		b := openBoard(t, js, account, Config{Gather: 200 * time.Millisecond, Window: 300 * time.Millisecond})
		t.Cleanup(func() { _ = b.Close(ctx) })
		return b
	}
	// A worker of another account and a stale report of this one stay out of the round.
	if _, err := open("other").Split(ctx, Report{Peak: 50, Want: 400}); err != nil {
		t.Fatal(err)
	}
	stale := open("acct")
	if _, err := stale.Split(ctx, Report{Peak: 30, Want: 400}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)

	// Four workers: two took all 64 places, two came too late and measured nothing.
	reports := []Report{{Peak: 27, Want: 400}, {Peak: 37, Want: 400}, {Peak: 0, Want: 400}, {Peak: 0, Want: 400}}
	parts := make([]int, len(reports))
	boards := make([]*Board, len(reports))
	// Every board is open before the first report: an open between the reports (a round
	// trip each, longer on a loaded machine) put the last report past the first's Gather.
	for i := range boards {
		boards[i] = open("acct")
	}
	var wg sync.WaitGroup
	roundAt := time.Now()
	for i, r := range reports {
		b := boards[i]
		wg.Go(func() {
			p, err := b.Split(ctx, r)
			if err != nil {
				t.Error(err)
			}
			parts[i] = p.Part
		})
	}
	wg.Wait()
	sum := 0
	for _, p := range parts {
		sum += p
		if p != 16 {
			t.Errorf("parts %v, want 16 each", parts)
			break
		}
	}
	if sum != 64 {
		t.Fatalf("parts %v add up to %d, want 64", parts, sum)
	}
	// Each knows who took part (a part may be theirs), and only since the round.
	for _, other := range boards[1:] {
		if !boards[0].ReportedSince(other.id, roundAt) {
			t.Errorf("worker %s was in the round, but not in what its board knows", other.id)
		}
	}
	if boards[0].ReportedSince(stale.id, time.Time{}) {
		t.Error("the stale report's worker took no part in the round, but its board says so")
	}
	if boards[0].ReportedSince(boards[1].id, time.Now()) {
		t.Error("a worker seen in a round before now was seen since now")
	}

	// A later round that measures less (its 429 was about a rate) keeps the limits its
	// workers hold, and their age, so that they expire when they would have; a worker that
	// joins gets a part of them.
	time.Sleep(500 * time.Millisecond)
	later := []Report{{Peak: 20, Want: 400, Limit: 32, LimitAge: 10 * time.Second}, {Peak: 10, Want: 400, Limit: 32, LimitAge: 10 * time.Second}, {Peak: 0, Want: 400}}
	shares := make([]Share, len(later))
	laterBoards := make([]*Board, len(later))
	for i := range laterBoards {
		laterBoards[i] = open("acct")
	}
	for i, r := range later {
		b := laterBoards[i]
		wg.Go(func() {
			s, err := b.Split(ctx, r)
			if err != nil {
				t.Error(err)
			}
			shares[i] = s
		})
	}
	wg.Wait()
	sum = 0
	for _, s := range shares {
		sum += s.Part
		if s.Capacity != 64 || s.Age != 10*time.Second {
			t.Errorf("later round %+v: want the 64 of the limits, 10s old", shares)
			break
		}
	}
	if sum != 64 {
		t.Fatalf("later round %+v: parts add up to %d, want 64", shares, sum)
	}

	// Closing takes the report off the board.
	if err := stale.Close(ctx); err != nil {
		t.Fatal(err)
	}
	kv, _ := js.KeyValue(ctx, "backoff")
	if _, err := kv.Get(ctx, "acct.share."+stale.id); err == nil {
		t.Fatal("a closed board's report is still there")
	}
}

// TestWatchLeavesSeesAnotherWorkerLeave: a worker that reported and closes tells the others
// of its account; one that never reported, the watcher itself, and a worker of another
// account do not.
func TestWatchLeavesSeesAnotherWorkerLeave(t *testing.T) {
	t.Parallel()
	js := runServer(t)
	ctx := context.Background()
	open := func(account string) *Board { return openBoard(t, js, account, Config{Gather: 10 * time.Millisecond}) }
	watcher, leaver, silent, other := open("acct"), open("acct"), open("acct"), open("other")
	for _, b := range []*Board{watcher, leaver, other} {
		if _, err := b.Split(ctx, Report{Peak: 8, Want: 400}); err != nil {
			t.Fatal(err)
		}
	}
	var (
		mu   sync.Mutex
		left = map[string]int{}
	)
	seen := func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		return left[id] > 0
	}
	waitLeave := func(id string, d time.Duration) bool {
		for deadline := time.Now().Add(d); !seen(id); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				return false
			}
		}
		return true
	}
	watchCtx, stop := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		watched <- watcher.WatchLeaves(watchCtx, func(id string) {
			mu.Lock()
			defer mu.Unlock()
			left[id]++
		})
	}()
	// The watch sees updates only: probe until it sees a leave, so that it is set up.
	for deadline := time.Now().Add(10 * time.Second); ; {
		probe := open("acct")
		if _, err := probe.Split(ctx, Report{Peak: 1, Want: 1}); err != nil {
			t.Fatal(err)
		}
		if err := probe.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if waitLeave(probe.id, 100*time.Millisecond) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch saw no probe leave")
		}
	}
	// In order: a leave of the silent or other worker would be seen before the leaver's.
	for _, b := range []*Board{silent, other, leaver} {
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !waitLeave(leaver.id, 5*time.Second) {
		t.Fatal("the leaver's leave was not seen")
	}
	if err := watcher.Close(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // room for a leave of its own, which must not be seen
	stop()
	if err := <-watched; err != nil {
		t.Fatalf("WatchLeaves: %v", err)
	}
	for _, b := range []*Board{silent, other, watcher} {
		if seen(b.id) {
			t.Errorf("saw %s leave (silent %s, other account %s, the watcher %s)", b.id, silent.id, other.id, watcher.id)
		}
	}
	if n := left[leaver.id]; n != 1 {
		t.Errorf("saw the leaver leave %d times", n)
	}
}

// TestRoundReadsOnlyRecentReports: reports left by crashed workers (never closed) and the
// delete markers of closed ones stay in the bucket, but a round is not sent them, so rounds do
// not slow down as a fleet's workers come and go.
func TestRoundReadsOnlyRecentReports(t *testing.T) {
	t.Parallel()
	js := runServer(t)
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, "backoff")
	if err != nil {
		t.Fatal(err)
	}
	const gone = 100
	for i := range gone {
		key := fmt.Sprintf("acct.share.crashed%03d", i)
		if _, err := kv.Put(ctx, key, []byte(`{"peak":9,"want":400}`)); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // half of them closed cleanly: a delete marker stays
			if err := kv.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, err := Open(ctx, js, "backoff", "acct", Config{Window: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the crashed workers' round is long over

	rev, err := kv.Put(ctx, b.prefix+b.id, []byte(`{"peak":12,"want":400}`))
	if err != nil {
		t.Fatal(err)
	}
	reports, read, err := b.round(ctx, rev)
	if err != nil {
		t.Fatal(err)
	}
	if len(reports) != 1 || reports[b.id] != (Report{Peak: 12, Want: 400}) {
		t.Errorf("round = %v; want only this worker's report", reports)
	}
	if read != 1 {
		t.Errorf("the round read %d messages; want 1 (none of the %d workers gone)", read, gone)
	}
}

// TestWatchLeavesResumesWhereItLeftOff: a leave between two watches (the worker watches
// again after a reconnect, or after its watcher closed) is seen by the second. A watch that
// began at the board's next update missed it, and the part it freed stayed unused until the
// limits expired.
func TestWatchLeavesResumesWhereItLeftOff(t *testing.T) {
	t.Parallel()
	js := runServer(t)
	ctx := context.Background()
	open := func() *Board { return openBoard(t, js, "acct", Config{Gather: 10 * time.Millisecond}) }
	report := func(b *Board) {
		if _, err := b.Split(ctx, Report{Peak: 1, Want: 1}); err != nil {
			t.Fatal(err)
		}
	}
	watcher, leaver := open(), open()
	report(leaver)
	left := make(chan string, 16)
	watch := func() (stop func()) {
		watchCtx, cancel := context.WithCancel(ctx)
		ended := make(chan error, 1)
		go func() { ended <- watcher.WatchLeaves(watchCtx, func(id string) { left <- id }) }()
		return func() {
			cancel()
			if err := <-ended; err != nil {
				t.Errorf("WatchLeaves: %v", err)
			}
		}
	}
	seen := func(id string, d time.Duration) bool {
		timeout := time.After(d)
		for {
			select {
			case got := <-left:
				if got == id {
					return true
				}
			case <-timeout:
				return false
			}
		}
	}
	// The first watch: probe until it sees a leave, so that it is set up.
	stop := watch()
	for deadline := time.Now().Add(10 * time.Second); ; {
		probe := open()
		report(probe)
		if err := probe.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if seen(probe.id, 100*time.Millisecond) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch saw no probe leave")
		}
	}
	stop()

	if err := leaver.Close(ctx); err != nil { // while nobody watches
		t.Fatal(err)
	}
	stop = watch()
	if !seen(leaver.id, 5*time.Second) {
		t.Fatal("a leave between two watches was not seen by the second")
	}

	// A bucket made anew (a server that lost its store) numbers its revisions from 1 again:
	// a watch that began after the last revision seen would miss every leave for as long.
	for range 10 { // the watch sees the old bucket's revisions run on
		probe := open()
		report(probe)
		if err := probe.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if !seen(probe.id, 5*time.Second) {
			t.Fatal("the second watch missed a leave")
		}
	}
	stop()
	if err := js.DeleteKeyValue(ctx, "backoff"); err != nil {
		t.Fatal(err)
	}
	// Right after the delete the server may still be removing the old store ("error
	// creating store for stream"): try again for a while.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "backoff", History: 1})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	stop = watch()
	defer stop()
	for probes := 1; ; probes++ { // until the watch is set up, as above: a few probes
		probe := open()
		report(probe)
		if err := probe.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if seen(probe.id, 200*time.Millisecond) {
			break
		}
		if probes == 5 {
			t.Fatal("a watch of the bucket made anew saw none of 5 leaves")
		}
	}
}

// TestWatchLeavesReturnsNilWhenItsContextEnds: the watch is tied to ctx, so ctx's end also
// closes the watcher's channel, and the watch may find the channel closed before it sees
// ctx done. That is still the end asked for, not a watcher lost: CI once read it as the
// error. Here the watch is held in its callback while ctx ends and nats.go closes the
// watcher, so both are ready when it selects again; each round, one in two picked the error.
func TestWatchLeavesReturnsNilWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	js := runServer(t)
	ctx := context.Background()
	open := func() *Board { return openBoard(t, js, "acct", Config{Gather: 10 * time.Millisecond}) }
	watcher := open()
	for round := range 8 {
		watchCtx, cancel := context.WithCancel(ctx)
		inside, release := make(chan struct{}, 1), make(chan struct{})
		ended := make(chan error, 1)
		go func() {
			ended <- watcher.WatchLeaves(watchCtx, func(string) {
				select {
				case inside <- struct{}{}:
					<-release
				default: // a later leave, while the first is held: nothing to hold
				}
			})
		}()
		// Leaves until the watch, once set up, sees one and is held in its callback.
		for held := false; !held; {
			probe := open()
			if _, err := probe.Split(ctx, Report{Peak: 1, Want: 1}); err != nil {
				t.Fatal(err)
			}
			if err := probe.Close(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-inside:
				held = true
			case <-time.After(100 * time.Millisecond):
			}
		}
		cancel()
		time.Sleep(50 * time.Millisecond) // nats.go unsubscribes and closes the channel
		close(release)
		if err := <-ended; err != nil {
			t.Fatalf("round %d: WatchLeaves after its context ended: %v; want nil", round, err)
		}
	}
}

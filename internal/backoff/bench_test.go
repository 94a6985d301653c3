package backoff

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkPropagation measures the latency from Signal on one connection to
// two watchers on other connections seeing the new deadline (p50/p99 in µs,
// the slower of the two watchers per signal).
func BenchmarkPropagation(b *testing.B) {
	s := startServer(b, b.TempDir(), -1)
	seen := make(chan struct{}, 1024)
	var jss []jetstream.JetStream
	for range 3 {
		_, js := connect(b, s.ClientURL())
		jss = append(jss, js)
	}
	// fleets opens the signalling fleet and the two watchers of account.
	fleets := func(account string) []*Fleet {
		var fs []*Fleet
		for i, js := range jss {
			cfg := Config{Account: account}
			if i > 0 {
				cfg.OnChange = func(State) { seen <- struct{}{} }
			}
			fs = append(fs, open(b, js, cfg))
		}
		return fs
	}
	// Each signal is a second longer than the last, so that it always extends the deadline
	// (by far more than Signal's slack), from a minute up to MaxPause, where Signal cuts it:
	// signals of an hour and more all came out at one hour, the second and later wrote
	// nothing, and the benchmark waited for ever for watchers that had nothing to see. Past
	// MaxPause the signals start again on a fresh account.
	const first, step = time.Minute, time.Second
	perAccount := int((MaxPause-first)/step) + 1
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	var fs []*Fleet
	b.ResetTimer()
	for i := range b.N {
		k := i % perAccount
		if k == 0 {
			b.StopTimer()
			fs = fleets(fmt.Sprintf("bench%d", i/perAccount))
			b.StartTimer()
		}
		start := time.Now()
		if err := fs[0].Signal(ctx, "bench", first+time.Duration(k)*step); err != nil {
			b.Fatal(err)
		}
		<-seen
		<-seen
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkUntilFleet is the dispatch fast-path read of the fleet deadline.
func BenchmarkUntilFleet(b *testing.B) {
	s := startServer(b, b.TempDir(), -1)
	_, js := connect(b, s.ClientURL())
	f := open(b, js, Config{})
	_ = f.Signal(context.Background(), "x", time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if f.Until().IsZero() {
			b.Fatal("zero")
		}
	}
}

// BenchmarkUntilLocal is the same read on the per-process Local.
func BenchmarkUntilLocal(b *testing.B) {
	l := NewLocal(nil)
	_ = l.Signal(context.Background(), "x", time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if l.Until().IsZero() {
			b.Fatal("zero")
		}
	}
}

// BenchmarkSignalCovered is a Signal already covered by the in-memory
// deadline (a 429 storm): no network round trip.
func BenchmarkSignalCovered(b *testing.B) {
	s := startServer(b, b.TempDir(), -1)
	_, js := connect(b, s.ClientURL())
	f := open(b, js, Config{})
	ctx := context.Background()
	_ = f.Signal(ctx, "x", time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if err := f.Signal(ctx, "x", time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

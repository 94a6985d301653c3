package backoff

import (
	"context"
	"slices"
	"testing"
	"time"
)

// BenchmarkPropagation measures the latency from Signal on one connection to
// two watchers on other connections seeing the new deadline (p50/p99 in µs,
// the slower of the two watchers per signal).
func BenchmarkPropagation(b *testing.B) {
	s := startServer(b, b.TempDir(), -1)
	seen := make(chan struct{}, 1024)
	var fs []*Fleet
	for i := range 3 {
		_, js := connect(b, s.ClientURL())
		cfg := Config{}
		if i > 0 {
			cfg.OnChange = func(State) { seen <- struct{}{} }
		}
		fs = append(fs, open(b, js, cfg))
	}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	base := time.Hour
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		// Each signal is longer than the last, so it always extends.
		if err := fs[0].Signal(ctx, "bench", base+time.Duration(i)*time.Second); err != nil {
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

package dispatch

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// BenchmarkAcquireRelease measures one Acquire+Release with no contention.
func BenchmarkAcquireRelease(b *testing.B) {
	l := New(Config{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := l.Acquire(ctx, 4096)
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}

// BenchmarkAcquireReleaseRecent is the same while a backoff is recent (all
// three layers are taken).
func BenchmarkAcquireReleaseRecent(b *testing.B) {
	until := time.Now().Add(time.Hour)
	l := New(Config{BackoffUntil: func() time.Time { return until }})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := l.Acquire(ctx, 4096)
		if err != nil {
			b.Fatal(err)
		}
		p.Release()
	}
}

// BenchmarkAcquireReleaseFunc measures the form the tinker.Dispatcher needs
// (release as a func()): the method value costs one allocation.
func BenchmarkAcquireReleaseFunc(b *testing.B) {
	l := New(Config{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := l.Acquire(ctx, 4096)
		if err != nil {
			b.Fatal(err)
		}
		release := p.Release
		release()
	}
}

func benchContended(b *testing.B, goroutines int) {
	l := New(Config{}) // 400 count permits
	ctx := context.Background()
	procs := max(1, testingProcs())
	b.SetParallelism(max(1, goroutines/procs))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := l.Acquire(ctx, 4096)
			if err != nil {
				b.Error(err)
				return
			}
			p.Release()
		}
	})
}

// BenchmarkContended400 has 400 goroutines contending (= the count permits).
func BenchmarkContended400(b *testing.B) { benchContended(b, 400) }

// BenchmarkContended4000 has 4,000 goroutines contending for 400 permits.
func BenchmarkContended4000(b *testing.B) { benchContended(b, 4000) }

func testingProcs() int { return runtime.GOMAXPROCS(0) }

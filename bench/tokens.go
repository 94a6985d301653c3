package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/corpus"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loopResult is how much a repeated operation did in its time.
type loopResult struct {
	runs    int64
	elapsed time.Duration
	cpu     time.Duration
}

// repeat runs f in g goroutines until d has passed (each finishes its current run).
func repeat(ctx context.Context, g int, d time.Duration, f func()) loopResult {
	var (
		mu   sync.Mutex
		runs int64
		wg   sync.WaitGroup
	)
	c0, t0 := cpuTime(), time.Now()
	deadline := t0.Add(d)
	for range g {
		wg.Go(func() {
			var n int64
			for ctx.Err() == nil && (n == 0 || time.Now().Before(deadline)) {
				f()
				n++
			}
			mu.Lock()
			runs += n
			mu.Unlock()
		})
	}
	wg.Wait()
	return loopResult{runs: runs, elapsed: time.Since(t0), cpu: cpuTime() - c0}
}

// runTokenizer is comparison 6: tokens per second of the Qwen3 tokenizer on the corpus.
func runTokenizer(ctx context.Context, s settings, _ io.Writer) (*table, error) {
	t := &table{ID: 6, Title: "tokenizer throughput"}
	text, err := corpus.Build(s.TokBytes)
	if err != nil {
		return t, err
	}
	tok, err := newTokenizer(ctx)
	if err != nil {
		return t, err
	}
	n := len(tok.Encode(text)) // warms the piece cache, as a long-running worker's is
	mb := float64(len(text)) / 1e6

	// An interrupt ends the loops, and those after it do not run: their rates would read 0 (or
	// those of a few runs), so the comparison stops there as not run to the end.
	one := repeat(ctx, 1, s.TokDuration, func() { tok.Encode(text) })
	fields := repeat(ctx, 1, s.TokDuration, func() { _ = strings.Fields(text) })
	if err := ctx.Err(); err != nil {
		return t, err
	}
	oneTok := float64(n) * float64(one.runs) / one.elapsed.Seconds()
	oneMB := mb * float64(one.runs) / one.elapsed.Seconds()
	fieldsMB := mb * float64(fields.runs) / fields.elapsed.Seconds()
	t.add(row{Case: "Qwen3 Encode, 1 goroutine, warm cache",
		Measured: fmt.Sprintf("%.2f Mtok/s = %.1f MB/s", oneTok/1e6, oneMB),
		Baseline: fmt.Sprintf("%.1f MB/s strings.Fields", fieldsMB),
		Ratio:    ratio(oneMB, fieldsMB), Verdict: verdictInfo})

	g := runtime.GOMAXPROCS(0)
	par := repeat(ctx, g, s.TokDuration, func() { tok.Encode(text) })
	if err := ctx.Err(); err != nil {
		return t, err
	}
	parTok := float64(n) * float64(par.runs) / par.elapsed.Seconds()
	perCPU := float64(n) * float64(par.runs) / par.cpu.Seconds()
	t.add(row{Case: fmt.Sprintf("Qwen3 Encode, %d goroutines (GOMAXPROCS), one shared tokenizer", g),
		Measured: fmt.Sprintf("%.2f Mtok/s", parTok/1e6),
		Baseline: fmt.Sprintf("%.2f Mtok/s x %d", oneTok/1e6, g),
		Ratio:    ratio(parTok, oneTok*float64(g)), Verdict: verdictInfo})
	// Against the 1-goroutine run's own CPU time, not its wall time: on shared cores the
	// two part, and per CPU-second against per second read above 1 (1.87 once).
	onePerCPU := float64(n) * float64(one.runs) / one.cpu.Seconds()
	t.add(row{Case: "Qwen3 Encode per CPU-second (getrusage, parallel run)",
		Measured: fmt.Sprintf("%.2f Mtok/CPU-s", perCPU/1e6),
		Baseline: fmt.Sprintf("%.2f Mtok/CPU-s 1 goroutine", onePerCPU/1e6),
		Ratio:    ratio(perCPU, onePerCPU), Verdict: verdictInfo})
	t.note("corpus %.2f MB (%d tokens, %.2f bytes/token): prose, CJK/emoji, Go source of $GOROOT/src/net/http (internal/corpus, as internal/tokenizer's benchmark)",
		mb, n, float64(len(text))/float64(n))
	t.note("strings.Fields is a floor, not a tokenizer: the cheapest whitespace split of the same bytes; no naive BPE is exported to compare with")
	t.note("the parallel ratio is against perfect scaling; the machine's cores are shared with other work")
	return t, nil
}

// newTokenizer loads the tokenizer of benchModel (built into the program: no download).
func newTokenizer(ctx context.Context) (*tokenizer.Tokenizer, error) {
	tok, err := tokenizer.NewRegistry(tokenizer.Options{Offline: true}).ForModel(ctx, benchModel)
	if err != nil {
		return nil, fmt.Errorf("%s tokenizer: %w", benchModel, err)
	}
	return tok, nil
}

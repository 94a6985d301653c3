package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestTokenizerComparison runs comparison 6 on a 50 kB corpus and checks its table.
func TestTokenizerComparison(t *testing.T) {
	s := quickSettings()
	s.TokBytes, s.TokDuration = 50_000, 100*time.Millisecond
	tb, err := runTokenizer(context.Background(), s, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(tb.Rows) != 3 {
		t.Fatalf("got %d rows, want 3", len(tb.Rows))
	}
	for _, r := range tb.Rows {
		if math.IsNaN(r.Ratio) || r.Ratio <= 0 || r.Verdict != verdictInfo {
			t.Fatalf("row %+v: want a positive ratio and no aim", r)
		}
	}
	if !strings.Contains(tb.Rows[0].Measured, "Mtok/s") {
		t.Fatalf("measured %q does not say tokens per second", tb.Rows[0].Measured)
	}
}

// TestThroughputOneWorker runs comparison 1 with one worker for a 2 s window: jobs flow from
// JetStream through a worker to the simulator, and the rate is judged against the ideal.
func TestThroughputOneWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker for a few seconds")
	}
	s := quickSettings()
	s.ThroughputSizes, s.CapacityBound = []int{1}, false
	s.ThroughputWarmup, s.ThroughputWindow = 500*time.Millisecond, 2*time.Second
	tb, err := runThroughput(context.Background(), s, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(tb.Rows) != 1 {
		t.Fatalf("got %d rows, want 1", len(tb.Rows))
	}
	r := tb.Rows[0]
	// The ideal is 32 slots / 200 ms = 160 jobs/s; under -race on a loaded machine the rate
	// may fall short of the aim, but jobs must have completed in the window.
	if !strings.HasPrefix(r.Baseline, "160.0 jobs/s") || r.Ratio <= 0.1 || r.Ratio > 1.1 {
		t.Fatalf("row %+v: want a rate between 0.1 and 1.1 of the 160 jobs/s ideal", r)
	}
	if want, v := atLeast(r.Ratio, 0.9); r.Aim != want || r.Verdict != v {
		t.Fatalf("row %+v: aim/verdict not judged", r)
	}
	var out bytes.Buffer
	tb.print(&out)
	if !strings.Contains(out.String(), "worker-bound, 1 worker(s)") {
		t.Fatalf("printed table lacks the case:\n%s", out.String())
	}
}

// TestThroughputCountsJobsDone: a job is done when its result is stored. With a results
// stream that stores one result and refuses the rest, the worker holds its jobs and stores
// no more; the simulator still completed a sample for each of its free job slots (here 2,000
// against a capacity of 64: six seconds at the ideal), and counted so, the rate read the ideal.
func TestThroughputCountsJobsDone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker for a few seconds")
	}
	sc := scenario{name: "results refused", capacity: 64, concurrency: 2000,
		beforeStart: func(ctx context.Context, q *queue.Queue) error {
			info, err := q.Results.Info(ctx)
			if err != nil {
				return err
			}
			cfg := info.Config
			cfg.MaxMsgs = 1 // with DiscardNew: the second result is refused
			_, err = q.JS.UpdateStream(ctx, cfg)
			return err
		}}
	res, err := measureThroughput(context.Background(), sc, 1, 300*time.Millisecond, 1500*time.Millisecond, "")
	if err != nil {
		t.Fatal(err)
	}
	if res.ideal != 320 || res.rate > 0.1*res.ideal {
		t.Fatalf("%.1f jobs/s against the ideal %.1f, with no result stored after the first: want at most a tenth", res.rate, res.ideal)
	}
}

// TestTheRateOfWavesIsItsSlope: 32 slots that start together finish together, a wave every
// cycle. Counted over a 2 s window, waves of a 205 ms cycle read 9 or 10 waves' worth, as
// the window's phase falls (0.92 or 1.03 of the rate); the line fitted through readings every
// 5 ms is within 1.5 % of the rate at every phase.
func TestTheRateOfWavesIsItsSlope(t *testing.T) {
	const (
		wave   = 32.0
		cycle  = 0.205 // seconds
		window = 2.0
		every  = 0.005
	)
	rate := wave / cycle
	counted := map[float64]bool{}
	for phase := 0.0; phase < cycle; phase += 0.01 {
		done := func(x float64) float64 { return wave * math.Floor((x+phase)/cycle) }
		var fit lineFit
		for x := 0.0; x <= window; x += every {
			fit.add(x, done(x))
		}
		if got := fit.slope() / rate; got < 0.985 || got > 1.015 {
			t.Errorf("phase %.2fs: the fitted slope is %.3f of the rate", phase, got)
		}
		counted[math.Round((done(window)-done(0))/window/rate*100)/100] = true
	}
	if len(counted) < 2 {
		t.Errorf("the window's count read %v of the rate at every phase: the waves do not test the fit", counted)
	}
}

// TestParseOnly checks the -only flag.
func TestParseOnly(t *testing.T) {
	got, err := parseOnly("1, 3")
	if err != nil || len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Fatalf("parseOnly(1, 3) = %v, %v", got, err)
	}
	for _, bad := range []string{"0", "7", "x", "1,,2"} {
		if _, err := parseOnly(bad); err == nil {
			t.Fatalf("parseOnly(%q) accepted", bad)
		}
	}
}

// TestInstructionPlanKeepsARunAsLong checks that -instructions runs fewer samples as they are
// longer, in proportion, and never fewer than 500.
func TestInstructionPlanKeepsARunAsLong(t *testing.T) {
	for _, c := range []struct{ maxTokens, samples int }{{1, 5000}, {16, 5000}, {64, 1250}, {160, 500}, {512, 500}} {
		p := instructionPlan(c.maxTokens, true)
		if p.n != c.samples || p.maxTokens != c.maxTokens || !p.setupOnly || p.warmup != instructionWarmup {
			t.Errorf("max_tokens %d: %+v, want %d samples", c.maxTokens, p, c.samples)
		}
	}
}

// TestCostAimIsJudgedAtItsOwnSampleLength: comparison 2's aim rows pass or miss at 16 tokens a
// sample, and are information at any other -max-tokens.
func TestCostAimIsJudgedAtItsOwnSampleLength(t *testing.T) {
	if _, v := costVerdict(benchMaxTokens, 1.4); v != verdictMiss {
		t.Errorf("1.4 at %d tokens: %v, want a miss", benchMaxTokens, v)
	}
	if _, v := costVerdict(benchMaxTokens, 1.2); v != verdictPass {
		t.Errorf("1.2 at %d tokens: %v, want a pass", benchMaxTokens, v)
	}
	if aim, v := costVerdict(512, 2.1); v != verdictInfo || aim != "" {
		t.Errorf("2.1 at 512 tokens: %q %v, want information", aim, v)
	}
}

// TestMaxTokensOutOfRangeIsRefused checks -max-tokens against the bounds of a job's max_tokens.
func TestMaxTokensOutOfRangeIsRefused(t *testing.T) {
	for _, bad := range []string{"0", "-1", "32769"} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{"-only=6", "-max-tokens", bad}, &out, io.Discard); err == nil || !strings.Contains(err.Error(), "-max-tokens") {
			t.Errorf("-max-tokens %s: %v, want it refused", bad, err)
		}
	}
}

// TestVerdicts checks the aim judgements, including NaN for a missing baseline.
func TestVerdicts(t *testing.T) {
	if _, v := atLeast(0.95, 0.9); v != verdictPass {
		t.Fatal("0.95 >= 0.9 judged a miss")
	}
	if _, v := atLeast(0.5, 0.9); v != verdictMiss {
		t.Fatal("0.5 >= 0.9 judged a pass")
	}
	if _, v := atMost(ratio(1, 0), 1.25); v != verdictMiss {
		t.Fatal("a NaN ratio judged a pass")
	}
	if _, v := atMost(1.2, 1.25); v != verdictPass {
		t.Fatal("1.2 <= 1.25 judged a miss")
	}
}

// TestParseCachegrind sums counts by the package of each function, the runtime's assembly
// by its file.
func TestParseCachegrind(t *testing.T) {
	const out = `desc: I1 cache:
cmd: bench
events: Ir
fl=/usr/local/go/src/net/http/transport.go
fn=net/http.(*Transport).dial
10 100
11 5
fn=github.com/nats-io/nats%2ego.(*Conn).parse
3 7
fl=/usr/local/go/src/runtime/asm_amd64.s
fn=gogo
1 40
fl=/usr/local/go/src/internal/bytealg/indexbyte_amd64.s
fn=indexbytebody
2 9
fl=/usr/local/go/src/runtime/proc.go
fn=runtime.schedule
5 1000
summary: 1161
`
	got, err := parseCachegrind(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"net/http": 105, "github.com/nats-io/nats.go": 7, "runtime": 1040, "indexbytebody": 9}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for pkg, n := range want {
		if got[pkg] != n {
			t.Errorf("%s: %d instructions, want %d (all: %v)", pkg, got[pkg], n, got)
		}
	}
	if !isRuntime("runtime") || !isRuntime("internal/runtime/atomic") || isRuntime("runtime/pprof") {
		t.Error("isRuntime: runtime and internal/runtime/... are the runtime's, runtime/pprof is not")
	}
}

// TestWaitForCountPollsSparsely checks that waiting for a count that grows steadily polls it a
// few times, not once every few milliseconds, and still returns once the target is reached.
func TestWaitForCountPollsSparsely(t *testing.T) {
	start := time.Now()
	polls := 0
	count := func() int64 {
		polls++
		if polls == 2 {
			return -1 // a failed poll is tried again
		}
		return int64(time.Since(start) / time.Millisecond)
	}
	const target = 1000 // a second
	k, err := waitForCount(context.Background(), time.Minute, "the count", target, count)
	if err != nil {
		t.Fatal(err)
	}
	if k < target {
		t.Fatalf("returned at %d, before the target %d", k, target)
	}
	// Halving the time left from 1 s down to 20 ms takes about six polls; every 50 ms would be 20.
	if polls > 14 {
		t.Errorf("polled %d times for a second's wait, want at most 14", polls)
	}
	// A count that stands still for 300 ms first, as a worker's results while it starts.
	start, polls = time.Now(), 0
	stalled := func() int64 {
		polls++
		return max(0, int64(time.Since(start)/time.Millisecond)-300)
	}
	// Then it must not sleep past the target on the slow rate of the stall.
	if k, err := waitForCount(context.Background(), time.Minute, "the count", 600, stalled); err != nil || k < 600 || k > 750 {
		t.Fatalf("after a stall: returned %d, %v; want 600 to 750", k, err)
	}
	if polls > 16 {
		t.Errorf("polled %d times for a 300 ms stall and 600 ms of progress, want at most 16", polls)
	}
	if _, err := waitForCount(context.Background(), 30*time.Millisecond, "nothing", 1, func() int64 { return 0 }); err == nil {
		t.Error("a count that never reaches its target: want a timeout error")
	}
}

// TestHasSymbols checks the test of -instructions for an executable that cachegrind can name
// functions in: a program built as go build does has its symbol table; one linked as go run
// and go test link theirs (-s -w) has not.
func TestHasSymbols(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{"go.mod": "module hello\n", "main.go": "package main\n\nfunc main() {}\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		ldflags string
		want    bool
	}{{"", true}, {"-s -w", false}} {
		exe := filepath.Join(dir, "hello"+strings.ReplaceAll(c.ldflags, " ", ""))
		cmd := exec.Command("go", "build", "-ldflags="+c.ldflags, "-o", exe, ".")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		if got := hasSymbols(exe); got != c.want {
			t.Errorf("linked with %q: hasSymbols = %v, want %v", c.ldflags, got, c.want)
		}
	}
}

// TestMedianOf checks the statistic of comparison 2's paired rounds and of comparison 3's
// baseline windows.
func TestMedianOf(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{55, 13, 49}, 49},
		{[]float64{7}, 7},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := slices.Clone(tc.xs)
		if got := medianOf(tc.xs); got != tc.want {
			t.Errorf("medianOf(%v) = %v, want %v", in, got, tc.want)
		}
		if !slices.Equal(tc.xs, in) {
			t.Errorf("medianOf reordered its argument: %v", tc.xs)
		}
	}
	if got := medianOf(nil); !math.IsNaN(got) {
		t.Errorf("medianOf(nil) = %v, want NaN", got)
	}
}

// TestAComparisonThatDidNotRunFailsTheProgram: a missed aim is a result, but a comparison that
// could not run (here: no temporary directory) is none, and CI must not read it as a pass.
func TestAComparisonThatDidNotRunFailsTheProgram(t *testing.T) {
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
	var out bytes.Buffer
	err := run(context.Background(), []string{"-only=4"}, &out, io.Discard)
	if err == nil {
		t.Fatalf("run returned nil after comparison 4 failed:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "4. did not run to the end") || strings.Contains(out.String(), "every aim met") {
		t.Fatalf("summary:\n%s", out.String())
	}
}

// TestAnInterruptedRunSaysWhatItSkipped: comparisons skipped after an interrupt are named, and
// the summary does not call their aims met.
func TestAnInterruptedRunSaysWhatItSkipped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	if err := run(ctx, []string{"-only=1,4"}, &out, io.Discard); err == nil {
		t.Fatal("an interrupted run returned nil")
	}
	for _, want := range []string{"1. did not run to the end: not run: context canceled", "4. did not run to the end"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "every aim met") {
		t.Errorf("the summary calls the skipped aims met:\n%s", out.String())
	}
}

func TestQuantileIsTheNearestRank(t *testing.T) {
	t.Parallel()
	upTo := func(n int) []time.Duration {
		ds := make([]time.Duration, n)
		for i := range ds {
			ds[n-1-i] = time.Duration(i+1) * time.Millisecond // unsorted
		}
		return ds
	}
	for _, c := range []struct {
		n    int
		q    float64
		want time.Duration
	}{
		{100, 0.99, 99 * time.Millisecond}, {100, 0.50, 50 * time.Millisecond},
		{200, 0.99, 198 * time.Millisecond}, {1, 0.99, time.Millisecond}, {3, 0.5, 2 * time.Millisecond},
		{100, 1, 100 * time.Millisecond}, {100, 0, time.Millisecond},
	} {
		if got := quantile(upTo(c.n), c.q); got != c.want {
			t.Errorf("quantile of 1..%d ms at %v = %v, want %v", c.n, c.q, got, c.want)
		}
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile of nothing = %v", got)
	}
}

// TestPropagationTimesAreOfTheirOwnSignal: each time runs from a signal to the moment every
// other fleet learned that signal, never an earlier one's (which read as zero or negative).
func TestPropagationTimesAreOfTheirOwnSignal(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of signals")
	}
	// Each signal is a second longer than the last, up to backoff.MaxPause, so that it extends
	// the deadline the others hold. Signals of an hour and more were all cut to one hour: the
	// later ones found it held and wrote nothing, and each trial timed an earlier arrival.
	const trials = 3000
	fleet, raw, err := propagation(context.Background(), 2, trials)
	if err != nil {
		t.Fatal(err)
	}
	if len(fleet) != trials || len(raw) != trials {
		t.Fatalf("%d fleet and %d raw times, want %d each", len(fleet), len(raw), trials)
	}
	for k, d := range fleet {
		if d <= 0 {
			t.Fatalf("trial %d: propagation %v", k, d)
		}
	}
	if _, _, err := propagation(context.Background(), 2, 4000); err == nil {
		t.Error("4000 signals, the last longer than backoff.MaxPause: want an error, not times of signals cut short")
	}
}

// TestMain lets the test binary serve as the bench's helper processes, as the program does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		if err := runChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestAnInterruptedChildCleansUp: an interrupted run (its context cancelled) stops the NATS
// helper as a finished one does, so the server's store leaves the temporary directory with
// it; killed at once, it stayed there.
func TestAnInterruptedChildCleansUp(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithCancel(context.Background())
	c, err := startChild(ctx, "", "-role", "nats")
	if err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "tinkerfleet-bench-nats-*"))
	if len(left) != 1 {
		t.Fatalf("the NATS child's store is %v, want one directory", left)
	}
	cancel()
	_ = c.cmd.Wait()
	if left, _ := filepath.Glob(filepath.Join(tmp, "tinkerfleet-bench-nats-*")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// TestAnInterruptedTokenizerComparisonIsNotAResult: comparison 6 interrupted part way did not
// run to the end: its loops after the interrupt ran not at all, and read 0 tokens/s.
func TestAnInterruptedTokenizerComparisonIsNotAResult(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(time.Second) // after the tokenizer's load, in the first loop
		cancel()
	}()
	var out bytes.Buffer
	err := run(ctx, []string{"-only=6"}, &out, io.Discard)
	if err == nil {
		t.Fatalf("run returned nil after comparison 6 was interrupted:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "6. did not run to the end") || strings.Contains(out.String(), "every aim met") {
		t.Fatalf("summary:\n%s", out.String())
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// settings are the sizes of one run of every comparison (quick or full).
type settings struct {
	Name string

	// 1. throughput
	ThroughputSizes  []int
	ThroughputWarmup time.Duration
	ThroughputWindow time.Duration
	CapacityBound    bool // also run the capacity-bound scenario

	// 2. per-sample cost
	CostWarmup    int
	CostSamples   int
	CostRounds    int
	CostMaxTokens int // max_tokens of every sample (-max-tokens)

	// 3. fleet backoff
	PropagationTrials int
	Window            time.Duration

	// 4. submit
	SubmitLines  int
	SubmitRounds int

	// 5. memory
	MemBacklog int
	MemHold    time.Duration

	// 6. tokenizer
	TokBytes    int
	TokDuration time.Duration

	// ChildProfile is the -cpuprofile file: helper processes profile themselves to
	// ChildProfile.<role>.<pid>. Empty: no profiles.
	ChildProfile string
}

func quickSettings() settings {
	return settings{
		Name:              "quick",
		ThroughputSizes:   []int{1, 2, 4},
		ThroughputWarmup:  2 * time.Second,
		ThroughputWindow:  2 * time.Second,
		CapacityBound:     true,
		CostWarmup:        200,
		CostSamples:       1000,
		CostRounds:        5,
		CostMaxTokens:     benchMaxTokens,
		PropagationTrials: 200,
		Window:            2 * time.Second,
		SubmitLines:       100_000,
		SubmitRounds:      2,
		MemBacklog:        100_000,
		MemHold:           2500 * time.Millisecond,
		TokBytes:          1 << 20,
		TokDuration:       time.Second,
	}
}

func fullSettings() settings {
	return settings{
		Name:              "full",
		ThroughputSizes:   []int{1, 2, 4},
		ThroughputWarmup:  2 * time.Second,
		ThroughputWindow:  10 * time.Second,
		CapacityBound:     true,
		CostWarmup:        1000,
		CostSamples:       10_000,
		CostRounds:        7,
		CostMaxTokens:     benchMaxTokens,
		PropagationTrials: 1000,
		Window:            5 * time.Second,
		SubmitLines:       1_000_000,
		SubmitRounds:      2,
		MemBacklog:        1_000_000,
		MemHold:           5 * time.Second,
		TokBytes:          1 << 20,
		TokDuration:       5 * time.Second,
	}
}

// comparison is one of the six, run on its own.
type comparison struct {
	ID    int
	Title string
	Run   func(ctx context.Context, s settings, log io.Writer) (*table, error)
}

func comparisons() []comparison {
	return []comparison{
		{1, "throughput against the ideal", runThroughput},
		{2, "per-sample cost: worker vs Tinker client alone", runCost},
		{3, "fleet backoff: propagation and 429 window", runFleet},
		{4, "submit: JSONL into JetStream vs raw publish", runSubmit},
		{5, "worker peak RSS: big backlog vs small", runMemory},
		{6, "tokenizer throughput", runTokenizer},
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		if err := runChild(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
}

// run parses the flags, runs the selected comparisons and prints their tables and a summary.
// It fails only on bad flags: a missed aim is a result, not an error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "CI sizes: all six comparisons in under 2 minutes on 2 cores (the default)")
	full := fs.Bool("full", false, "full sizes: 1M-line submit and backlog, longer windows (about 7½ minutes on 2 cores)")
	only := fs.String("only", "", "comma-separated comparisons to run, e.g. 1,3 (default: all)")
	verbose := fs.Bool("v", false, "progress lines on stderr")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process to `file`, and of each helper process to file.<role>.<pid>")
	instructions := fs.Bool("instructions", false, "instead of the comparisons, count comparison 2's instructions per sample with valgrind (a few minutes)")
	maxTokens := fs.Int("max-tokens", benchMaxTokens, "max_tokens of comparison 2's samples, and of -instructions' (the aim is judged at 16; the other comparisons keep 16)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *quick && *full {
		return errors.New("give -quick or -full, not both")
	}
	if *maxTokens < 1 || *maxTokens > 32768 {
		return fmt.Errorf("-max-tokens %d: must be 1 to 32768", *maxTokens)
	}
	s := quickSettings()
	if *full {
		s = fullSettings()
	}
	s.CostMaxTokens = *maxTokens
	selected, err := parseOnly(*only)
	if err != nil {
		return err
	}
	log := io.Discard
	if *verbose {
		log = stderr
	}

	if *cpuProfile != "" {
		s.ChildProfile = *cpuProfile
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer stop()
	}

	if *instructions {
		fmt.Fprintf(stdout, "tinkerfleet bench, instruction counts: %s, %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		t, err := runInstructions(ctx, log, *maxTokens)
		t.print(stdout)
		return err
	}
	started := time.Now()
	fmt.Fprintf(stdout, "tinkerfleet bench, %s mode: %s, GOMAXPROCS %d, NumCPU %d, %s/%s\n",
		s.Name, runtime.Version(), runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	var tables []*table
	failed := map[int]error{}
	for _, c := range comparisons() {
		if len(selected) > 0 && !slices.Contains(selected, c.ID) {
			continue
		}
		if err := ctx.Err(); err != nil {
			failed[c.ID] = fmt.Errorf("not run: %w", err)
			continue
		}
		t0 := time.Now()
		fmt.Fprintf(log, "bench: %d. %s ...\n", c.ID, c.Title)
		t, err := c.Run(ctx, s, log)
		if t != nil {
			t.note("took %s", time.Since(t0).Round(100*time.Millisecond))
			t.print(stdout)
			tables = append(tables, t)
		}
		if err != nil {
			fmt.Fprintf(stdout, "\n%d. %s: ERROR: %v\n", c.ID, c.Title, err)
			failed[c.ID] = err
		}
	}
	printSummary(stdout, tables, failed)
	fmt.Fprintf(stdout, "total %s\n", time.Since(started).Round(100*time.Millisecond))
	if len(failed) > 0 {
		// A missed aim is a result; a comparison that did not run to the end is none.
		return fmt.Errorf("%d comparison(s) did not run to the end", len(failed))
	}
	return nil
}

// parseOnly reads the -only list.
func parseOnly(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var out []int
	for p := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 || n > len(comparisons()) {
			return nil, fmt.Errorf("-only: %q is not a comparison number 1-%d", p, len(comparisons()))
		}
		out = append(out, n)
	}
	return out, nil
}

// startCPUProfile profiles this process to the file path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

package main

import (
	"bufio"
	"cmp"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

// instructionWarmup and instructionSamples are the samples each side runs under valgrind:
// about a minute a run here. Longer samples than benchMaxTokens are fewer (instructionPlan).
const (
	instructionWarmup  = 200
	instructionSamples = 5000
)

// instructionPlan is what each side runs under valgrind for samples of maxTokens: the samples
// are fewer as they are longer, down to 500, so that a run takes about as long.
func instructionPlan(maxTokens int, setupOnly bool) costPlan {
	n := max(500, instructionSamples*benchMaxTokens/max(maxTokens, benchMaxTokens))
	return costPlan{warmup: instructionWarmup, n: n, maxTokens: maxTokens, setupOnly: setupOnly}
}

// runInstructions counts the instructions that comparison 2's client alone and worker execute
// per sample, with valgrind's cachegrind. Unlike CPU time, a count does not move with what
// else the machine is doing, so it shows small changes to the worker's own work that this
// machine's noise hides. Each side runs twice under valgrind in a process of its own (the
// simulator and NATS server in theirs, not counted): once for the samples, once only set up
// as for them (jobs published, tokenizer loaded); the difference over the samples is the
// count per sample. The Go runtime's own instructions are shown apart and not judged: under
// valgrind the threads take turns, so its spinning and parking differ from a real run.
func runInstructions(ctx context.Context, log io.Writer, maxTokens int) (*table, error) {
	t := &table{ID: 2, Title: "per-sample instructions (cachegrind): worker vs Tinker client alone"}
	if _, err := exec.LookPath("valgrind"); err != nil {
		return t, errors.New("-instructions needs valgrind on the PATH (Debian package valgrind)")
	}
	dir, err := os.MkdirTemp("", "tinkerfleet-bench-instructions-*")
	if err != nil {
		return t, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	exe, err := symbolled(ctx, dir, log)
	if err != nil {
		return t, err
	}
	plan := instructionPlan(maxTokens, false)
	per := map[string]map[string]float64{} // side → package → instructions per sample
	for _, side := range []string{"client", "worker"} {
		var counts [2]map[string]uint64
		for i, setupOnly := range []bool{false, true} {
			fmt.Fprintf(log, "bench:   %s under cachegrind (set-up only: %v)\n", side, setupOnly)
			counts[i], err = cachegrind(ctx, exe, dir, side, setupOnly, maxTokens)
			if err != nil {
				return t, fmt.Errorf("%s: %w", side, err)
			}
		}
		samples := float64(plan.warmup + plan.n)
		per[side] = map[string]float64{}
		for _, pkg := range keysOf(counts[0], counts[1]) { // a package may be in one run only
			per[side][pkg] = (float64(counts[0][pkg]) - float64(counts[1][pkg])) / samples
		}
	}
	client, worker := per["client"], per["worker"]
	// total is the instructions of the runtime's packages (runtime) or of all others.
	total := func(m map[string]float64, runtime bool) (sum float64) {
		for pkg, v := range m {
			if isRuntime(pkg) == runtime {
				sum += v
			}
		}
		return sum
	}
	kilo := func(v float64) string { return fmt.Sprintf("%.1fk", v/1e3) }
	t.add(row{Case: "instructions per sample outside the Go runtime", Measured: kilo(total(worker, false)),
		Baseline: kilo(total(client, false)), Ratio: ratio(total(worker, false), total(client, false)), Verdict: verdictInfo})
	pkgs := slices.DeleteFunc(keysOf(worker, client), isRuntime)
	// The packages that make the difference, largest first.
	slices.SortFunc(pkgs, func(a, b string) int {
		return cmp.Compare(math.Abs(worker[b]-client[b]), math.Abs(worker[a]-client[a]))
	})
	for _, pkg := range pkgs[:min(len(pkgs), 14)] {
		t.add(row{Case: "  " + pkg, Measured: kilo(worker[pkg]), Baseline: kilo(client[pkg]),
			Ratio: ratio(worker[pkg], client[pkg]), Verdict: verdictInfo})
	}
	t.add(row{Case: "Go runtime (not comparable under valgrind)", Measured: kilo(total(worker, true)),
		Baseline: kilo(total(client, true)), Ratio: math.NaN(), Verdict: verdictInfo})
	t.note("measured: comparison 2's worker variant (NATS server in a child process); baseline: its client alone; %d warm-up + %d samples each, max_tokens %d", plan.warmup, plan.n, maxTokens)
	t.note("per sample: (run with the samples - run set up only) / samples, by the package of each instruction's function (inlined code counts to its caller)")
	t.note("valgrind --tool=cachegrind --cache-sim=no, GODEBUG=asyncpreemptoff=1; the simulator and the NATS server run natively in child processes")
	return t, nil
}

// cachegrind runs one side of comparison 2 under valgrind and returns its instruction counts
// by package.
func cachegrind(ctx context.Context, exe, dir, side string, setupOnly bool, maxTokens int) (map[string]uint64, error) {
	out := filepath.Join(dir, fmt.Sprintf("cachegrind.%s.%v", side, setupOnly))
	args := []string{"--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=" + out,
		exe, childArg, "-role", "cost", "-side", side, "-setup-only=" + strconv.FormatBool(setupOnly),
		"-max-tokens", strconv.Itoa(maxTokens)}
	cmd := exec.CommandContext(ctx, "valgrind", args...)
	// Go's preemption signals trip valgrind up now and then.
	cmd.Env = append(os.Environ(), "GODEBUG=asyncpreemptoff=1")
	// A helper process ends when its stdin closes: keep it open until the run is over.
	if _, err := cmd.StdinPipe(); err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("valgrind: %w\n%s", err, lastLines(stderr.String(), 20))
	}
	f, err := os.Open(out)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseCachegrind(f)
}

// symbolled returns an executable of this program that has its symbol table, which cachegrind
// needs to name the functions: this one, or, when it has none (go run links with -s -w), one
// that go build makes in dir.
func symbolled(ctx context.Context, dir string, log io.Writer) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("own executable: %w", err)
	}
	if hasSymbols(exe) {
		return exe, nil
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", errors.New("-instructions needs a bench built with its symbols: go build -o bench.bin ./bench && ./bench.bin -instructions")
	}
	fmt.Fprintf(log, "bench:   this executable has no symbols (go run strips them): go build %s\n", bi.Path)
	out := filepath.Join(dir, "bench")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", out, bi.Path).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the bench with its symbols (or: go build -o bench.bin ./bench && ./bench.bin -instructions): %w\n%s", err, b)
	}
	return out, nil
}

// hasSymbols reports whether the ELF executable at path has a symbol table.
func hasSymbols(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.Section(".symtab") != nil
}

// parseCachegrind sums a cachegrind output's instruction counts ("line count" lines under
// "fl=file" and "fn=function" lines) by the package of each function; the runtime's assembly
// (gogo, memmove, ...) by its file.
func parseCachegrind(r io.Reader) (map[string]uint64, error) {
	counts := map[string]uint64{}
	file, pkg := "", ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if fl, ok := strings.CutPrefix(line, "fl="); ok {
			file = fl
			continue
		}
		if fn, ok := strings.CutPrefix(line, "fn="); ok {
			pkg = packageOf(fn)
			if !strings.Contains(fn, ".") && strings.Contains(file, "/src/runtime/") {
				pkg = "runtime" // an assembly body of the runtime's: gogo, memmove, ...
			}
			continue
		}
		if line == "" || line[0] < '0' || line[0] > '9' {
			continue
		}
		_, n, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		c, err := strconv.ParseUint(n, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cachegrind output: %q: %w", line, err)
		}
		counts[pkg] += c
	}
	return counts, sc.Err()
}

// packageOf is the import path of a Go function's symbol ("net/http.(*Transport).dial" →
// "net/http"), or the symbol itself for an assembly body without one ("gcWriteBarrier").
func packageOf(fn string) string {
	slash := strings.LastIndexByte(fn, '/')
	dot := strings.IndexByte(fn[slash+1:], '.')
	if dot < 0 {
		return fn
	}
	pkg := fn[:slash+1+dot]
	if p, err := url.PathUnescape(pkg); err == nil { // "nats%2ego" → "nats.go"
		pkg = p
	}
	return pkg
}

// isRuntime reports whether pkg is the Go runtime's.
func isRuntime(pkg string) bool {
	return pkg == "runtime" || strings.HasPrefix(pkg, "internal/runtime/")
}

// keysOf returns the keys of a and b, each once.
func keysOf[V any](a, b map[string]V) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// runCostSide is the helper process of runInstructions: one side of comparison 2 against a
// simulator (and, for the worker, a NATS server) in child processes of its own.
func runCostSide(ctx context.Context, side string, setupOnly bool, maxTokens int) error {
	sim, err := startChild(ctx, "", "-role", "sim")
	if err != nil {
		return err
	}
	defer func() { _ = sim.stop() }()
	target := simTarget{url: sim.first, pid: sim.cmd.Process.Pid}
	tokens := tokenizer.NewRegistry(tokenizer.Options{Offline: true})
	plan := instructionPlan(maxTokens, setupOnly)
	switch side {
	case "client":
		_, err := clientCost(ctx, target, tokens, plan)
		return err
	case "worker":
		nats, err := startChild(ctx, "", "-role", "nats")
		if err != nil {
			return err
		}
		defer func() { _ = nats.stop() }()
		_, err = workerCost(ctx, nats.first, target, tokens, "instructions", plan)
		return err
	default:
		return fmt.Errorf("unknown side %q", side)
	}
}

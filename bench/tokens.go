package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

// corpusProse and corpusMultilingual are the text parts of internal/tokenizer's benchmark
// corpus (corpus_test.go), reproduced here because test files cannot be imported.
const corpusProse = `The fleet woke before dawn. Each worker pulled a job, looked at the prompt, and counted its tokens
before asking the sampler for more. "We don't guess," said the lead, "we measure." They'd learned that
lesson the hard way: a batch of 40,000 prompts, a context window of 32,768 tokens, and one prompt that
was 1.5 MB of log output. It's the kind of thing you'll only see once... and then you'll see it again.
Numbers matter: 3.14159, 2.71828, 1e-9, -42, 0x1F, 1,000,000 and 12:30 PM are all tokenized differently.
    Indented lines keep their spaces; trailing spaces too.   
Tabs	separate	columns	here.
Windows line endings end this line.` + "\r\n" + `And  double  spaces,   triple   spaces, and a final question?!
I'M SHOUTING, YOU'RE LISTENING, WE'VE WON, THEY'LL SEE, HE'D KNOW, IT'S DONE.
`

const corpusMultilingual = "日本語のテキストも大丈夫です。中文测试：你好，世界！한국어 문장도 있습니다.\n" +
	"Ελληνικά και русский текст, עברית, مرحبا بالعالم, हिन्दी पाठ, ไทย ภาษา.\n" +
	"Emoji 🚀🔥👍🏽 and ZWJ 👨‍👩‍👧 families, flags 🇩🇪🇯🇵, keycaps 1️⃣ #️⃣.\n" +
	"Combining: e\u0301 a\u0308 n\u0303, Ünïcödé àccents çédille naïve café.\n" +
	"Spaces:\u00a0nbsp,\u3000ideographic,\u2003em,\u2009thin, zero\u200bwidth.\n" +
	"Digits: ١٢٣ ४५६ ⅫⅣ ½¾ ²³ 𝟙𝟚𝟛 ０１２３４５６７８９.\n" +
	"Symbols: © ® ™ € £ ¥ ± × ÷ → ← ∀ ∃ ∑ ∫ ≤ ≥ ≠ ∞ «quotes» „low“ ‘single’ — – …\n" +
	"Code: if (x != nil) { return fmt.Errorf(\"%w\", err) } // it's fine\r\n\t\tx := []int{1, 22, 333, 4444, 55555}\n"

// buildCorpus returns a deterministic text of at least size bytes built like the tokenizer
// package's benchmark corpus: prose, CJK/emoji lines and Go source from $GOROOT/src/net/http.
func buildCorpus(size int) (string, error) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOROOT: %w", err)
	}
	goroot := strings.TrimSpace(string(out))
	files, err := filepath.Glob(filepath.Join(goroot, "src", "net", "http", "*.go"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no Go source under GOROOT (%s) for the corpus: %v", goroot, err)
	}
	slices.Sort(files)
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		b.WriteString(corpusProse)
		b.WriteString(corpusMultilingual)
		src, err := os.ReadFile(files[i%len(files)])
		if err != nil {
			return "", fmt.Errorf("corpus: %w", err)
		}
		b.Write(src[:min(len(src), 20000)])
		fmt.Fprintf(&b, "\n%d %d.%d\n", i*7919, i, i*31)
	}
	return b.String(), nil
}

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
	corpus, err := buildCorpus(s.TokBytes)
	if err != nil {
		return t, err
	}
	tok, err := newTokenizer(ctx)
	if err != nil {
		return t, err
	}
	n := len(tok.Encode(corpus)) // warms the piece cache, as a long-running worker's is
	mb := float64(len(corpus)) / 1e6

	one := repeat(ctx, 1, s.TokDuration, func() { tok.Encode(corpus) })
	oneTok := float64(n) * float64(one.runs) / one.elapsed.Seconds()
	fields := repeat(ctx, 1, s.TokDuration, func() { _ = strings.Fields(corpus) })
	oneMB := mb * float64(one.runs) / one.elapsed.Seconds()
	fieldsMB := mb * float64(fields.runs) / fields.elapsed.Seconds()
	t.add(row{Case: "Qwen3 Encode, 1 goroutine, warm cache",
		Measured: fmt.Sprintf("%.2f Mtok/s = %.1f MB/s", oneTok/1e6, oneMB),
		Baseline: fmt.Sprintf("%.1f MB/s strings.Fields", fieldsMB),
		Ratio:    ratio(oneMB, fieldsMB), Verdict: verdictInfo})

	g := runtime.GOMAXPROCS(0)
	par := repeat(ctx, g, s.TokDuration, func() { tok.Encode(corpus) })
	parTok := float64(n) * float64(par.runs) / par.elapsed.Seconds()
	perCPU := float64(n) * float64(par.runs) / par.cpu.Seconds()
	t.add(row{Case: fmt.Sprintf("Qwen3 Encode, %d goroutines (GOMAXPROCS), one shared tokenizer", g),
		Measured: fmt.Sprintf("%.2f Mtok/s", parTok/1e6),
		Baseline: fmt.Sprintf("%.2f Mtok/s x %d", oneTok/1e6, g),
		Ratio:    ratio(parTok, oneTok*float64(g)), Verdict: verdictInfo})
	t.add(row{Case: "Qwen3 Encode per CPU-second (getrusage, parallel run)",
		Measured: fmt.Sprintf("%.2f Mtok/CPU-s", perCPU/1e6),
		Baseline: fmt.Sprintf("%.2f Mtok/s 1 goroutine", oneTok/1e6),
		Ratio:    ratio(perCPU, oneTok), Verdict: verdictInfo})
	t.note("corpus %.2f MB (%d tokens, %.2f bytes/token): prose, CJK/emoji, Go source of $GOROOT/src/net/http, as internal/tokenizer's benchmark",
		mb, n, float64(len(corpus))/float64(n))
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

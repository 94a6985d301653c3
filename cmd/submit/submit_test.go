package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// fleet is a NATS server, a simulator and the workers started on them.
type fleet struct {
	t    *testing.T
	emb  *queue.Embedded
	sim  *tinkersim.Server
	url  string // the simulator's
	qcfg queue.Config
	tok  *tokenizer.Registry
}

func newFleet(t *testing.T, qcfg queue.Config, simCfg tinkersim.Config) *fleet {
	t.Helper()
	f := &fleet{t: t, emb: fleettest.NATS(t), qcfg: qcfg, tok: tokenizer.NewRegistry(tokenizer.Options{Offline: true})}
	f.sim, f.url = fleettest.Sim(t, simCfg)
	return f
}

// startWorker runs a worker on a connection of its own; kill closes that connection at once,
// so the worker's unacked jobs go back to the others only after AckWait, as after a crash.
func (f *fleet) startWorker(concurrency int) (kill func()) {
	t := f.t
	t.Helper()
	q := fleettest.Queue(t, f.emb.ClientURL(), f.qcfg)
	nc := q.JS.Conn()
	w, err := worker.Open(context.Background(), worker.Config{Queue: q, TinkerBaseURL: f.url, TinkerAPIKey: fleettest.APIKey,
		Tokenizers: f.tok, Concurrency: concurrency, ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Run(ctx) })
	var once sync.Once
	kill = func() {
		once.Do(func() {
			nc.Close()
			cancel()
			wg.Wait()
			w.Close()
		})
	}
	t.Cleanup(kill)
	return kill
}

// submit runs the command in-process against the fleet's NATS server.
func (f *fleet) submit(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: &out, stderr: &errb, tty: 0}
	flags := []string{"--nats-url", f.emb.ClientURL()}
	switch args[0] {
	case "status", "results", "cancel", "list":
		args = append(append([]string{args[0]}, flags...), args[1:]...)
	default:
		args = append(append(flags, "--progress", "none"), args...)
	}
	err = run(ctx, args, env)
	return out.String(), errb.String(), err
}

func writeLines(t *testing.T, lines []string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func jobLine(i int) string {
	switch i % 3 {
	case 0:
		return fmt.Sprintf(`{"custom_id":"job-%05d","model":"Qwen/Qwen3-8B","prompt":"Question %d: why is the sky blue?","sampling_params":{"max_tokens":4}}`, i, i)
	case 1:
		return fmt.Sprintf(`{"custom_id":"job-%05d","model":"Qwen/Qwen3-8B","prompt_tokens":[9707,11,%d],"sampling_params":{"max_tokens":4}}`, i, 1000+i)
	default:
		return fmt.Sprintf(`{"custom_id":"job-%05d","method":"POST","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi %d"}],"max_tokens":4}}`, i, i)
	}
}

// readResults reads an output file and fails on a custom id seen twice.
func readResults(t *testing.T, path string) map[string]map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]map[string]any{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		id := r["custom_id"].(string)
		if _, dup := out[id]; dup {
			t.Fatalf("two results for %s in the output", id)
		}
		out[id] = r
	}
	return out
}

func TestTenThousandJobsOverThreeWorkersOneKilled(t *testing.T) {
	t.Parallel()
	const n = 10_000
	f := newFleet(t, queue.Config{AckWait: 2 * time.Second}, tinkersim.Config{Capacity: 512, BaseLatency: 2 * time.Millisecond})
	lines := make([]string, n)
	for i := range lines {
		lines[i] = jobLine(i)
	}
	in := writeLines(t, lines)
	out := filepath.Join(t.TempDir(), "results.jsonl")

	victim := f.startWorker(128)
	f.startWorker(128)
	f.startWorker(128)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, stderr, err := f.submit(ctx, in, "-o", out)
		if err != nil {
			err = fmt.Errorf("%w; stderr: %s", err, stderr)
		}
		done <- err
	}()
	// Kill one worker mid-batch, without acking what it holds.
	for f.sim.Stats().SamplesCompleted < n/4 {
		select {
		case err := <-done:
			t.Fatalf("submit finished before the kill: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	victim()

	if err := <-done; err != nil {
		t.Fatal(err)
	}
	res := readResults(t, out)
	if len(res) != n {
		t.Fatalf("%d results for %d jobs", len(res), n)
	}
	for i := range n {
		r, ok := res[fmt.Sprintf("job-%05d", i)]
		if !ok || r["status"] != "ok" {
			t.Fatalf("job-%05d: %v", i, r)
		}
	}
}

func TestBadInputPublishesNothingUnlessSkipped(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 16})
	dir := t.TempDir()
	in := writeLines(t, []string{
		jobLine(0),
		`{"custom_id":"job-00000","model":"Qwen/Qwen3-8B","prompt":"again"}`,
		`{"custom_id":"x","model":"Qwen/Qwen3-8B","prompt":"a","sampling_params":{"temperature":"hot"}}`,
		"{not json",
		`{"custom_id":"y","model":"Qwen/Qwen3-8B","prompt":"a","colour":"red"}`,
		`{"custom_id":"z","model":"Qwen/Qwen3-8B","prompt":"` + strings.Repeat("a", 2<<20) + `"}`,
		"{\"custom_id\":\"u\",\"model\":\"Qwen/Qwen3-8B\",\"prompt\":\"\xff\xfe\"}",
		jobLine(7),
	})
	ctx := context.Background()

	_, stderr, err := f.submit(ctx, in)
	if !errors.Is(err, errInvalidInput) {
		t.Fatalf("err = %v, want invalid input", err)
	}
	for _, want := range []string{
		in + ":2: field custom_id: duplicate",
		in + ":3: field sampling_params.temperature",
		in + ":4: malformed JSON",
		in + ":5: field colour: unknown field",
		in + ":6: line is longer than the limit",
		in + ":7:",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if q := bind(t, f); jobsIn(t, q) != 0 {
		t.Fatal("jobs were published although lines were invalid")
	}

	rejects := filepath.Join(dir, "rejects.jsonl")
	f.startWorker(8)
	out := filepath.Join(dir, "results.jsonl")
	if _, stderr, err := f.submit(ctx, "--skip-invalid", "--rejects", rejects, in, "-o", out); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	res := readResults(t, out)
	if len(res) != 2 || res["job-00000"]["status"] != "ok" || res["job-00007"]["status"] != "ok" {
		t.Fatalf("results = %v", res)
	}
	data, err := os.ReadFile(rejects)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(data), "\n"); got != 6 || !strings.Contains(string(data), `"field":"colour"`) {
		t.Fatalf("rejects file (%d lines):\n%s", got, data)
	}
}

func TestEmptyFileIsAnError(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	_, stderr, err := f.submit(context.Background(), writeLines(t, []string{""}))
	if !errors.Is(err, errInvalidInput) || !strings.Contains(stderr, "no job lines") {
		t.Fatalf("err = %v, stderr = %s", err, stderr)
	}
}

func TestResubmittingTheSameFilesDoesNotDuplicateWork(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	lines := make([]string, 50)
	for i := range lines {
		lines[i] = jobLine(i)
	}
	in := writeLines(t, lines)
	ctx := context.Background()
	// Submitted twice before any worker runs: the second publishes nothing.
	first, _, err := f.submit(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	second, stderr, err := f.submit(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if first != second || !strings.Contains(stderr, "already submitted") {
		t.Fatalf("batch ids %q and %q; stderr %s", first, second, stderr)
	}
	if got := jobsIn(t, bind(t, f)); got != 50 {
		t.Fatalf("%d jobs in the stream, want 50", got)
	}
	f.startWorker(16)
	out := filepath.Join(t.TempDir(), "results.jsonl")
	if _, stderr, err := f.submit(ctx, in, "-o", out); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	if res := readResults(t, out); len(res) != 50 {
		t.Fatalf("%d results", len(res))
	}
	if got := f.sim.Stats().SamplesAccepted; got != 50 {
		t.Fatalf("the simulator sampled %d times for 50 jobs", got)
	}
	// The same batch id for different input is refused.
	other := writeLines(t, lines[:10])
	if _, _, err := f.submit(ctx, "--batch-id", strings.TrimSpace(first), other); err == nil {
		t.Fatal("a batch id was reused for other input")
	}
}

func TestCancelEndsRemainingJobsWithoutSampling(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	lines := make([]string, 30)
	for i := range lines {
		lines[i] = jobLine(i)
	}
	in := writeLines(t, lines)
	ctx := context.Background()
	batch, _, err := f.submit(ctx, in, "--batch-id", "to-cancel")
	if err != nil || strings.TrimSpace(batch) != "to-cancel" {
		t.Fatalf("%q %v", batch, err)
	}
	if _, _, err := f.submit(ctx, "cancel", "to-cancel"); err != nil {
		t.Fatal(err)
	}
	f.startWorker(8)
	out := filepath.Join(t.TempDir(), "results.jsonl")
	if _, stderr, err := f.submit(ctx, "results", "to-cancel", "-o", out, "--wait"); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	res := readResults(t, out)
	if len(res) != 30 {
		t.Fatalf("%d results", len(res))
	}
	for id, r := range res {
		if r["status"] != "cancelled" {
			t.Fatalf("%s: %v", id, r)
		}
	}
	if got := f.sim.Stats().SamplesAccepted; got != 0 {
		t.Fatalf("%d samples of a cancelled batch were sent", got)
	}
	stdout, _, err := f.submit(ctx, "status", "--json", "to-cancel")
	if err != nil {
		t.Fatal(err)
	}
	var st batchStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != queue.BatchCancelled || st.Cancelled != 30 || st.Results != 30 || st.Waiting != 0 {
		t.Fatalf("status = %+v", st)
	}
	list, _, err := f.submit(ctx, "list")
	if err != nil || !strings.Contains(list, "to-cancel") {
		t.Fatalf("list: %q %v", list, err)
	}
}

func TestInterruptedOutputResumes(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	lines := make([]string, 40)
	for i := range lines {
		lines[i] = jobLine(i)
	}
	in := writeLines(t, lines)
	f.startWorker(16)
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "results.jsonl")
	if _, _, err := f.submit(ctx, in, "-o", out); err != nil {
		t.Fatal(err)
	}
	// Cut the file as an interruption would: 15 whole lines and half of the 16th.
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	cut := 0
	for range 15 {
		cut += bytes.IndexByte(data[cut:], '\n') + 1
	}
	if err := os.WriteFile(out, data[:cut+20], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.submit(ctx, in, "-o", out); err != nil {
		t.Fatal(err)
	}
	if res := readResults(t, out); len(res) != 40 {
		t.Fatalf("%d results after resuming", len(res))
	}
}

func bind(t *testing.T, f *fleet) *queue.Queue {
	t.Helper()
	nc, err := queue.Connect(queue.ConnectConfig{URL: f.emb.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	q, err := queue.Bind(context.Background(), js, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func jobsIn(t *testing.T, q *queue.Queue) uint64 {
	t.Helper()
	info, err := q.Jobs.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func TestSubcommandAfterFlagsGetsAHint(t *testing.T) {
	t.Parallel()
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	err := run(context.Background(), []string{"--nats-url", "nats://127.0.0.1:1", "list"}, env)
	if err == nil || !strings.Contains(err.Error(), "write it first") {
		t.Fatalf("err = %v", err)
	}
}

func TestLocalSimulatedBatchRunsInOneCommand(t *testing.T) {
	t.Parallel()
	// The README's main job: embedded NATS, an in-process worker and the simulator.
	dir := t.TempDir()
	out := filepath.Join(dir, "results.jsonl")
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	args := []string{"--local", "--simulate", "--data-dir", filepath.Join(dir, "data"), "--progress", "none", "../../examples/prompts.jsonl", "-o", out}
	if err := run(context.Background(), args, env); err != nil {
		t.Fatal(err)
	}
	res := readResults(t, out)
	if len(res) != 21 {
		t.Fatalf("%d results for the 21 example lines", len(res))
	}
	for id, r := range res {
		if r["status"] != "ok" {
			t.Fatalf("%s: %v", id, r)
		}
	}
}

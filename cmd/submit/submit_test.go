package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// fleet is a NATS server, a simulator and the workers started on them.
type fleet struct {
	t    *testing.T
	nats string // the NATS server's client URL
	sim  *tinkersim.Server
	url  string // the simulator's
	qcfg queue.Config
	tok  *tokenizer.Registry
}

// builtinTokens is the registry of the built-in tokenizers that the test fleets' workers
// share: loading Qwen3's takes about 5 s of CPU under -race, paid once, not once per fleet.
var builtinTokens = sync.OnceValue(func() *tokenizer.Registry {
	return tokenizer.NewRegistry(tokenizer.Options{Offline: true})
})

func newFleet(t *testing.T, qcfg queue.Config, simCfg tinkersim.Config) *fleet {
	t.Helper()
	f := &fleet{t: t, nats: fleettest.NATS(t).ClientURL(), qcfg: qcfg, tok: builtinTokens()}
	f.sim, f.url = fleettest.Sim(t, simCfg)
	return f
}

// startWorker runs a worker on a connection of its own; kill closes that connection at once,
// so the worker's unacked jobs go back to the others only after AckWait, as after a crash.
func (f *fleet) startWorker(concurrency int) (kill func()) {
	f.t.Helper()
	return f.startWorkerOn(fleettest.Queue(f.t, f.nats, f.qcfg), concurrency)
}

// startWorkerOn runs a worker on q, a connection of its own, as startWorker does.
func (f *fleet) startWorkerOn(q *queue.Queue, concurrency int) (kill func()) {
	f.t.Helper()
	_, kill = f.runWorker(q, concurrency)
	return kill
}

// runWorker runs a worker on q until stop, a clean stop (Run returns, having handed its
// jobs back), or kill, which first closes its connection, as a crash would. Either may be
// called more than once, and one runs at the test's end.
func (f *fleet) runWorker(q *queue.Queue, concurrency int) (stop, kill func()) {
	t := f.t
	t.Helper()
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
	end := func(crash bool) {
		once.Do(func() {
			if crash {
				nc.Close()
			}
			cancel()
			wg.Wait()
			w.Close()
			nc.Close()
		})
	}
	stop, kill = func() { end(false) }, func() { end(true) }
	t.Cleanup(kill)
	return stop, kill
}

// submit runs the command in-process against the fleet's NATS server.
func (f *fleet) submit(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	err = f.submitTo(ctx, &out, &errb, args...)
	return out.String(), errb.String(), err
}

// submitTo is submit writing to stdout and stderr as the command runs.
func (f *fleet) submitTo(ctx context.Context, stdout, stderr io.Writer, args ...string) error {
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: stdout, stderr: stderr, tty: 0}
	flags := []string{"--nats-url", f.nats}
	switch args[0] {
	case "status", "results", "failed", "cancel", "delete", "list":
		args = append(append([]string{args[0]}, flags...), args[1:]...)
	default:
		args = append(append(flags, "--progress", "none"), args...)
	}
	return run(ctx, args, env)
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

// jobLines returns n job lines, jobLine(0) to jobLine(n-1).
func jobLines(n int) []string {
	lines := make([]string, n)
	for i := range lines {
		lines[i] = jobLine(i)
	}
	return lines
}

// lineStatus is the status of an output line: the status of a tinkerfleet result line or, for
// an OpenAI Batch output line, ok (response with status 200), cancelled (no response, error
// batch_cancelled) or error.
func lineStatus(t *testing.T, r map[string]any) string {
	t.Helper()
	if st, ok := r["status"].(string); ok {
		return st
	}
	resp, _ := r["response"].(map[string]any)
	e, _ := r["error"].(map[string]any)
	switch {
	case resp != nil && e == nil && resp["status_code"] == 200.0:
		return "ok"
	case resp == nil && e != nil && e["code"] == "batch_cancelled":
		return "cancelled"
	case (resp == nil) == (e == nil):
		t.Fatalf("neither a result line nor an OpenAI batch output line: %v", r)
	}
	return "error"
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

// wantResults reads the output file at path and fails unless it holds n results (no custom
// id twice), each of status (see lineStatus).
func wantResults(t *testing.T, path string, n int, status string) {
	t.Helper()
	res := readResults(t, path)
	if len(res) != n {
		t.Fatalf("%d results in %s, want %d", len(res), path, n)
	}
	for id, r := range res {
		if lineStatus(t, r) != status {
			t.Fatalf("%s: %v, want %s", id, r, status)
		}
	}
}

func TestTenThousandJobsOverThreeWorkersOneKilled(t *testing.T) {
	t.Parallel()
	const n = 10_000
	f := newFleet(t, queue.Config{AckWait: 2 * time.Second}, tinkersim.Config{Capacity: 512, BaseLatency: 2 * time.Millisecond})
	lines := jobLines(n)
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
		if !ok || lineStatus(t, r) != "ok" {
			t.Fatalf("job-%05d: %v", i, r)
		}
	}
}

// TestReadingResultsCreatesTwoConsumers: status and results read a batch's results through
// one ordered consumer, plus one that only counts them, however many there are. They read in
// fetches of 1024 before, and a fetch on an ordered consumer replaces the consumer on the
// server, which counts the new one's pending results over the batch's subjects: time
// quadratic in the batch (status on 200,000 results took 4.1 s, 1.3 s now).
func TestReadingResultsCreatesTwoConsumers(t *testing.T) {
	t.Parallel()
	const n = 3000
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 512, BaseLatency: time.Millisecond})
	lines := jobLines(n)
	in := writeLines(t, lines)
	f.startWorker(256)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	stdout, stderr, err := f.submit(ctx, in, "--wait")
	if err != nil {
		t.Fatalf("%v; stderr: %s", err, stderr)
	}
	batch := strings.TrimSpace(stdout)

	q := bind(t, f)
	creates := make(chan *nats.Msg, 1024) // never full: nats.go drops what a full one cannot take
	sub, err := q.JS.Conn().ChanSubscribe("$JS.API.CONSUMER.CREATE."+q.Names.ResultsStream()+".>", creates)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := q.JS.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	counted := func(command string) int {
		t.Helper()
		k := 0
		takeRequests(t, q.JS.Conn(), creates, func() string { return fmt.Sprintf("%s's 2 consumers: %d created", command, k) },
			func() bool { return k >= 2 }, func(*nats.Msg) { k++ })
		return k
	}

	out := filepath.Join(t.TempDir(), "results.jsonl")
	if _, stderr, err := f.submit(ctx, "results", batch, "-o", out); err != nil {
		t.Fatalf("results: %v; stderr: %s", err, stderr)
	}
	if res := readResults(t, out); len(res) != n {
		t.Fatalf("results wrote %d of %d", len(res), n)
	}
	if k := counted("results"); k != 2 {
		t.Fatalf("results created %d consumers on the results stream for %d results, want 2", k, n)
	}
	stdout, _, err = f.submit(ctx, "status", batch, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var st batchStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil || st.Results != n || !st.Done || st.Activity != "" {
		t.Fatalf("status %s: %+v, %v", stdout, st, err)
	}
	if k := counted("status"); k != 2 {
		t.Fatalf("status created %d consumers on the results stream for %d results, want 2", k, n)
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
		`{"custom_id":"z","model":"Qwen/Qwen3-8B","prompt":"` + strings.Repeat("a", 9<<20) + `"}`,
		"{\"custom_id\":\"u\",\"model\":\"Qwen/Qwen3-8B\",\"prompt\":\"\xff\xfe\"}",
		jobLine(7),
		`{"custom_id":"c","model":"moonshotai/Kimi-K2-Thinking","messages":[{"role":"user","content":"hi"}]}`,
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
		in + `:9: field model: no chat template for model "moonshotai/Kimi-K2-Thinking"`,
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
	if len(res) != 2 || lineStatus(t, res["job-00000"]) != "ok" || lineStatus(t, res["job-00007"]) != "ok" {
		t.Fatalf("results = %v", res)
	}
	data, err := os.ReadFile(rejects)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(data), "\n"); got != 7 || !strings.Contains(string(data), `"field":"colour"`) {
		t.Fatalf("rejects file (%d lines):\n%s", got, data)
	}
	// Made as os.Create makes a file (the umask decides), as the results are: not 0600.
	made, err := os.Create(filepath.Join(dir, "made.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	made.Close()
	want, _ := os.Stat(made.Name())
	if got, err := os.Stat(rejects); err != nil || got.Mode().Perm() != want.Mode().Perm() {
		t.Fatalf("rejects file mode %v (%v), want %v as os.Create makes", got.Mode().Perm(), err, want.Mode().Perm())
	}
	// A later run with no line to reject empties it: a script reads no earlier run's rejects
	// as its own.
	if _, stderr, err := f.submit(ctx, "--skip-invalid", "--rejects", rejects, writeLines(t, jobLines(2)), "-o", filepath.Join(dir, "valid.jsonl")); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	if data, err := os.ReadFile(rejects); err != nil || len(data) != 0 {
		t.Fatalf("rejects file after a run with no invalid line: %q (%v), want it empty", data, err)
	}
}

// TestTheDefaultRejectsFileIsMadeOnlyForRejects: BATCH.rejects.jsonl is written when a line
// was rejected, emptied when an earlier run left one, and not made for nothing.
func TestTheDefaultRejectsFileIsMadeOnlyForRejects(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tmp := func(content string) *os.File {
		f, err := os.CreateTemp(dir, ".rejects-*")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(content); err != nil {
			t.Fatal(err)
		}
		return f
	}
	path := filepath.Join(dir, "b-1.rejects.jsonl")
	if err := writeRejects(tmp(""), path, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("no line rejected, and %s was made (%v)", path, err)
	}
	for _, c := range []struct {
		content  string
		rejected bool
	}{{"{\"line\":1}\n", true}, {"", false}} {
		if err := writeRejects(tmp(c.content), path, false, c.rejected); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(path); err != nil || string(data) != c.content {
			t.Fatalf("rejected %v: %s holds %q (%v), want %q", c.rejected, path, data, err, c.content)
		}
	}
}

// TestARejectsFileThroughALinkIsWrittenWhereItPoints: --rejects naming a symbolic link writes
// the file the link points to, in another directory here, and leaves the link a link.
func TestARejectsFileThroughALinkIsWrittenWhereItPoints(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	real := filepath.Join(t.TempDir(), "rejects.jsonl")
	link := filepath.Join(t.TempDir(), "link.jsonl")
	if err := os.WriteFile(real, []byte("an earlier run's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Skipf("no symbolic links here: %v", err)
	}
	_, stderr, err := f.submit(context.Background(), "--skip-invalid", "--rejects", link, writeLines(t, []string{`{"custom_id":"a"}`}))
	if !errors.Is(err, errInvalidInput) {
		t.Fatalf("a file of one invalid line: %v, want no valid lines: %s", err, stderr)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link is no longer a link (%v)", err)
	}
	if data, err := os.ReadFile(real); err != nil || !strings.Contains(string(data), `"line":1`) {
		t.Errorf("the file the link points to holds %q (%v), want the rejected line", data, err)
	}
}

// TestARejectsFileKeepsItsMode: a rejects file written again keeps the mode its user gave it
// (0600, for prompts kept private), as a results file mended after a crash does; it was made
// anew 0644 (less the umask), readable by all.
func TestARejectsFileKeepsItsMode(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	rejects := filepath.Join(t.TempDir(), "rejects.jsonl")
	if err := os.WriteFile(rejects, []byte("an earlier run's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := f.submit(context.Background(), "--skip-invalid", "--rejects", rejects, writeLines(t, []string{`{"custom_id":"a"}`})); !errors.Is(err, errInvalidInput) {
		t.Fatalf("a file of one invalid line: %v, want no valid lines: %s", err, stderr)
	}
	fi, err := os.Stat(rejects)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the rejects file is %v, want 0600 as its user made it", fi.Mode().Perm())
	}
	if data, _ := os.ReadFile(rejects); !strings.Contains(string(data), `"line":1`) {
		t.Errorf("the rejects file holds %q, want the rejected line", data)
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

// TestABatchCommandWithoutABatchIdSaysWhereToFindOne: a batch command without its batch id
// says where the ids are, in a line, rather than print every flag; with two ids it shows the
// usage. list takes no batch id.
func TestABatchCommandWithoutABatchIdSaysWhereToFindOne(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"status", "results", "failed", "cancel", "delete"} {
		var stderr bytes.Buffer
		env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr}
		err := run(context.Background(), []string{name, "--data-dir", t.TempDir()}, env)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), name+" needs a batch id (submit list shows them") || stderr.Len() != 0 {
			t.Errorf("submit %s without a batch id: %v, and printed %q", name, err, stderr.String())
		}
		stderr.Reset()
		err = run(context.Background(), []string{name, "--data-dir", t.TempDir(), "b-1", "b-2"}, env)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), name+` takes one batch id, not ["b-1" "b-2"]`) || !strings.Contains(stderr.String(), "usage: submit "+name) {
			t.Errorf("submit %s with two batch ids: %v, and printed %q", name, err, stderr.String())
		}
	}
	// list takes none, and reads its flags' environment as the others do.
	env := quietEnv()
	if err := run(context.Background(), []string{"list", "--data-dir", t.TempDir(), "b-1", "--json"}, env); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), `list takes no arguments, not ["b-1"]`) {
		t.Errorf("submit list b-1: %v", err)
	}
	env.getenv = func(k string) string { return map[string]string{"TINKERFLEET_MAX_DELIVER": "ten"}[k] }
	if err := run(context.Background(), []string{"list", "--data-dir", t.TempDir()}, env); err == nil || !strings.Contains(err.Error(), "TINKERFLEET_MAX_DELIVER") {
		t.Errorf("submit list with a malformed environment: %v", err)
	}
}

// TestCommandsWhereNothingWasSubmittedSaySoAndMakeNoStore: status or list run in a folder
// where nothing was submitted (the wrong working directory) say so, rather than "no such
// batch" from a store they made there.
func TestCommandsWhereNothingWasSubmittedSaySoAndMakeNoStore(t *testing.T) {
	t.Parallel()
	env := quietEnv()
	data := filepath.Join(t.TempDir(), "nothing-here")
	for _, args := range [][]string{{"status", "--data-dir", data, "b-1"}, {"list", "--data-dir", data}} {
		err := run(context.Background(), args, env)
		if !errors.Is(err, queue.ErrNoDataDir) || !strings.Contains(err.Error(), "nothing was submitted here; run this in the folder the batch was submitted from, or give its --data-dir") {
			t.Errorf("submit %s: %v", args[0], err)
		}
		if _, err := os.Stat(data); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("submit %s made %s (%v)", args[0], data, err)
		}
	}
}

// TestAFileGivenTwiceIsRefused: the same file twice, under its name or through a link, is
// refused before anything is read, naming it; two files of the same size are not the same.
func TestAFileGivenTwiceIsRefused(t *testing.T) {
	t.Parallel()
	env := quietEnv()
	a := writeLines(t, []string{jobLine(0)})
	link := filepath.Join(t.TempDir(), "link.jsonl")
	if err := os.Symlink(a, link); err != nil {
		t.Skipf("no symbolic links here: %v", err)
	}
	for _, c := range []struct {
		files []string
		want  string
	}{
		{[]string{a, a}, "input " + a + " is given twice: give each file once"},
		{[]string{a, link}, "input " + link + " is given twice (also as " + a + "): give each file once"},
	} {
		err := run(context.Background(), append([]string{"--dry-run"}, c.files...), env)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("submit %v: %v; want %q", c.files, err, c.want)
		}
	}
	// Another file of the same size, its lines' custom ids apart, is another file.
	b := writeLines(t, []string{strings.Replace(jobLine(0), "job-", "jab-", 1)})
	if err := run(context.Background(), []string{"--dry-run", a, b}, env); err != nil {
		t.Errorf("submit of two files of one size: %v", err)
	}
}

// TestAnOutputFileOfOtherLinesIsRefusedBeforePublishing: an -o file that is an input file, or
// holds a line that is no result or a result of another batch, on its first line or further
// on, is refused before a job is published, and is left as it was. Such a file was found out
// only once the batch was published, and was being sampled.
func TestAnOutputFileOfOtherLinesIsRefusedBeforePublishing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	in := writeLines(t, jobLines(3))
	link := filepath.Join(t.TempDir(), "link.jsonl")
	if err := os.Symlink(in, link); err != nil {
		t.Fatal(err)
	}
	notes := filepath.Join(t.TempDir(), "notes.jsonl")
	if err := os.WriteFile(notes, []byte("{\"note\": \"keep me\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Files that start with a result of the batch, and go on with what is not one of its.
	mine := `{"custom_id":"job-00000","batch_id":"mine","status":"ok"}` + "\n"
	laterNote := filepath.Join(t.TempDir(), "later-note.jsonl")
	laterOther := filepath.Join(t.TempDir(), "later-other.jsonl")
	for path, text := range map[string]string{
		laterNote:  mine + "not a result\n",
		laterOther: mine + `{"custom_id":"job-00001","batch_id":"other","status":"ok"}` + "\n",
	} {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		output string
		want   string
		is     error
	}{
		{in, "-o " + in + " is the input file " + in + ": give the output a file of its own", errUsage},
		{link, "-o " + link + " is the input file " + in, errUsage},
		{notes, notes + " holds a line that is not a result (line 1); give another -o file", errNotResults},
		{laterNote, laterNote + " holds a line that is not a result (line 2); give another -o file", errNotResults},
		{laterOther, "job-00001", errOtherBatch},
	} {
		before, err := os.ReadFile(c.output)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = f.submit(context.Background(), in, "--batch-id", "mine", "-o", c.output)
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("submit -o %s: %v; want %q", c.output, err, c.want)
		}
		if after, _ := os.ReadFile(c.output); !bytes.Equal(after, before) {
			t.Errorf("submit -o %s changed it", c.output)
		}
	}
	if n := jobsIn(t, bind(t, f)); n != 0 {
		t.Fatalf("%d jobs published for results that could not be written", n)
	}
}

// TestARejectsFileOfItsOwnIsRequired: --rejects naming an input file renamed the rejects over
// it before publishing (the input was gone, the batch stayed publishing for ever), and naming
// the -o file replaced the results. Both are refused before anything is read or written.
func TestARejectsFileOfItsOwnIsRequired(t *testing.T) {
	t.Parallel()
	env := quietEnv()
	in := writeLines(t, append(jobLines(2), `{"custom_id":"bad"}`))
	out := filepath.Join(t.TempDir(), "out.jsonl")
	if err := os.WriteFile(out, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dry-run", "--skip-invalid", "--rejects", in, in}, "--rejects " + in + " is the input file " + in},
		{[]string{"--skip-invalid", "--rejects", out, in, "-o", out}, "--rejects " + out + " is also -o"},
		{[]string{"--skip-invalid", "--rejects", "new.jsonl", in, "-o", "./new.jsonl"}, "--rejects new.jsonl is also -o"},
	} {
		if err := run(context.Background(), c.args, env); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("submit %q: %v, want %q", c.args, err, c.want)
		}
	}
	if after, _ := os.ReadFile(in); !bytes.Equal(after, before) {
		t.Fatalf("the input was changed:\n%s", after)
	}
}

// halfPublish leaves batch as a submit killed while publishing leaves it: its manifest
// publishing, with every line of in counted, and only its first n jobs published.
func halfPublish(t *testing.T, q *queue.Queue, batch, in string, n int) {
	t.Helper()
	ctx := context.Background()
	scan, err := validate(ctx, []string{in}, jobs.Limits{}, newPassProgress(progressOptions{mode: "none"}, &environment{stderr: io.Discard}, "validating", "lines", 0), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := queue.Manifest{BatchID: batch, Status: queue.BatchPublishing, Files: []string{in}, Digest: scan.digest,
		Jobs: scan.accepted, CreatedAt: time.Now().UTC()}
	if _, err := q.PutManifest(ctx, m, 0); err != nil {
		t.Fatal(err)
	}
	published := 0
	err = eachJob([]string{in}, jobs.Limits{}, nil, nil, func(j jobs.Job, _ []byte, _ lineAt, err error) error {
		if err != nil || published == n {
			return err
		}
		published++
		data, err := j.Encode()
		if err != nil {
			return err
		}
		f, err := q.PublishJobAsync(batch, j.CustomID, data, false)
		if err != nil {
			return err
		}
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestACancelBeforeTheBatchWasAllPublishedGivesEveryJobALine: a submit killed while
// publishing leaves its batch publishing; the user cancels it and runs the same command again.
// The jobs never published got no line, and the run failed saying their results were removed
// from the server, which nobody did. They are published now, and ended as cancelled.
func TestACancelBeforeTheBatchWasAllPublishedGivesEveryJobALine(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := writeLines(t, jobLines(6))
	halfPublish(t, bind(t, f), "half", in, 3)
	if _, stderr, err := f.submit(ctx, "cancel", "half"); err != nil {
		t.Fatalf("cancel: %v: %s", err, stderr)
	}
	f.startWorker(4)
	q := bind(t, f)
	for { // the 3 jobs published end as cancelled
		if n, err := q.ResultsStored(ctx, "half"); err != nil || n == 3 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status, _, _ := f.submit(ctx, "status", "half"); strings.Contains(status, "removed from the NATS server") || !strings.Contains(status, "run the same submit command again") {
		t.Errorf("status of the 3 jobs never published:\n%s", status)
	}
	out := filepath.Join(t.TempDir(), "results.jsonl")
	_, stderr, err := f.submit(ctx, in, "--batch-id", "half", "-o", out)
	data, _ := os.ReadFile(out)
	lines := outputLines(t, data)
	if err != nil || len(lines) != 6 {
		t.Fatalf("the same command run again after the cancel: %d lines of 6 jobs, %v\n%s", len(lines), err, stderr)
	}
	for id, line := range lines {
		if !bytes.Contains(line, []byte(`"status":"cancelled"`)) && !bytes.Contains(line, []byte(`"code":"batch_cancelled"`)) { // native, OpenAI
			t.Errorf("%s: %s, want cancelled", id, line)
		}
	}
	if n := f.sim.Stats().SamplesAccepted; n != 0 {
		t.Errorf("%d samples of a cancelled batch", n)
	}
	m, _, err := bind(t, f).GetManifest(ctx, "half")
	if err != nil || m.Status != queue.BatchCancelled || m.SubmittedAt.IsZero() {
		t.Errorf("manifest %+v, %v: want cancelled, and wholly published", m, err)
	}
}

// TestACancelDuringPublishingIsNotAHalfPublish: a cancel that lands while a submit publishes
// makes the submit's last manifest write lose its race; the submit still published every job,
// and says so in the cancelled manifest. Without that the rerun took the batch for one cancelled
// half published, and published all of it again.
func TestACancelDuringPublishingIsNotAHalfPublish(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := writeLines(t, jobLines(20000))
	q := bind(t, f)
	published := make(chan error, 1)
	go func() {
		_, stderr, err := f.submit(ctx, in, "--batch-id", "race")
		if err != nil {
			err = fmt.Errorf("%w: %s", err, stderr)
		}
		published <- err
	}()
	for { // cancel while it publishes
		if m, _, err := q.GetManifest(ctx, "race"); err == nil && m.Status == queue.BatchPublishing {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if _, stderr, err := f.submit(ctx, "cancel", "race"); err != nil {
		t.Fatalf("cancel: %v: %s", err, stderr)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	m, _, err := q.GetManifest(ctx, "race")
	if err != nil {
		t.Fatal(err)
	}
	if m.Status != queue.BatchCancelled || m.SubmittedAt.IsZero() {
		t.Fatalf("manifest %s, submitted at %v: want cancelled, and wholly published", m.Status, m.SubmittedAt)
	}
	if _, stderr, err := f.submit(ctx, in, "--batch-id", "race"); err != nil || !strings.Contains(stderr, "not publishing it again") {
		t.Fatalf("the same command again: %v: %s", err, stderr)
	}
}

func TestResubmittingTheSameFilesDoesNotDuplicateWork(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	lines := jobLines(50)
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
	// It says so, and not that it submitted the jobs.
	if first != second || !strings.Contains(stderr, "already submitted") || strings.Contains(stderr, "jobs submitted") {
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
	lines := jobLines(30)
	in := writeLines(t, lines)
	ctx := context.Background()
	batch, _, err := f.submit(ctx, in, "--batch-id", "to-cancel")
	if err != nil || strings.TrimSpace(batch) != "to-cancel" {
		t.Fatalf("%q %v", batch, err)
	}
	if _, _, err := f.submit(ctx, "cancel", "to-cancel"); err != nil {
		t.Fatal(err)
	}
	if stdout, _, err := f.submit(ctx, "status", "to-cancel"); err != nil || !strings.Contains(stdout, "cancelled: 30 jobs without a result yet") {
		t.Fatalf("status before any worker: %v\n%s", err, stdout)
	}
	if list, _, err := f.submit(ctx, "list"); err != nil || !regexp.MustCompile(`(?m)^to-cancel +cancelled +30 +0 +no `).MatchString(list) {
		t.Fatalf("list before any worker: %v, want to-cancel without results, not done:\n%s", err, list)
	}
	// Submitted again, it says when it was submitted and when cancelled (a day apart here).
	m, err := bind(t, f).UpdateManifest(ctx, "to-cancel", func(m *queue.Manifest) error {
		m.CancelledAt = m.CreatedAt.Add(24 * time.Hour)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("batch to-cancel was already submitted on %s, and cancelled on %s: not publishing it again",
		m.CreatedAt.Local().Format(time.DateTime), m.CancelledAt.Local().Format(time.DateTime))
	if _, stderr, err := f.submit(ctx, in, "--batch-id", "to-cancel"); err != nil || !strings.Contains(stderr, want) {
		t.Fatalf("submitted again: %v, said %q; want %q", err, stderr, want)
	}
	f.startWorker(8)
	out := filepath.Join(t.TempDir(), "results.jsonl")
	if _, stderr, err := f.submit(ctx, "results", "to-cancel", "-o", out, "--wait"); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	wantResults(t, out, 30, "cancelled")
	// Reading the file again counts what it holds, OpenAI lines (a third of the jobs) included.
	if _, stderr, err := f.submit(ctx, "results", "to-cancel", "-o", out); err != nil ||
		!strings.Contains(stderr, "30 of 30 results (0 ok, 0 error, 30 cancelled)") {
		t.Fatalf("results again: %v: %s", err, stderr)
	}
	if again := readResults(t, out); len(again) != 30 {
		t.Fatalf("%d results after reading again", len(again))
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
	if st.Status != queue.BatchCancelled || st.Cancelled != 30 || st.Results != 30 || st.Waiting != 0 || !st.Done {
		t.Fatalf("status = %+v", st)
	}
	if stdout, _, err := f.submit(ctx, "status", "to-cancel"); err != nil || !strings.Contains(stdout, "cancelled: done, every job has its result") {
		t.Fatalf("status at the end: %v\n%s", err, stdout)
	}
	list, _, err := f.submit(ctx, "list")
	if err != nil || !regexp.MustCompile(`(?m)^to-cancel +cancelled +30 +30 +yes +0 `).MatchString(list) {
		t.Fatalf("list: %v, want to-cancel with its 30 results, done:\n%s", err, list)
	}
	list, _, err = f.submit(ctx, "list", "--json")
	var listed listedBatch
	if err == nil {
		err = json.Unmarshal([]byte(list), &listed)
	}
	if err != nil || listed.BatchID != "to-cancel" || listed.Results != 30 || !listed.Done {
		t.Fatalf("list --json: %v, %+v", err, listed)
	}
}

// TestListCountsBatchesAtOnce lists 12 batches and watches, in the order the server got them,
// the requests that create and delete list's counting consumers: counts overlap (a remote
// server's round trips add up otherwise), at most listCounters at once, and each is removed.
func TestListCountsBatchesAtOnce(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const batches = 12
	for b := range batches {
		if _, stderr, err := f.submit(ctx, writeLines(t, []string{jobLine(b)})); err != nil {
			t.Fatalf("%v; stderr: %s", err, stderr)
		}
	}
	q := bind(t, f)
	requests := make(chan *nats.Msg, 64*batches) // never full: nats.go drops what a full one cannot take
	stream := q.Names.ResultsStream()
	sub, err := q.JS.Conn().ChanSubscribe("$JS.API.CONSUMER.>", requests)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := q.JS.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	list, _, err := f.submit(ctx, "list")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(list, " submitted "); got != batches {
		t.Fatalf("list shows %d submitted batches, want %d:\n%s", got, batches, list)
	}
	open, most, created := 0, 0, 0
	takeRequests(t, q.JS.Conn(), requests,
		func() string {
			return fmt.Sprintf("list's %d counting consumers: %d created, %d not deleted", batches, created, open)
		},
		func() bool { return created >= batches && open <= 0 },
		func(m *nats.Msg) {
			switch {
			case strings.HasPrefix(m.Subject, "$JS.API.CONSUMER.CREATE."+stream+"."):
				open++
				created++
				most = max(most, open)
			case strings.HasPrefix(m.Subject, "$JS.API.CONSUMER.DELETE."+stream+"."):
				open--
			}
		})
	if created != batches || open != 0 {
		t.Errorf("list created %d counting consumers and left %d, want %d and none", created, open, batches)
	}
	if most < 2 || most > listCounters {
		t.Errorf("list counted %d batches at most at once, want 2 to %d", most, listCounters)
	}
}

func TestInterruptedOutputResumes(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	lines := jobLines(40)
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
	nc, err := queue.Connect(queue.ConnectConfig{URL: f.nats})
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

// TestCancellingADoneBatchChangesNothing: a batch whose jobs all have results is left as it
// is (cancelling it would label its results' batch cancelled for nothing).
func TestCancellingADoneBatchChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	f.startWorker(4)
	ctx := context.Background()
	in := writeLines(t, []string{jobLine(0), jobLine(1), jobLine(2)})
	if _, stderr, err := f.submit(ctx, in, "--batch-id", "finished", "-o", filepath.Join(t.TempDir(), "out.jsonl")); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	_, stderr, err := f.submit(ctx, "cancel", "finished")
	if err != nil || !strings.Contains(stderr, "batch finished is done (every job has its result): nothing to cancel") {
		t.Fatalf("cancel: %v: %s", err, stderr)
	}
	if stdout, _, err := f.submit(ctx, "status", "finished"); err != nil || !strings.Contains(stdout, "submitted: done") {
		t.Fatalf("status after cancelling a done batch: %v\n%s", err, stdout)
	}
}

// TestZeroDurationsAreRefused: a 0 is refused rather than read as "at once": --progress-interval
// 0 printed a line for every result, and --store-wait 0 gave up on the first full stream.
func TestZeroDurationsAreRefused(t *testing.T) {
	t.Parallel()
	env := quietEnv()
	for _, flag := range []string{"--progress-interval", "--store-wait"} {
		err := run(context.Background(), []string{"--dry-run", flag, "0s", "../../examples/prompts.jsonl"}, env)
		if err == nil || !strings.Contains(err.Error(), flag[1:]+": must be a positive duration") {
			t.Errorf("%s 0s: %v", flag, err)
		}
	}
}

func TestSubcommandAfterFlagsGetsAHint(t *testing.T) {
	t.Parallel()
	env := quietEnv()
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
	var stderr bytes.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr}
	args := []string{"--local", "--simulate", "--data-dir", filepath.Join(dir, "data"), "--progress", "none", "../../examples/prompts.jsonl", "-o", out}
	if err := run(context.Background(), args, env); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr.String(), "level=") {
		t.Fatalf("a clean run logged:\n%s", stderr.String())
	}
	wantResults(t, out, 21, "ok") // the 21 example lines
}

// TestALocalRunLeavesAFleetsNATSSettingsAside: a shell set up for a fleet (its TLS CA and
// credentials in NATS_TLS_CA and NATS_CREDS) runs a local batch and its status on the
// embedded server, which asks for neither: it failed with "secure connection not available",
// or on a credentials file of another machine.
func TestALocalRunLeavesAFleetsNATSSettingsAside(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	vars := map[string]string{"NATS_TLS_CA": filepath.Join(dir, "fleet-ca.pem"), "NATS_CREDS": filepath.Join(dir, "fleet.creds")}
	env := &environment{getenv: func(k string) string { return vars[k] }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	data, out := filepath.Join(dir, "data"), filepath.Join(dir, "results.jsonl")
	if err := run(context.Background(), []string{"--local", "--simulate", "--data-dir", data, "--progress", "none", "--batch-id", "sim-fleet-env", "../../examples/prompts.jsonl", "-o", out}, env); err != nil {
		t.Fatal(err)
	}
	wantResults(t, out, 21, "ok")
	if err := run(context.Background(), []string{"status", "--data-dir", simulatedDataDir(data), "sim-fleet-env"}, env); err != nil {
		t.Fatalf("status: %v", err)
	}
}

// TestARealRunAfterASimulatedOneSamplesAgain: the README's first command samples on the
// simulator; the same command without --simulate must sample on the service, not take the
// simulated batch (same input, same batch id) for done and write the simulator's text as its
// results. Simulated batches keep a store of their own.
func TestARealRunAfterASimulatedOneSamplesAgain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	quiet := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	simulated := filepath.Join(dir, "simulated.jsonl")
	if err := run(context.Background(), []string{"--local", "--simulate", "--data-dir", data, "--progress", "none", "../../examples/prompts.jsonl", "-o", simulated}, quiet); err != nil {
		t.Fatal(err)
	}
	service, url := fleettest.Sim(t, tinkersim.Config{})
	real := *quiet
	real.getenv = tinkerAt(url)
	// The simulated run's -o holds another batch (sim-…): it is refused, and left as it is.
	before, err := os.ReadFile(simulated)
	if err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"--local", "--data-dir", data, "--progress", "none", "../../examples/prompts.jsonl", "-o", simulated}, &real)
	if !errors.Is(err, errOtherBatch) {
		t.Fatalf("the real run with the simulated run's -o: %v, want it refused", err)
	}
	if after, _ := os.ReadFile(simulated); !bytes.Equal(after, before) {
		t.Fatal("the simulated run's results file was changed")
	}
	out := filepath.Join(dir, "results.jsonl")
	if err := run(context.Background(), []string{"--local", "--data-dir", data, "--progress", "none", "../../examples/prompts.jsonl", "-o", out}, &real); err != nil {
		t.Fatal(err)
	}
	wantResults(t, out, 21, "ok")
	if got := service.Stats().SamplesCompleted; got < 21 {
		t.Fatalf("the service sampled %d times for 21 jobs: the real run took the simulated results", got)
	}
	// The commands on one batch find a simulated batch in its store by its id.
	var simID string // from a native result line (an OpenAI one has no batch_id)
	for line := range bytes.Lines(before) {
		var r struct {
			BatchID string `json:"batch_id"`
		}
		if err := json.Unmarshal(line, &r); err == nil && r.BatchID != "" {
			simID = r.BatchID
			break
		}
	}
	if !strings.HasPrefix(simID, simulatedBatchPrefix) {
		t.Fatalf("the simulated batch is %q, want an id that says so", simID)
	}
	// list shows both, the simulated one by its sim- id.
	if got := listedIDs(t, data); len(got) != 2 || !slices.Contains(got, simID) || strings.HasPrefix(got[0], simulatedBatchPrefix) {
		t.Errorf("list: %q, want the real batch and then %s", got, simID)
	}
	var status bytes.Buffer
	statusEnv := *quiet
	statusEnv.stdout = &status
	if err := run(context.Background(), []string{"status", "--data-dir", data, "--json", simID}, &statusEnv); err != nil {
		t.Fatalf("status of the simulated batch: %v", err)
	}
	var st batchStatus
	if err := json.Unmarshal(status.Bytes(), &st); err != nil || st.BatchID != simID || st.OK != 21 {
		t.Fatalf("status of the simulated batch: %s (%v), want %s with 21 ok", status.String(), err, simID)
	}
}

// TestSimulatedRunsSayWhereTheyAre: --simulate with --nats-url alone is refused (the fleet's
// workers would sample on the real service), and a command run where only simulated batches
// were submitted says where their store is.
func TestSimulatedRunsSayWhereTheyAre(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	env := quietEnv()
	err := run(context.Background(), []string{"--simulate", "--nats-url", "nats://127.0.0.1:1", "../../examples/prompts.jsonl"}, env)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--simulate samples in this process") {
		t.Fatalf("--simulate with --nats-url: %v, want a refusal", err)
	}
	// A local batch's id says which store it is in: the commands on one batch look for a
	// sim-… batch in the simulated one.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--local", "--batch-id", "sim-eval"}, "names a --simulate batch"},
		{[]string{"--local", "--simulate", "--batch-id", "eval"}, `a --simulate batch's id begins with "sim-"`},
	} {
		args := append(append(c.args, "--data-dir", data, "--dry-run"), "../../examples/prompts.jsonl")
		if err := run(context.Background(), args, env); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a refusal saying %s", c.args, err, c.want)
		}
	}
	if err := run(context.Background(), []string{"--local", "--simulate", "--data-dir", data, "--progress", "none", "../../examples/prompts.jsonl"}, env); err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"status", "--data-dir", data, "b-0123456789abcdef"}, env)
	if !errors.Is(err, queue.ErrNoDataDir) || !strings.Contains(err.Error(), "--simulate runs keep theirs in "+simulatedDataDir(data)) {
		t.Fatalf("status of a real batch where only a simulated run was: %v, want it to name the simulated store", err)
	}
	// list lists the simulated batches, here the only ones.
	if got := listedIDs(t, data); len(got) != 1 || !strings.HasPrefix(got[0], simulatedBatchPrefix) {
		t.Fatalf("list where only a simulated run was: %q, want its batch", got)
	}
}

// listedIDs runs submit list --json on the local store data and returns the batch ids listed.
func listedIDs(t *testing.T, data string) []string {
	t.Helper()
	var out bytes.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: &out, stderr: io.Discard}
	if err := run(context.Background(), []string{"list", "--json", "--data-dir", data}, env); err != nil {
		t.Fatalf("list: %v", err)
	}
	var ids []string
	for line := range bytes.Lines(out.Bytes()) {
		var b listedBatch
		if err := json.Unmarshal(line, &b); err != nil {
			t.Fatalf("list --json line %q: %v", line, err)
		}
		ids = append(ids, b.BatchID)
	}
	return ids
}

// TestARefusedRunLeavesNoEmptyOutputFile: submit creates the -o file before publishing, to
// know it can write it; a run refused after that (here: a local run without a Tinker key)
// removes it again, a compressed one included (no empty stream is written to it), and leaves
// alone an empty file that was there before. So does a run interrupted before its first
// result.
func TestARefusedRunLeavesNoEmptyOutputFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := quietEnv()
	refused := func(out string) {
		t.Helper()
		args := []string{"--local", "--data-dir", filepath.Join(dir, "data"), "--progress", "none", "../../examples/prompts.jsonl", "-o", out}
		if err := run(context.Background(), args, env); err == nil || !strings.Contains(err.Error(), "needs a Tinker key") {
			t.Fatalf("a local run without a key: %v", err)
		}
	}
	for _, name := range []string{"results.jsonl", "results.jsonl.zst", "results.jsonl.gz"} {
		out := filepath.Join(dir, name)
		refused(out)
		if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the refused run left its output file %s behind: %v", name, err)
		}
	}
	mine := filepath.Join(dir, "mine.jsonl")
	if err := os.WriteFile(mine, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	refused(mine)
	if _, err := os.Stat(mine); err != nil {
		t.Fatalf("the refused run removed an output file it did not create: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the refused runs made a store, %v: the key is checked before", err)
	}

	f := newFleet(t, queue.Config{}, tinkersim.Config{}) // and no worker
	in := writeLines(t, jobLines(3))
	for _, name := range []string{"waited.jsonl", "waited.jsonl.zst", "waited.jsonl.gz"} {
		out := filepath.Join(dir, name)
		err := f.submitInterruptedWhenIdle(t, in, "-o", out)
		if !errors.Is(err, errInterrupted) {
			t.Fatalf("a run with no worker, interrupted: %v", err)
		}
		if fi, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the interrupted run left its output file %s behind (%v, %v)", name, fi, err)
		}
	}
	// So does `results -o --wait`, interrupted before its first result.
	batch, _, err := f.submit(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "results-waited.jsonl")
	err = f.submitInterruptedWhenIdle(t, "results", strings.TrimSpace(batch), "-o", out, "--wait")
	if !errors.Is(err, errInterrupted) {
		t.Fatalf("results with no worker, interrupted: %v", err)
	}
	if fi, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the interrupted results left its output file behind (%v, %v)", fi, err)
	}
}

// submitInterruptedWhenIdle runs submit with args, a run that waits for results that do not
// come, and interrupts it once it has waited idleWait without one: at its first progress line,
// which the wait prints right after it flushed the output file. An interrupt at a set time
// could land before that flush (a loaded machine took longer to publish), or before the
// results were waited for at all.
func (f *fleet) submitInterruptedWhenIdle(t *testing.T, args ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a run that never goes idle
	defer cancel()
	interrupt, idle := context.WithCancel(ctx)
	said := &fleettest.Buffer{}
	stderr := &interruptOn{w: said, text: "| ok 0 error 0", interrupt: idle} // a progress line: one write
	err := f.submitTo(interrupt, io.Discard, stderr, append(args, "--progress", "lines")...)
	if !stderr.seen.Load() {
		t.Fatalf("submit %q never waited idle for a result (%v); it said:\n%s", args, err, said)
	}
	return err
}

// TestLocalSimulatedWorkerKeepsConnections: submit's in-process worker samples on the
// simulator over connections it keeps, as it would on the real service: about one per job in
// flight, not one per request. With Go's default pool (2 idle connections a host), which it
// had until session 12, it opened hundreds here, and a fifth of a busy run's CPU went on
// dialling and closing them. -v logs what the simulated service saw.
func TestLocalSimulatedWorkerKeepsConnections(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := filepath.Join(dir, "prompts.jsonl")
	var lines strings.Builder
	const jobs, concurrency = 300, 16
	for i := range jobs {
		fmt.Fprintf(&lines, `{"custom_id":"c-%d","model":"Qwen/Qwen3-8B","prompt":"Count to %d.","sampling_params":{"max_tokens":4}}`+"\n", i, i)
	}
	if err := os.WriteFile(in, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr}
	args := []string{"--local", "--simulate", "-v", "--concurrency", strconv.Itoa(concurrency), "--data-dir", filepath.Join(dir, "data"),
		"--progress", "none", in, "-o", filepath.Join(dir, "results.jsonl")}
	if err := run(context.Background(), args, env); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`msg="simulated Tinker service" samples=(\d+) .* connections=(\d+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no line on the simulated service in:\n%s", stderr.String())
	}
	samples, _ := strconv.Atoi(m[1])
	conns, _ := strconv.Atoi(m[2])
	if samples != jobs {
		t.Fatalf("the simulator completed %d samples for %d jobs", samples, jobs)
	}
	// A pool may dial a few more than the requests in flight at once (a request that dials
	// may take a connection freed meanwhile); start-up and heartbeats take a few of their own.
	if limit := 2*concurrency + 8; conns < 1 || conns > limit {
		t.Fatalf("%d connections for %d jobs at concurrency %d: want at most %d", conns, jobs, concurrency, limit)
	}
}

// interruptAtFirstResult returns a context cancelled once the file out holds a line, as by a
// user who interrupts a run once its first result is written.
func interruptAtFirstResult(out string) (context.Context, context.CancelFunc) {
	ctx, interrupt := context.WithCancel(context.Background())
	go func() { // ends with ctx
		for ctx.Err() == nil {
			if b, _ := os.ReadFile(out); bytes.Count(b, []byte("\n")) > 0 {
				interrupt()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return ctx, interrupt
}

// TestInterruptedRunSaysHowToGoOn: an interrupt while results come in ends submit with
// status 130 and a line saying how many results the file has and that the same command goes
// on; run again, it does, and every job has one result.
func TestInterruptedRunSaysHowToGoOn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "prompts.jsonl"), filepath.Join(dir, "results.jsonl")
	const jobs = 200
	var lines strings.Builder
	for i := range jobs {
		fmt.Fprintf(&lines, `{"custom_id":"c-%d","model":"Qwen/Qwen3-8B","prompt":"Count to %d.","sampling_params":{"max_tokens":8}}`+"\n", i, i)
	}
	if err := os.WriteFile(in, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	env := quietEnv()
	// Two jobs at a time, about 22 ms each: the batch takes over two seconds.
	args := []string{"--local", "--simulate", "--concurrency", "2", "--data-dir", filepath.Join(dir, "data"), "--progress", "none", in, "-o", out}

	ctx, interrupt := interruptAtFirstResult(out)
	defer interrupt()
	err := run(ctx, args, env)
	if !errors.Is(err, errInterrupted) || exitCode(err) != 130 {
		t.Fatalf("interrupted run: err = %v (exit status %d), want errInterrupted (130)", err, exitCode(err))
	}
	got := len(readResults(t, out))
	want := fmt.Sprintf("interrupted with %d of %d results of batch ", got, jobs)
	if !strings.Contains(err.Error(), want) || !strings.HasSuffix(err.Error(), "run the same command again to go on") {
		t.Fatalf("interrupted run: %q, want it to say %q and how to go on", err, want)
	}
	if got == 0 || got == jobs {
		t.Fatalf("%d of %d results when interrupted: the test interrupted too late", got, jobs)
	}

	args[3] = "16"
	if err := run(context.Background(), args, env); err != nil {
		t.Fatalf("the same command again: %v", err)
	}
	if res := readResults(t, out); len(res) != jobs {
		t.Fatalf("%d results after going on, want %d", len(res), jobs)
	}
}

// TestInterruptedLocalRunLeavesItsJobsReadyToGoOn: the jobs that an interrupted submit
// --local's worker had not sent, and handed back as it stopped, can be delivered again as
// soon as the data directory's server runs again. They were nak'd and forgotten: the server,
// stopped right after, lost the naks or kept them only in memory, and the same command run
// again sat on a few hundred jobs for AckWait (30 s).
func TestInterruptedLocalRunLeavesItsJobsReadyToGoOn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in, out, data := filepath.Join(dir, "prompts.jsonl"), filepath.Join(dir, "results.jsonl"), filepath.Join(dir, "data")
	const n = 3000
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, `{"custom_id":"c-%d","model":"Qwen/Qwen3-8B","prompt_tokens":[1,2,%d],"sampling_params":{"max_tokens":200}}`+"\n", i, i)
	}
	if err := os.WriteFile(in, []byte(lines.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	env := quietEnv()
	// 400 job slots against the simulator's 256 samples at once: once the worker meets its
	// first 429, it holds jobs that wait for room or for the pause to end.
	ctx, interrupt := interruptAtFirstResult(out)
	defer interrupt()
	if err := run(ctx, []string{"--local", "--simulate", "--data-dir", data, "--batch-id", "sim-handed", "--progress", "none", in, "-o", out}, env); !errors.Is(err, errInterrupted) {
		t.Fatalf("interrupted run: %v", err)
	}

	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: simulatedDataDir(data), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	stored, err := q.ResultsStored(context.Background(), "sim-handed")
	if err != nil {
		t.Fatal(err)
	}
	cons, err := q.Consumer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	held := info.NumAckPending // delivered to the interrupted worker, and not settled
	if held == 0 {
		t.Fatalf("the interrupted worker held no job (%d of %d with results): the test interrupted it too late", stored, n)
	}
	ready := 0
	for ready < n-stored {
		batch, err := cons.Fetch(queue.MaxPull, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			_ = m.Ack() // within the consumer's MaxAckPending
		}
		if got == 0 {
			break
		}
		ready += got
	}
	if ready != n-stored {
		t.Fatalf("%d jobs can be delivered after the restart, want all %d without a result (%d held by the interrupted worker)", ready, n-stored, held)
	}
}

// TestCommandsReachTheServerOfARunningLocalRun: while a local run holds the data directory,
// status, list and results connect to its server rather than fail; a second submit there is
// refused, saying so; and a results --wait whose host ends says so and how to go on.
func TestCommandsReachTheServerOfARunningLocalRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data, out, followedOut := filepath.Join(dir, "data"), filepath.Join(dir, "results.jsonl"), filepath.Join(dir, "followed.jsonl")
	in := writeLines(t, jobLines(5))
	env := quietEnv()
	ctx := context.Background()

	// The running local run: its embedded server holds the data directory; no worker samples.
	// It is a --simulate run's, as the second submit below is.
	dataArg := data
	data = simulatedDataDir(data)
	host, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: data, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Shutdown()
	if err := run(ctx, []string{"--nats-url", host.ClientURL(), "--batch-id", "b-hosted", "--progress", "none", in}, env); err != nil {
		t.Fatalf("publishing: %v", err)
	}

	var status bytes.Buffer
	if err := run(ctx, []string{"status", "--data-dir", data, "--json", "b-hosted"}, &environment{getenv: env.getenv, stdout: &status, stderr: io.Discard}); err != nil {
		t.Fatalf("status beside the running run: %v", err)
	}
	var st batchStatus
	if err := json.Unmarshal(status.Bytes(), &st); err != nil || st.BatchID != "b-hosted" || st.Waiting != 5 {
		t.Fatalf("status beside the running run: %s (%v), want b-hosted with 5 jobs waiting", status.String(), err)
	}
	if err := run(ctx, []string{"list", "--data-dir", data}, env); err != nil {
		t.Fatalf("list beside the running run: %v", err)
	}
	err = run(ctx, []string{"--local", "--simulate", "--data-dir", dataArg, "--progress", "none", in, "-o", out}, env)
	if err == nil || !strings.Contains(err.Error(), "is in use by another process") || !strings.Contains(err.Error(), "meanwhile submit status") {
		t.Fatalf("a second local run on the data directory: %v", err)
	}

	followed := make(chan error, 1)
	go func() {
		followed <- run(ctx, []string{"results", "--data-dir", data, "--progress", "none", "b-hosted", "-o", followedOut, "--wait"}, env)
	}()
	for { // following once it has opened its output
		if _, err := os.Stat(followedOut); err == nil {
			break
		}
		select {
		case err := <-followed:
			t.Fatalf("results --wait beside the running run ended before its host: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	host.Shutdown()
	select {
	case err = <-followed:
	case <-time.After(20 * time.Second):
		t.Fatal("results --wait goes on waiting on a server that has ended")
	}
	if err == nil || !strings.Contains(err.Error(), "stopped with 0 of 5 results of batch b-hosted in "+followedOut) ||
		!strings.Contains(err.Error(), "the process that served "+data) || !strings.Contains(err.Error(), "run the same command again to go on") {
		t.Fatalf("results --wait whose host ended: %v", err)
	}
}

// TestSubmitBesideAWorkerServingNATSSaysToSubmitToIt: a newcomer who started
// worker --embedded-nats in a folder, then ran submit there without --nats-url, was told to
// wait for the worker to end (it serves until stopped) or to take another data directory
// (a run of its own, apart from the fleet). It is told the server to submit to; a --simulate
// run, which samples in-process and takes no --nats-url, is not.
func TestSubmitBesideAWorkerServingNATSSaysToSubmitToIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	in := writeLines(t, jobLines(2))
	getenv := func(k string) string {
		if k == "TINKER_API_KEY" {
			return "tml-test"
		}
		return ""
	}
	env := &environment{getenv: getenv, stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	host, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: data, Port: -1}) // the worker's
	if err != nil {
		t.Fatal(err)
	}
	defer host.Shutdown()

	err = run(context.Background(), []string{"--data-dir", data, "--progress", "none", in, "-o", filepath.Join(dir, "out.jsonl")}, env)
	if err == nil || !strings.Contains(err.Error(), "is in use by another process") || !strings.Contains(err.Error(), "--nats-url "+host.ClientURL()) {
		t.Fatalf("submit beside a worker serving NATS: %v; want it told to submit to --nats-url %s", err, host.ClientURL())
	}

	sim, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: simulatedDataDir(data), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Shutdown()
	err = run(context.Background(), []string{"--simulate", "--data-dir", data, "--progress", "none", in}, env)
	if err == nil || !strings.Contains(err.Error(), "is in use by another process") || strings.Contains(err.Error(), "--nats-url") {
		t.Fatalf("a --simulate submit beside a running one: %v; want it refused, without --nats-url", err)
	}
}

// TestWaitingOnALocalDataDirectoryAloneSaysHowToSample: results --wait on a local data
// directory that no run holds would wait forever (no worker can reach the server it starts),
// and keep the directory from the submit --local run that would sample the rest. It writes
// what is stored and says which command samples the rest; status says so too.
func TestWaitingOnALocalDataDirectoryAloneSaysHowToSample(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data, out := filepath.Join(dir, "data"), filepath.Join(dir, "results.jsonl")
	in := writeLines(t, jobLines(5))
	env := quietEnv()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: data, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"--nats-url", emb.ClientURL(), "--batch-id", "b-alone", "--progress", "none", in}, env); err != nil {
		t.Fatalf("publishing: %v", err)
	}
	// A worker set the consumer up and crashed with the run that held the store, leaving a
	// presence note that counts for 15 s.
	crashed := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	fleet, err := backoff.Open(context.Background(), crashed.JS, backoff.Config{Bucket: crashed.Names.BackoffBucket(), Account: backoff.AccountKey("https://tinker.example", "tml-k")})
	if err != nil {
		t.Fatal(err)
	}
	fleet.Close()
	if err := crashed.NotePresence("crashed", queue.Presence{Host: "gone"}); err != nil {
		t.Fatal(err)
	}
	if err := crashed.JS.Conn().Flush(); err != nil { // the note is not waited for
		t.Fatal(err)
	}
	emb.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run(ctx, []string{"results", "--data-dir", data, "--progress", "none", "b-alone", "-o", out, "--wait"}, env)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "0 of 5 results of batch b-alone in "+out+"; no worker can take the rest") ||
		!strings.Contains(err.Error(), "run the batch's submit --local command again") {
		t.Fatalf("results --wait with no worker: %v", err)
	}
	var status bytes.Buffer
	if err := run(ctx, []string{"status", "--data-dir", data, "b-alone"}, &environment{getenv: env.getenv, stdout: &status, stderr: io.Discard}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(status.String(), "5 jobs wait, and no worker can take them: the NATS server runs in this command") ||
		!strings.Contains(status.String(), "none running") {
		t.Fatalf("status with no worker:\n%s", status.String())
	}
	status.Reset()
	if err := run(ctx, []string{"status", "--json", "--data-dir", data, "b-alone"}, &environment{getenv: env.getenv, stdout: &status, stderr: io.Discard}); err != nil {
		t.Fatal(err)
	}
	var st batchStatus
	if err := json.Unmarshal(status.Bytes(), &st); err != nil || st.Workers == nil || st.Workers.Running != 0 || len(st.Workers.Hosts) != 0 {
		t.Fatalf("status --json with no worker: %s (%v), want none running", status.String(), err)
	}
}

// TestRunAgainAfterAKilledLocalRunGoesOnAtOnce: a local run killed with jobs delivered to
// its worker (kill -9, a crash: nothing hands them back) leaves them pending on its store.
// Run again, submit gives them out at once rather than after AckWait, and those whose results
// the killed run had stored are not sampled again.
func TestRunAgainAfterAKilledLocalRunGoesOnAtOnce(t *testing.T) {
	t.Parallel()
	rerunAfterAKilledLocalRun(t, nil)
}

// TestCommandsBetweenAKilledLocalRunAndItsRerunSampleNothingTwice: status and list on the
// store of a killed local run, as one runs them to see where it stopped, leave its jobs to
// the rerun, which samples none of them twice. Before, they took the jobs back themselves,
// as first deliveries, and the rerun, told nothing, sampled again those whose results the
// killed run had stored.
func TestCommandsBetweenAKilledLocalRunAndItsRerunSampleNothingTwice(t *testing.T) {
	t.Parallel()
	rerunAfterAKilledLocalRun(t, func(env *environment, dataDir string, _ []string) {
		for _, args := range [][]string{{"status", "--data-dir", dataDir, "sim-killed"}, {"list", "--data-dir", dataDir}} {
			if err := run(context.Background(), args, env); err != nil {
				t.Fatalf("%s: %v", args[0], err)
			}
		}
	})
}

// TestARerunInterruptedAfterItTookBackTheJobsLeavesTheNextSamplingNothingTwice: a rerun of a
// killed local run takes the killed run's jobs back at once; interrupted then (Ctrl-C, or
// killed in turn), before its worker pulled them, it leaves them first deliveries that no
// worker holds. The run after it must still know that the results of some are stored: before,
// it found no job to take back, told its worker nothing, and sampled those again.
func TestARerunInterruptedAfterItTookBackTheJobsLeavesTheNextSamplingNothingTwice(t *testing.T) {
	t.Parallel()
	rerunAfterAKilledLocalRun(t, func(env *environment, _ string, rerun []string) {
		ctx, interrupt := context.WithCancel(context.Background())
		defer interrupt()
		// The interrupt comes the moment the jobs are taken back, before the worker starts.
		w := &interruptOn{w: io.Discard, text: "are ready again", interrupt: interrupt}
		err := run(ctx, rerun, &environment{getenv: env.getenv, stdin: env.stdin, stdout: io.Discard, stderr: w})
		if err == nil || !w.seen.Load() {
			t.Fatalf("the interrupted rerun: %v (jobs taken back: %v)", err, w.seen.Load())
		}
	})
}

// interruptOn writes to w and calls interrupt once a write holds text.
type interruptOn struct {
	w         io.Writer
	text      string
	interrupt func()
	seen      atomic.Bool
}

func (i *interruptOn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte(i.text)) {
		i.seen.Store(true)
		i.interrupt()
	}
	return i.w.Write(p)
}

// rerunAfterAKilledLocalRun kills a local run of 30 jobs after its worker stored the results
// of 10 of them, calls between (if not nil) with the run's --data-dir, runs it again and
// checks that every job has its result and that only the 20 others were sampled.
func rerunAfterAKilledLocalRun(t *testing.T, between func(env *environment, dataDir string, rerun []string)) {
	dir := t.TempDir()
	data, out := filepath.Join(dir, "data"), filepath.Join(dir, "results.jsonl")
	const n, stored = 30, 10
	in := writeLines(t, jobLines(n))
	env := quietEnv()
	args := []string{"--data-dir", data, "--batch-id", "sim-killed", "--ack-wait", "10m", "--progress", "none", in}
	dataDir := data
	data = simulatedDataDir(data) // the rerun below is a --simulate run

	// The killed run: the batch published, its jobs delivered to a worker that dies with them.
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: data, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), append([]string{"--nats-url", emb.ClientURL()}, args...), env); err != nil {
		t.Fatalf("publishing: %v", err)
	}
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{AckWait: 10 * time.Minute})
	// Its worker opened the fleet backoff, which makes the bucket.
	fleet, err := backoff.Open(context.Background(), q.JS, backoff.Config{Bucket: q.Names.BackoffBucket(), Account: "killed"})
	if err != nil {
		t.Fatal(err)
	}
	fleet.Close()
	cons, err := q.Consumer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	codec, err := queue.NewCodec(0)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for msg := range batch.Messages() {
		// It stored the results of the last few, and died before it acked them.
		if held++; held > n-stored {
			res := jobs.Result{CustomID: msg.Headers().Get(queue.HeaderCustomID), BatchID: "sim-killed", Status: jobs.StatusOK,
				Model: "Qwen/Qwen3-8B", Samples: []jobs.Sample{{Text: "sampled by the killed run"}}}
			data, err := res.AppendJSON(nil)
			if err != nil {
				t.Fatal(err)
			}
			m, err := q.ResultMsg(nil, codec, "sim-killed", res.CustomID, string(res.Status), queue.Tokens{}, data, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := q.PublishResult(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if held != n {
		t.Fatalf("the killed worker holds %d jobs, want %d", held, n)
	}
	q.JS.Conn().Close()
	emb.Shutdown()
	rerun := append([]string{"--local", "--simulate", "-v", "-o", out}, args...)
	if between != nil {
		between(env, dataDir, rerun)
	}

	// Run again: the jobs wait out ten minutes of AckWait unless submit takes them back.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	env.stderr = &stderr
	if err := run(ctx, rerun, env); err != nil {
		t.Fatalf("run again: %v", err)
	}
	results := readResults(t, out)
	if len(results) != n {
		t.Fatalf("%d results, want %d", len(results), n)
	}
	// The jobs whose results were stored come back as first deliveries, and are not sampled
	// again.
	m := regexp.MustCompile(`msg="simulated Tinker service" samples=(\d+) `).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no line on the simulated service in:\n%s", stderr.String())
	}
	if samples, _ := strconv.Atoi(m[1]); samples != n-stored {
		t.Fatalf("the rerun sampled %d jobs; want %d, the %d whose results were not stored", samples, n-stored, n-stored)
	}
}

// TestInterruptedWaitOnAFleetSaysTheFleetGoesOn: interrupted while waiting on a fleet, submit
// says the fleet goes on and which command collects the rest; that command, interrupted in
// turn, says how to go on too.
func TestInterruptedWaitOnAFleetSaysTheFleetGoesOn(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{BaseLatency: 50 * time.Millisecond})
	lines := jobLines(40)
	in := writeLines(t, lines)
	out := filepath.Join(t.TempDir(), "results.jsonl")
	f.startWorker(1)
	// interruptOnMore is a context cancelled once out has more than lines lines.
	interruptOnMore := func(lines int) context.Context {
		ctx, interrupt := context.WithCancel(context.Background())
		t.Cleanup(interrupt)
		go func() {
			for ctx.Err() == nil {
				if b, _ := os.ReadFile(out); bytes.Count(b, []byte("\n")) > lines {
					interrupt()
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
		return ctx
	}
	stdout, _, err := f.submit(interruptOnMore(0), in, "-o", out)
	batch := strings.TrimSpace(stdout)
	want := "the fleet goes on with it; run the same command again, or submit results " + batch + " -o " + out + " --wait, to collect the rest"
	if !errors.Is(err, errInterrupted) || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("err = %v, want errInterrupted ending %q", err, want)
	}

	got := len(readResults(t, out))
	_, _, err = f.submit(interruptOnMore(got), "results", batch, "-o", out, "--wait")
	if !errors.Is(err, errInterrupted) || !strings.Contains(err.Error(), " of 40 results of batch "+batch+" in "+out) ||
		!strings.HasSuffix(err.Error(), ": run the same command again to go on") {
		t.Fatalf("results --wait interrupted: err = %v", err)
	}
}

// takeRequests hands take the requests that reach ch (a subscription of nc to JetStream API
// subjects) until enough says the ones expected are in, then, after a flush, any others. A
// flush alone does not do: the server queues a JetStream API request for its own goroutines
// as soon as it reads it, and may answer it, and a later flush of nc, before it hands the
// request to nc. A request that never comes fails the test after 10 s, saying what.
func takeRequests(t *testing.T, nc *nats.Conn, ch <-chan *nats.Msg, what func() string, enough func() bool, take func(*nats.Msg)) {
	t.Helper()
	for wait := time.After(10 * time.Second); !enough(); {
		select {
		case m := <-ch:
			take(m)
		case <-wait:
			t.Fatalf("waited 10s for %s", what())
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for len(ch) > 0 {
		take(<-ch)
	}
}

// natsServer starts a nats-server with JetStream on a random loopback port, storing in a
// temporary directory, with opts for the rest (limits, users), and stops it when the test ends.
func natsServer(t *testing.T, opts server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoSigs = "127.0.0.1", -1, true, t.TempDir(), true
	srv, err := server.NewServer(&opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	return srv
}

// TestFullServerSaysHowToGoOn: a NATS server out of room for jobs stops the publishing with
// an error that says so and what to do, not only the server's "insufficient resources".
func TestFullServerSaysHowToGoOn(t *testing.T) {
	t.Parallel()
	srv := natsServer(t, server.Options{JetStreamMaxStore: 256 << 10})
	lines := jobLines(4000) // about 600 KiB of jobs
	var stderr bytes.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr}
	err := run(context.Background(), []string{"--nats-url", srv.ClientURL(), "--progress", "none", "--store-wait", "500ms", writeLines(t, lines)}, env)
	if err == nil {
		t.Fatal("4,000 jobs went into a server with room for 256 KiB")
	}
	for _, want := range []string{"cannot store jobs", "insufficient resources", "make room", "submit delete", "run the same command again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if got := strings.Count(stderr.String(), "trying again for up to 500ms"); got != 1 {
		t.Errorf("said %d times that it tries again, want once:\n%s", got, stderr.String())
	}
}

// TestRoomThatComesAndGoesIsSaidOnce: while workers free room in a full server a little at a
// time, publishing waits many times, and says so once.
func TestRoomThatComesAndGoesIsSaidOnce(t *testing.T) {
	t.Parallel()
	srv := natsServer(t, server.Options{JetStreamMaxStore: 256 << 10})
	q := fleettest.Queue(t, srv.ClientURL(), queue.Config{})
	cons, err := q.Consumer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var drained sync.WaitGroup
	defer func() { cancel(); drained.Wait() }()
	drained.Go(func() { // a slow worker: 200 jobs every 200 ms, once the stream is full
		// Waiting for the stream to fill first makes the test hold on a busy machine, where
		// a slow submit was drained as fast as it published and never met a full stream.
		for ctx.Err() == nil {
			info, err := q.JS.Stream(ctx, q.Names.JobsStream())
			if err == nil && info.CachedInfo().State.Bytes > 192<<10 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		for ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
			batch, err := cons.Fetch(200, jetstream.FetchMaxWait(100*time.Millisecond))
			if err != nil {
				continue
			}
			for msg := range batch.Messages() {
				_ = msg.Ack()
			}
		}
	})
	lines := jobLines(4000) // about 600 KiB of jobs
	var stderr bytes.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr}
	if err := run(ctx, []string{"--nats-url", srv.ClientURL(), "--progress", "none", "--store-wait", "5s", writeLines(t, lines)}, env); err != nil {
		t.Fatalf("submit: %v\n%s", err, stderr.String())
	}
	if got := strings.Count(stderr.String(), "cannot store jobs now"); got != 1 {
		t.Errorf("said %d times that it waits, want once:\n%s", got, stderr.String())
	}
}

// TestPublishingRidesOutAStreamWithoutLeader: a job the server cannot store for a moment (no
// stream answers, as during a leader election) is published again until it is stored, once.
func TestPublishingRidesOutAStreamWithoutLeader(t *testing.T) {
	t.Parallel()
	q := fleettest.Queue(t, fleettest.NATS(t).ClientURL(), queue.Config{})
	msg := nats.NewMsg("later.job")
	msg.Data = []byte(`{}`)
	f, err := q.JS.PublishMsgAsync(msg, jetstream.WithMsgID("b/job-1"))
	if err != nil {
		t.Fatal(err)
	}
	var said fleettest.Buffer
	w := &storeWaiter{q: q, wait: 20 * time.Second, stderr: &said}
	ctx := context.Background()
	made := make(chan struct{})
	defer func() { <-made }()
	go func() {
		defer close(made)
		// The stream comes back (is made) after nats.go's own retries (2 × 250 ms) are over:
		// once the waiter says that it waits, as it does when the job it published again was
		// refused too. A fixed 1.5 s, about 0.5 s after that on an idle machine, came before
		// it on a busy one.
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(said.String(), "cannot store jobs now") && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := q.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "LATER", Subjects: []string{"later.>"}}); err != nil {
			t.Error(err)
		}
	}()
	if err := w.stored(ctx, f); err != nil {
		t.Fatalf("stored: %v (said %q)", err, said.String())
	}
	if !strings.Contains(said.String(), "cannot store jobs now") {
		t.Errorf("said %q; want that it waits", said.String())
	}
	stream, err := q.JS.Stream(ctx, "LATER")
	if err != nil {
		t.Fatal(err)
	}
	if info, err := stream.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the stream holds %d jobs (%v), want 1", info.State.Msgs, err)
	}
}

// TestPublishingRidesOutAFailedWrite: a job whose publish fails on the socket (its server
// went away under the connection, as when the node submit is connected to stops) is published
// again once nats.go has reconnected, and stored once.
func TestPublishingRidesOutAFailedWrite(t *testing.T) {
	t.Parallel()
	var dialer fleettest.WriteCutter
	q := fleettest.Queue(t, fleettest.NATS(t).ClientURL(), queue.Config{}, nats.SetCustomDialer(&dialer))
	ctx := context.Background()
	var said bytes.Buffer
	w := &storeWaiter{q: q, wait: 20 * time.Second, stderr: &said}
	// The first async publish subscribes to the acks' inbox, and nats.go's flusher goroutine
	// writes that subscription: a write the cut could take instead of the publish's own.
	warm, err := q.PublishJobAsync("b1", "job-0", []byte("{}"), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.stored(ctx, warm); err != nil {
		t.Fatal(err)
	}
	if err := q.JS.Conn().Flush(); err != nil { // nothing left in nats.go's buffer to take the cut
		t.Fatal(err)
	}
	// Larger than nats.go's 32 KiB write buffer, so the publish itself writes to the socket.
	data := bytes.Repeat([]byte("x"), 40<<10)
	dialer.CutNextWrite()
	f, err := w.send(ctx, func() (jetstream.PubAckFuture, error) { return q.PublishJobAsync("b1", "job-1", data, false) })
	if err != nil {
		t.Fatalf("send: %v", err)
	}
	if err := w.stored(ctx, f); err != nil {
		t.Fatalf("stored: %v (said %q)", err, said.String())
	}
	if !strings.Contains(said.String(), "cannot store jobs now") || !strings.Contains(said.String(), "write tcp") {
		t.Errorf("said %q; want that it waits, and why", said.String())
	}
	if info, err := q.Jobs.Info(ctx); err != nil || info.State.Msgs != 2 {
		t.Fatalf("the stream holds %d jobs (%v), want 2: the first and the one cut", info.State.Msgs, err)
	}
}

// TestManifestWriteRidesOutABucketWithoutLeader: a batch's manifest that the server cannot
// store for a moment (its bucket answers nothing, as during a leader election) is written
// again until it is stored.
func TestManifestWriteRidesOutABucketWithoutLeader(t *testing.T) {
	t.Parallel()
	q := fleettest.Queue(t, fleettest.NATS(t).ClientURL(), queue.Config{})
	ctx := context.Background()
	bucket, err := q.Batches.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := bucket.Config()
	if err := q.JS.DeleteKeyValue(ctx, cfg.Bucket); err != nil {
		t.Fatal(err)
	}
	go func() {
		// The bucket comes back after nats.go's own retries are over.
		time.Sleep(1500 * time.Millisecond)
		if _, err := q.JS.CreateKeyValue(ctx, cfg); err != nil {
			t.Error(err)
		}
	}()
	m := queue.Manifest{BatchID: "b-later", Status: queue.BatchPublishing, Digest: "d", Jobs: 3}
	w := &storeWaiter{q: q, wait: 20 * time.Second, stderr: io.Discard}
	rev, err := w.writeManifest(ctx, m, 0)
	if err != nil {
		t.Fatalf("writeManifest: %v", err)
	}
	got, gotRev, err := q.GetManifest(ctx, m.BatchID)
	if err != nil || gotRev != rev || got.Status != m.Status || got.Jobs != 3 {
		t.Fatalf("manifest %+v at revision %d (%v); want %+v at %d", got, gotRev, err, m, rev)
	}
	if _, err := w.writeManifest(ctx, m, 0); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Errorf("creating the manifest again: %v, want ErrKeyExists at once (it is not a retry)", err)
	}
}

// TestOutputOfAnotherBatchIsRefusedBeforePublishing: the prompts file edited is another batch;
// run with the -o file of the first, it would have found every custom_id there and reported
// the stale results as its own. It is refused before anything is published, and the file is
// left as it was.
func TestOutputOfAnotherBatchIsRefusedBeforePublishing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "results.jsonl")
	env := quietEnv()
	local := []string{"--local", "--simulate", "--data-dir", filepath.Join(dir, "data"), "--progress", "none"}
	if err := run(context.Background(), append(local, "../../examples/prompts.jsonl", "-o", out), env); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	prompts, err := os.ReadFile("../../examples/prompts.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	edited := filepath.Join(dir, "edited.jsonl")
	if err := os.WriteFile(edited, bytes.Replace(prompts, []byte("Explain the difference"), []byte("Explain the gap"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), append(local, edited, "-o", out), env)
	if !errors.Is(err, errOtherBatch) {
		t.Fatalf("the edited prompts with the first batch's -o file: %v", err)
	}
	if after, _ := os.ReadFile(out); !bytes.Equal(after, before) {
		t.Fatal("the first batch's results file was changed")
	}
	var list bytes.Buffer
	listEnv := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: &list, stderr: io.Discard}
	if err := run(context.Background(), []string{"list", "--local", "--data-dir", simulatedDataDir(filepath.Join(dir, "data"))}, listEnv); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(list.String(), "\n"+simulatedBatchPrefix); n != 1 {
		t.Fatalf("%d batches after the refused run, want the first only:\n%s", n, list.String())
	}
	// An output that cannot be written (here a directory) is refused before publishing too.
	if err := run(context.Background(), append(local, edited, "-o", dir), env); err == nil || !strings.Contains(err.Error(), "output") {
		t.Fatalf("a directory as the output: %v", err)
	}
	list.Reset()
	if err := run(context.Background(), []string{"list", "--local", "--data-dir", simulatedDataDir(filepath.Join(dir, "data"))}, listEnv); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(list.String(), "\n"+simulatedBatchPrefix); n != 1 {
		t.Fatalf("%d batches after the run with an unwritable output, want the first only:\n%s", n, list.String())
	}
}

// tinkerAt is a getenv with the test key and baseURL for the Tinker service, and nothing else.
func tinkerAt(baseURL string) func(string) string {
	return func(k string) string {
		return map[string]string{"TINKER_API_KEY": fleettest.APIKey, "TINKER_BASE_URL": baseURL}[k]
	}
}

// TestLocalWarnsWhileTinkerCannotBeReached: the local worker's Dial retries for minutes when
// the service cannot be reached; the user sees why at once (above the progress bar, on a line
// of its own), without -v, and without the key.
func TestLocalWarnsWhileTinkerCannotBeReached(t *testing.T) {
	t.Parallel()
	closed := fleettest.ClosedURL(t)
	dir := t.TempDir()
	var stderr bytes.Buffer
	env := &environment{getenv: tinkerAt(closed), stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr, tty: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	args := []string{"--local", "--data-dir", filepath.Join(dir, "data"), "../../examples/prompts.jsonl", "-o", filepath.Join(dir, "out.jsonl")}
	if err := run(ctx, args, env); err == nil {
		t.Fatal("a run against a closed port succeeded")
	}
	out := stderr.String()
	if !strings.Contains(out, "\r\033[Ktime=") || !strings.Contains(out, `level=WARN msg="tinker: request failed; retrying" endpoint=client/config`) {
		t.Fatalf("no warning on a line of its own:\n%q", out)
	}
	if strings.Contains(out, fleettest.APIKey) {
		t.Fatal("the warning shows the key")
	}
}

// TestALocalRunPublishesWhileTinkerCannotBeReached: the local worker opens its Tinker session
// while the jobs are published, so a service it cannot reach yet (retried for minutes) holds
// back no job, and the progress line names what the worker retries. Interrupted, the run says
// where its jobs wait.
func TestALocalRunPublishesWhileTinkerCannotBeReached(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var stderr fleettest.Buffer
	env := &environment{getenv: tinkerAt(fleettest.ClosedURL(t)), stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	args := []string{"--local", "--data-dir", filepath.Join(dir, "data"), "--progress", "lines", "--progress-interval", "200ms",
		"../../examples/prompts.jsonl", "-o", filepath.Join(dir, "out.jsonl")}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env) }()
	waitSaid(t, &stderr, "21 jobs submitted")
	waitSaid(t, &stderr, "21 jobs wait, and the worker in this process cannot open its Tinker session yet (it keeps trying for about 5 minutes)")
	waitSaid(t, &stderr, "client/config did not reach it")
	cancel()
	if err := <-done; !errors.Is(err, errInterrupted) || !strings.Contains(err.Error(), "its other jobs wait in "+filepath.Join(dir, "data")) {
		t.Fatalf("the interrupted run: %v", err)
	}
}

// TestALocalRunWhoseKeyIsRefusedAtStartPublishesNothing: the service's first answer refuses the
// key; the run stops with that, and before a job is published, so that no batch waits in the
// data directory for a run the user may not make again.
func TestALocalRunWhoseKeyIsRefusedAtStartPublishesNothing(t *testing.T) {
	t.Parallel()
	sim, url := fleettest.Sim(t, tinkersim.Config{})
	if _, err := sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultUnauthorized, Endpoints: []string{"client/config"}}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	env := &environment{getenv: tinkerAt(url), stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := run(ctx, []string{"--local", "--data-dir", data, "--progress", "none", "../../examples/prompts.jsonl", "-o", filepath.Join(dir, "out.jsonl")}, env)
	if !errors.Is(err, errWorkerStopped) || !errors.Is(err, worker.ErrCredentialRefused) || !strings.Contains(err.Error(), "(nothing was published)") {
		t.Fatalf("a run whose key the service refuses at once: %v", err)
	}
	var list bytes.Buffer
	env.stdout = &list
	if err := run(ctx, []string{"list", "--data-dir", data}, env); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(list.String(), "b-") {
		t.Fatalf("the refused run published a batch:\n%s", list.String())
	}
}

// openAIOutput is an OpenAI Batch output line as OpenAI documents it (BatchRequestOutput), with
// the fields of the chat.completion and text_completion bodies that output parsers read.
type openAIOutput struct {
	ID       string `json:"id"`
	CustomID string `json:"custom_id"`
	Response *struct {
		StatusCode int    `json:"status_code"`
		RequestID  string `json:"request_id"`
		Body       struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"`
			Model   string `json:"model"`
			Choices []struct {
				Index   int     `json:"index"`
				Text    *string `json:"text"`
				Message *struct {
					Role    string  `json:"role"`
					Content *string `json:"content"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				TotalTokens      int `json:"total_tokens"`
			} `json:"usage"`
		} `json:"body"`
	} `json:"response"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// outputLines reads an output file as raw lines keyed by custom id, failing on a custom id
// seen twice.
func outputLines(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		var r struct {
			CustomID string `json:"custom_id"`
		}
		if err := json.Unmarshal(line, &r); err != nil || r.CustomID == "" {
			t.Fatalf("output line %q: %v", line, err)
		}
		if _, dup := out[r.CustomID]; dup {
			t.Fatalf("two results for %s in the output", r.CustomID)
		}
		out[r.CustomID] = line
	}
	return out
}

// checkOpenAIOK checks an OpenAI Batch output line of an ok result: n choices of object.
func checkOpenAIOK(t *testing.T, line []byte, object string, n int) (texts []string) {
	t.Helper()
	var o openAIOutput
	if err := json.Unmarshal(line, &o); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	if !strings.HasPrefix(o.ID, "batch_req_") || o.Error != nil || o.Response == nil || o.Response.StatusCode != 200 ||
		!strings.HasPrefix(o.Response.RequestID, "req_") {
		t.Fatalf("not an ok OpenAI batch output line: %s", line)
	}
	b := o.Response.Body
	if b.Object != object || b.Model != "Qwen/Qwen3-8B" || b.Created <= 0 || len(b.Choices) != n ||
		b.Usage.CompletionTokens <= 0 || b.Usage.TotalTokens != b.Usage.PromptTokens+b.Usage.CompletionTokens {
		t.Fatalf("body of %s: %+v, want %s with %d choices", o.CustomID, b, object, n)
	}
	for i, c := range b.Choices {
		if c.Index != i || (c.FinishReason != "stop" && c.FinishReason != "length") {
			t.Fatalf("%s choice %d: %+v", o.CustomID, i, c)
		}
		switch {
		case object == "chat.completion" && c.Message != nil && c.Message.Role == "assistant" && c.Message.Content != nil && c.Text == nil:
			texts = append(texts, *c.Message.Content)
		case object == "text_completion" && c.Text != nil && c.Message == nil:
			texts = append(texts, *c.Text)
		default:
			t.Fatalf("%s choice %d has no text: %s", o.CustomID, i, line)
		}
	}
	return texts
}

func TestOpenAILinesGetOpenAIResults(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 16})
	f.startWorker(8)
	example, err := os.ReadFile("../../schemas/examples/job-openai.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	// The README's OpenAI example lines (request-2 asks n=3, request-3 is a completion) and one
	// native job.
	in := writeLines(t, append(strings.Split(strings.TrimSpace(string(example)), "\n"), jobLine(0)))
	ctx := context.Background()
	dir := t.TempDir()

	auto := filepath.Join(dir, "auto.jsonl")
	batch, stderr, err := f.submit(ctx, in, "-o", auto)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	batch = strings.TrimSpace(batch)
	first, err := os.ReadFile(auto)
	if err != nil {
		t.Fatal(err)
	}
	lines := outputLines(t, first)
	if len(lines) != 4 {
		t.Fatalf("%d result lines for 4 jobs:\n%s", len(lines), first)
	}
	var texts []string
	texts = append(texts, checkOpenAIOK(t, lines["request-1"], "chat.completion", 1)...)
	texts = append(texts, checkOpenAIOK(t, lines["request-2"], "chat.completion", 3)...)
	texts = append(texts, checkOpenAIOK(t, lines["request-3"], "text_completion", 1)...)
	if strings.Join(texts, "") == "" {
		t.Fatalf("no choice has any text:\n%s", first)
	}
	var native map[string]any
	if err := json.Unmarshal(lines["job-00000"], &native); err != nil || native["status"] != "ok" || native["response"] != nil {
		t.Fatalf("the native job's result is not a native line: %s", lines["job-00000"])
	}

	// Running again, or resuming a cut file, writes nothing twice and the same bytes.
	if _, stderr, err := f.submit(ctx, in, "-o", auto); err != nil || !strings.Contains(stderr, "4 results (4 ok, 0 error, 0 cancelled)") {
		t.Fatalf("again: %v: %s", err, stderr)
	}
	cut := bytes.IndexByte(first, '\n') + 1
	cut += bytes.IndexByte(first[cut:], '\n') + 1
	if err := os.WriteFile(auto, first[:cut+30], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := f.submit(ctx, in, "-o", auto); err != nil {
		t.Fatalf("resume: %v: %s", err, stderr)
	}
	if again, err := os.ReadFile(auto); err != nil || !bytes.Equal(again, first) {
		t.Fatalf("resumed file differs (%v):\n%s\nwant\n%s", err, again, first)
	}

	// --result-format native: tinkerfleet lines that say which format the job had.
	nat := filepath.Join(dir, "native.jsonl")
	if _, stderr, err := f.submit(ctx, in, "-o", nat, "--result-format", "native"); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	res := readResults(t, nat)
	for id, want := range map[string]struct {
		format  any
		samples int
	}{"request-1": {"openai-chat", 1}, "request-2": {"openai-chat", 3}, "request-3": {"openai-completions", 1}, "job-00000": {nil, 1}} {
		r := res[id]
		if samples, _ := r["samples"].([]any); r["status"] != "ok" || r["format"] != want.format || len(samples) != want.samples {
			t.Errorf("native line of %s: %v", id, r)
		}
	}
	if len(res) != 4 {
		t.Errorf("%d native lines", len(res))
	}

	// --result-format openai: every line, the native job's too (as a text_completion); the
	// lines of the OpenAI jobs are those written before, byte for byte.
	stdout, stderr, err := f.submit(ctx, "results", batch, "--result-format", "openai")
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	all := outputLines(t, []byte(stdout))
	checkOpenAIOK(t, all["job-00000"], "text_completion", 1)
	for _, id := range []string{"request-1", "request-2", "request-3"} {
		if !bytes.Equal(all[id], lines[id]) {
			t.Errorf("%s written twice differently:\n%s\n%s", id, all[id], lines[id])
		}
	}
	if len(all) != 4 {
		t.Errorf("%d openai lines", len(all))
	}
}

// TestOpenAILogprobsComeBackInOpenAIShapes: a chat line with "logprobs": true and a
// completions line with "logprobs": 0, run through a worker and the simulator, get OpenAI's
// logprobs, one entry per completion token, whose bytes (tokens, for a completion) make the
// choice's text: a chat's with the stop token that ended it after it. A line that did not ask
// keeps "logprobs": null, and its stored result has no token bytes. The simulator samples
// Qwen3 ids from 1000 to 1276, each whole UTF-8 alone (id 1277 is the first above 1000 that is
// a part of a character), so that the text is the bytes exactly, not them made valid UTF-8.
func TestOpenAILogprobsComeBackInOpenAIShapes(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 16, TokenMin: 1000, TokenMax: 1277})
	f.startWorker(4)
	in := writeLines(t, []string{
		`{"custom_id":"chat","method":"POST","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":24,"n":3,"logprobs":true,"top_logprobs":0}}`,
		`{"custom_id":"cmpl","method":"POST","url":"/v1/completions","body":{"model":"Qwen/Qwen3-8B","prompt":"Once upon","max_tokens":24,"n":2,"logprobs":0}}`,
		`{"custom_id":"plain","method":"POST","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":8,"logprobs":false}}`,
	})
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "out.jsonl")
	batch, stderr, err := f.submit(ctx, in, "-o", out)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := outputLines(t, data)
	type choice struct {
		Text    *string `json:"text"`
		Message *struct {
			Content   string  `json:"content"`
			Reasoning *string `json:"reasoning_content"`
		} `json:"message"`
		FinishReason string          `json:"finish_reason"`
		Logprobs     json.RawMessage `json:"logprobs"`
	}
	body := func(id string) (choices []choice, completionTokens int) {
		t.Helper()
		var o struct {
			Response struct {
				Body struct {
					Choices []choice `json:"choices"`
					Usage   struct {
						CompletionTokens int `json:"completion_tokens"`
					} `json:"usage"`
				} `json:"body"`
			} `json:"response"`
		}
		if err := json.Unmarshal(lines[id], &o); err != nil || len(o.Response.Body.Choices) == 0 {
			t.Fatalf("%s: %s: %v", id, lines[id], err)
		}
		return o.Response.Body.Choices, o.Response.Body.Usage.CompletionTokens
	}
	strict := func(raw []byte, v any) {
		t.Helper()
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			t.Fatalf("logprobs %s: %v", raw, err)
		}
	}

	choices, completionTokens := body("chat")
	entries := 0
	for i, c := range choices {
		var lp struct {
			Content []struct {
				Token       string            `json:"token"`
				Logprob     float64           `json:"logprob"`
				RawBytes    []int             `json:"bytes"`
				TopLogprobs []json.RawMessage `json:"top_logprobs"`
			} `json:"content"`
			Refusal json.RawMessage `json:"refusal"`
		}
		strict(c.Logprobs, &lp)
		if c.Message == nil || c.Message.Reasoning != nil || len(lp.Content) == 0 || string(lp.Refusal) != "null" {
			t.Fatalf("chat choice %d: %+v, logprobs %s", i, c, c.Logprobs)
		}
		entries += len(lp.Content)
		var text []byte
		for k, e := range lp.Content {
			if e.Logprob > 0 || e.Logprob < -9999 || e.TopLogprobs == nil || len(e.TopLogprobs) != 0 {
				t.Errorf("chat choice %d entry %d: %+v", i, k, e)
			}
			var tb []byte
			for _, b := range e.RawBytes {
				tb = append(tb, byte(b))
			}
			if e.Token != string(tb) {
				t.Errorf("chat choice %d entry %d: token %q, bytes %q", i, k, e.Token, tb)
			}
			if k == len(lp.Content)-1 && c.FinishReason == "stop" {
				if !strings.HasPrefix(e.Token, "<|") {
					t.Errorf("chat choice %d ended by %q, not a stop token", i, e.Token)
				}
				break // the stop token that ended the answer, which the text leaves out
			}
			text = append(text, tb...)
		}
		if string(text) != c.Message.Content {
			t.Errorf("chat choice %d: the tokens' bytes make %q, the content is %q", i, text, c.Message.Content)
		}
	}
	if entries != completionTokens {
		t.Errorf("chat: %d logprobs for %d completion tokens", entries, completionTokens)
	}

	choices, completionTokens = body("cmpl")
	entries = 0
	for i, c := range choices {
		var lp struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
		}
		strict(c.Logprobs, &lp)
		n := len(lp.Tokens)
		if c.Text == nil || n == 0 || len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n || len(lp.TextOffset) != n {
			t.Fatalf("completion choice %d: %+v, logprobs %s", i, c, c.Logprobs)
		}
		entries += n
		var text string
		for k, tok := range lp.Tokens {
			if lp.TextOffset[k] != utf8.RuneCountInString(text) {
				t.Errorf("completion choice %d token %d: text_offset %d after %q", i, k, lp.TextOffset[k], text)
			}
			if top := lp.TopLogprobs[k]; len(top) != 1 || top[tok] != lp.TokenLogprobs[k] {
				t.Errorf("completion choice %d token %d: top_logprobs %v, token %q logprob %v", i, k, top, tok, lp.TokenLogprobs[k])
			}
			text += tok
		}
		if text != *c.Text {
			t.Errorf("completion choice %d: the tokens make %q, the text is %q", i, text, *c.Text)
		}
	}
	if entries != completionTokens {
		t.Errorf("completions: %d logprobs for %d completion tokens", entries, completionTokens)
	}

	if choices, _ := body("plain"); string(choices[0].Logprobs) != "null" {
		t.Errorf("a line that did not ask has logprobs %s", choices[0].Logprobs)
	}
	// The stored results: token bytes for the jobs that asked, none for the one that did not.
	stdout, stderr, err := f.submit(ctx, "results", strings.TrimSpace(batch), "--result-format", "native")
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	for id, line := range outputLines(t, []byte(stdout)) {
		r, err := jobs.DecodeResult(line)
		if err != nil {
			t.Fatal(err)
		}
		asked := id != "plain"
		for _, s := range r.Samples {
			if r.OpenAILogprobs != asked || (s.TokenBytes != nil) != asked || (asked && len(s.TokenBytes) != len(s.Tokens)) {
				t.Errorf("native result of %s: %s", id, line)
			}
		}
	}
}

func TestBadResultFormatIsAnError(t *testing.T) {
	t.Parallel()
	in := writeLines(t, []string{jobLine(0)})
	for _, tt := range []struct {
		env  string
		args []string
	}{
		{"", []string{"--nats-url", "nats://127.0.0.1:1", "--result-format", "OpenAI", in}},
		{"jsonl", []string{"--nats-url", "nats://127.0.0.1:1", in}},
		{"", []string{"results", "--nats-url", "nats://127.0.0.1:1", "--result-format", "csv", "b-1"}},
		{"tinkerfleet", []string{"results", "--nats-url", "nats://127.0.0.1:1", "b-1"}},
	} {
		env := &environment{getenv: func(k string) string {
			if k == "TINKERFLEET_RESULT_FORMAT" {
				return tt.env
			}
			return ""
		}, stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
		err := run(context.Background(), tt.args, env)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--result-format") ||
			!strings.Contains(err.Error(), "must be auto, native or openai") {
			t.Errorf("%v (env %q): err = %v", tt.args, tt.env, err)
		}
	}
}

func TestBadProgressIsAnError(t *testing.T) {
	t.Parallel()
	in := writeLines(t, []string{jobLine(0)})
	for _, args := range [][]string{
		{"--nats-url", "nats://127.0.0.1:1", "--progress", "fancy", in},
		{"results", "--nats-url", "nats://127.0.0.1:1", "--progress", "fancy", "b-1"},
	} {
		env := quietEnv()
		if err := run(context.Background(), args, env); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), `--progress (or TINKERFLEET_PROGRESS) "fancy"`) {
			t.Errorf("%v: err = %v, want a usage error naming --progress", args, err)
		}
	}
}

func TestOpenOutputReadsBothFormats(t *testing.T) {
	t.Parallel()
	job := func(id, format string) jobs.Job {
		return jobs.Job{CustomID: id, Model: "m", Format: format, NumSamples: 1}
	}
	ok := func(j jobs.Job) jobs.Result {
		r := jobs.NewResult(j, "b")
		r.Samples = []jobs.Sample{{Text: "t", Tokens: []int{1}, StopReason: jobs.StopReasonStop}}
		r.Usage = &jobs.Usage{PromptTokens: 3, CompletionTokens: 1, CacheHitTokens: 2}
		return r
	}
	fail := func(j jobs.Job, code string, cat jobs.Category) jobs.Result {
		return jobs.ErrorResult(j, "b", jobs.ResultError{Code: code, Message: "m", Category: cat})
	}
	var file []byte
	for i, r := range []jobs.Result{
		ok(job("n-ok", jobs.FormatNative)),
		fail(job("n-err", jobs.FormatNative), jobs.CodeTokenize, jobs.CategoryUser),
		jobs.CancelledResult(job("n-cancel", jobs.FormatNative), "b", ""),
		ok(job("o-ok", jobs.FormatOpenAIChat)),
		fail(job("o-400", jobs.FormatOpenAICompletions), jobs.CodeContextTooLong, jobs.CategoryUser),
		fail(job("o-429", jobs.FormatOpenAIChat), jobs.CodeRateLimited, jobs.CategoryServer),
		fail(job("o-500", jobs.FormatOpenAIChat), jobs.CodeDeadLetter, jobs.CategoryServer),
		jobs.CancelledResult(job("o-cancel", jobs.FormatOpenAIChat), "b", ""),
		jobs.CancelledResult(job("o-cancel-2", jobs.FormatOpenAIChat), "b", ""),
		ok(job("n-ok", jobs.FormatNative)), // a duplicate is counted once
	} {
		var err error
		if i < 3 || i == 9 {
			file, err = r.AppendJSON(file)
		} else {
			file, err = r.AppendOpenAI(file, time.Unix(1, 0))
		}
		if err != nil {
			t.Fatal(err)
		}
		file = append(file, '\n')
	}
	path := filepath.Join(t.TempDir(), "out.jsonl")
	if err := os.WriteFile(path, append(file, `{"id":"batch_req_cut`...), 0o644); err != nil {
		t.Fatal(err)
	}
	// Another batch's file is refused, whatever format its lines are in, and left alone.
	if _, _, err := openOutput(path, "other", map[queue.JobKey]bool{}, &summary{}); !errors.Is(err, errOtherBatch) || !strings.Contains(err.Error(), "batch b ") {
		t.Fatalf("a file of batch b opened for batch other: %v", err)
	}
	openAIOnly := filepath.Join(t.TempDir(), "openai.jsonl")
	firstOpenAI := file[bytes.Index(file, []byte(`{"id":"batch_req_`)):]
	if err := os.WriteFile(openAIOnly, firstOpenAI, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := openOutput(openAIOnly, "other", map[queue.JobKey]bool{}, &summary{}); !errors.Is(err, errOtherBatch) {
		t.Fatalf("OpenAI lines of batch b opened for batch other: %v", err)
	}
	seen := map[queue.JobKey]bool{}
	var sum summary
	out, created, err := openOutput(path, "b", seen, &sum)
	if created {
		t.Error("openOutput says it created a file that was there")
	}
	if err != nil {
		t.Fatal(err)
	}
	out.Close()
	// The tokens are those of the two ok lines, one in each format.
	if want := (summary{ok: 2, failed: 4, cancelled: 3, tokens: queue.Tokens{Prompt: 6, Completion: 2, CacheHit: 4}}); sum != want || len(seen) != 9 {
		t.Fatalf("counted %+v over %d custom ids, want %+v over 9", sum, len(seen), want)
	}
	if data, err := os.ReadFile(path); err != nil || !bytes.Equal(data, file) {
		t.Fatalf("the cut last line was not dropped (%v)", err)
	}

	// Input lines are not results: the file is left alone.
	for _, line := range []string{
		`{"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}`,
		`{"custom_id": "q-1", "model": "m", "prompt": "p"}`,
	} {
		path := filepath.Join(t.TempDir(), "in.jsonl")
		if err := os.WriteFile(path, []byte(line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := openOutput(path, "b", map[queue.JobKey]bool{}, &summary{}); err == nil || !strings.Contains(err.Error(), "not a result") {
			t.Errorf("%s: err = %v", line, err)
		}
		if data, _ := os.ReadFile(path); string(data) != line+"\n" {
			t.Errorf("the file was changed: %q", data)
		}
	}
}

// TestOneJobIsCountedInTheSingular: a batch of one job says "1 job" and "1 result".
func TestOneJobIsCountedInTheSingular(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	f.startWorker(2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, stderr, err := f.submit(ctx, writeLines(t, []string{jobLine(0)}), "-o", filepath.Join(t.TempDir(), "out.jsonl"))
	if err != nil || !strings.Contains(stderr, ": 1 job submitted\n") || !strings.Contains(stderr, ": 1 result (1 ok, 0 error, 0 cancelled)") {
		t.Errorf("err %v, said:\n%s", err, stderr)
	}
}

// TestALocalRunWhoseKeyIsRevokedStopsAndGoesOnLater: when the service refuses the key after
// the local worker started (a 401 fault on asample and the heartbeat: the key revoked), submit
// stops at once with an error that says so and how to go on, instead of waiting for results
// that nothing brings; no job gets a result for it. Run again once the key is accepted, the
// same command finishes the batch, each job once.
func TestALocalRunWhoseKeyIsRevokedStopsAndGoesOnLater(t *testing.T) {
	t.Parallel()
	sim, url := fleettest.Sim(t, tinkersim.Config{})
	revoked, err := sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultUnauthorized, Endpoints: []string{"asample", "session_heartbeat"}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	env := &environment{getenv: tinkerAt(url), stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard}
	out := filepath.Join(dir, "out.jsonl")
	args := []string{"--local", "--data-dir", filepath.Join(dir, "data"), "--progress", "none", "../../examples/prompts.jsonl", "-o", out}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = run(ctx, args, env)
	if !errors.Is(err, errWorkerStopped) || !errors.Is(err, worker.ErrCredentialRefused) ||
		!strings.Contains(err.Error(), "run the same command again") || strings.Contains(err.Error(), fleettest.APIKey) {
		t.Fatalf("a run whose key the service refuses: %v", err)
	}
	if exitCode(err) != 1 {
		t.Fatalf("exit status %d, want 1", exitCode(err))
	}
	if data, err := os.ReadFile(out); len(data) != 0 || err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("results written while the key was refused: %q, %v", data, err)
	}

	sim.RemoveFault(revoked)
	if err := run(ctx, args, env); err != nil {
		t.Fatalf("the same command once the key is accepted: %v", err)
	}
	wantResults(t, out, 21, "ok")
}

// TestRenderableNamesTheModelField: a chat for a model without a known chat template is
// rejected at its model field, as the line spells it, and a thinking switch or reasoning
// effort that its template lacks at that field; prompts, known families and checkpoints
// (whose base model only the service knows) pass.
func TestRenderableNamesTheModelField(t *testing.T) {
	chat := []jobs.Message{{Role: jobs.RoleUser, Content: "hi"}}
	for _, tc := range []struct {
		job   jobs.Job
		field string // "" when accepted
	}{
		{jobs.Job{Model: "moonshotai/Kimi-K2-Thinking", Messages: chat}, "model"},
		{jobs.Job{Model: "moonshotai/Kimi-K2-Thinking", Messages: chat, Format: jobs.FormatOpenAIChat}, "body.model"},
		{jobs.Job{Model: "moonshotai/Kimi-K2-Thinking", Prompt: "hi"}, ""},
		{jobs.Job{Model: "deepseek-ai/DeepSeek-V3.1", Messages: chat}, ""},
		{jobs.Job{Model: "openai/gpt-oss-20b", Messages: chat, ReasoningEffort: "high"}, ""},
		{jobs.Job{Model: "openai/gpt-oss-20b", Messages: chat, Thinking: true}, "thinking"},
		{jobs.Job{Model: "openai/gpt-oss-20b", Messages: chat, Thinking: true, Format: jobs.FormatOpenAIChat}, "body.chat_template_kwargs"},
		{jobs.Job{Model: "Qwen/Qwen3-8B", Messages: chat, ReasoningEffort: "low"}, "reasoning_effort"},
		{jobs.Job{Model: "Qwen/Qwen3-8B", Messages: chat, ReasoningEffort: "low", Format: jobs.FormatOpenAIChat}, "body.reasoning_effort"},
		{jobs.Job{ModelPath: "tinker://run/sampler_weights/1", Messages: chat}, ""},
	} {
		fe := renderable(tc.job)
		switch {
		case tc.field == "" && fe != nil:
			t.Errorf("%+v rejected: %v", tc.job, fe)
		case tc.field != "" && (fe == nil || fe.Field != tc.field):
			t.Errorf("%+v: %v; want a field error at %s", tc.job, fe, tc.field)
		}
	}
}

// TestAManifestThatCannotBeWrittenAtTheEndFailsTheRun: when the batch's last manifest write
// (publishing → submitted) fails, submit says so and fails, rather than reporting the batch
// submitted while it stays "publishing" for status, list and delete.
func TestAManifestThatCannotBeWrittenAtTheEndFailsTheRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	q := bind(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := writeLines(t, jobLines(20000))
	w, err := q.Batches.Watch(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	sealed := make(chan error, 1)
	go func() { // the first manifest written (publishing): no write is taken after it
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			s, err := q.JS.Stream(ctx, "KV_"+q.Names.BatchesBucket())
			if err == nil {
				cfg := s.CachedInfo().Config
				cfg.Sealed = true
				_, err = q.JS.UpdateStream(ctx, cfg)
			}
			sealed <- err
			return
		}
	}()
	_, stderr, err := f.submit(ctx, in, "--batch-id", "mine", "--store-wait", "1s")
	if serr := <-sealed; serr != nil {
		t.Fatal(serr)
	}
	m, _, gerr := q.GetManifest(ctx, "mine")
	if gerr != nil || m.Status != queue.BatchPublishing {
		t.Fatalf("the manifest: %+v, %v; want it left publishing by the sealed bucket", m, gerr)
	}
	if err == nil || !strings.Contains(err.Error(), "manifest") {
		t.Fatalf("submit: %v (said %q) with the batch left %q; want an error about its manifest", err, stderr, m.Status)
	}
}

// TestLocalAndANATSURLTogetherAreRefused: --local runs its own server, so a --nats-url beside
// it on the command line was ignored without a word, and the batch went to a store the fleet
// never sees. NATS_URL from the environment (a shell set up for a fleet) is still left aside.
func TestLocalAndANATSURLTogetherAreRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	env := quietEnv()
	data := filepath.Join(dir, "data")
	url := "nats://user:s3cret@127.0.0.1:1"
	for _, args := range [][]string{
		{"--local", "--simulate", "--nats-url", url, "--data-dir", data, "../../examples/prompts.jsonl"},
		{"status", "--nats-url", url, "--local", "--data-dir", data, "b-x"},
		{"list", "--local", "--nats-url", url, "--data-dir", data},
	} {
		err := run(context.Background(), args, env)
		if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--local or --nats-url, not both") {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: the error shows the password: %v", args, err)
		}
	}
	if _, err := os.Stat(data); !os.IsNotExist(err) {
		t.Errorf("a refused command made the store %s (%v)", data, err)
	}

	vars := map[string]string{"NATS_URL": url}
	env.getenv = func(k string) string { return vars[k] }
	out := filepath.Join(dir, "results.jsonl")
	if err := run(context.Background(), []string{"--local", "--simulate", "--data-dir", data, "--progress", "none", "../../examples/prompts.jsonl", "-o", out}, env); err != nil {
		t.Fatalf("--local with NATS_URL in the environment: %v", err)
	}
	wantResults(t, out, 21, "ok")
}

// TestALineRefusedForItsChatTemplateLeavesItsCustomIDFree: a chat line refused because no chat
// template is known for its model is refused like any other invalid line, so it does not take
// its custom_id: a later line that uses it is published under --skip-invalid, not called a
// duplicate of a line that never was, and a third use names that later line as the first.
func TestALineRefusedForItsChatTemplateLeavesItsCustomIDFree(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 16})
	dir := t.TempDir()
	in := writeLines(t, []string{
		`{"custom_id":"c","url":"/v1/chat/completions","body":{"model":"moonshotai/Kimi-K2-Thinking","messages":[{"role":"user","content":"hi"}]}}`,
		`{"custom_id":"c","url":"/v1/chat/completions","body":{"model":"Qwen/Qwen3-8B","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":8}}`,
		`{"custom_id":"c","model":"Qwen/Qwen3-8B","prompt":"again"}`,
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rejects := filepath.Join(dir, "rejects.jsonl")
	f.startWorker(4)
	out := filepath.Join(dir, "results.jsonl")
	_, stderr, err := f.submit(ctx, "--skip-invalid", "--rejects", rejects, in, "-o", out)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	for _, want := range []string{
		in + `:1: field body.model: no chat template for model "moonshotai/Kimi-K2-Thinking"`,
		in + `:3: field custom_id: duplicate "c" (first used on line 2)`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, in+":2:") {
		t.Errorf("line 2 was refused:\n%s", stderr)
	}
	res := readResults(t, out)
	if len(res) != 1 || lineStatus(t, res["c"]) != "ok" {
		t.Fatalf("results = %v, want line 2's c ok", res)
	}
	data, err := os.ReadFile(rejects)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(data), "\n"); got != 2 || !strings.Contains(string(data), `"line":1,`) || !strings.Contains(string(data), `"line":3,`) {
		t.Fatalf("rejects file (%d lines):\n%s", got, data)
	}
}

// TestEverySubcommandsHelpSaysHowToCallIt: -h of each subcommand begins with its usage line,
// as submit's own does; list printed the flag package's "Usage of submit list:".
func TestEverySubcommandsHelpSaysHowToCallIt(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"status", "results", "failed", "cancel", "list", "delete", "tokenize"} {
		var stderr bytes.Buffer
		env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr}
		_ = run(context.Background(), []string{cmd, "-h"}, env)
		if !strings.HasPrefix(stderr.String(), "usage: submit "+cmd) {
			t.Errorf("submit %s -h begins %q", cmd, strings.SplitN(stderr.String(), "\n", 2)[0])
		}
	}
}

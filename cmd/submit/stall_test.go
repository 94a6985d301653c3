package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// watchedSubmit runs submit of n jobs into f's server in the background, with progress lines
// and a stall looked into after 200 ms without a result; it returns what it prints on stderr
// and its error, once it ends.
func watchedSubmit(t *testing.T, ctx context.Context, f *fleet, n int) (*fleettest.Buffer, <-chan error) {
	t.Helper()
	lines := jobLines(n)
	in := writeLines(t, lines)
	var stderr fleettest.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: &fleettest.Buffer{}, stderr: &stderr, tty: 0}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", f.nats, "--progress", "lines", "--progress-interval", "200ms",
			in, "-o", filepath.Join(t.TempDir(), "results.jsonl")}, env)
	}()
	return &stderr, done
}

// waitSaid waits until out holds want, failing after 30 s (the package's tests run in
// parallel, under -race: a worker's first job can take seconds to reach the service).
func waitSaid(t *testing.T, out *fleettest.Buffer, want string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("submit never said %q; it printed:\n%s", want, out)
		}
	}
}

// TestStalledBatchSaysNoWorkerTakesJobs: a batch whose results do not come says why, once
// for as long as the cause lasts: first that no worker ever joined the server, then, once
// one set up the consumer and left, that no worker takes jobs. A worker that then starts
// finishes the batch.
func TestStalledBatchSaysNoWorkerTakesJobs(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stderr, done := watchedSubmit(t, ctx, f, 3)
	waitSaid(t, stderr, "no worker has joined this NATS server yet: 3 jobs wait")

	fleettest.Queue(t, f.nats, queue.Config{}) // what a worker sets up when it starts
	waitSaid(t, stderr, "no worker is taking jobs: 3 jobs wait")
	time.Sleep(1500 * time.Millisecond) // several more looks at the same cause

	f.startWorker(4)
	if err := <-done; err != nil {
		t.Fatalf("submit: %v\n%s", err, stderr)
	}
	out := stderr.String()
	for _, said := range []string{"no worker has joined", "no worker is taking jobs"} {
		if n := strings.Count(out, said); n != 1 {
			t.Errorf("said %q %d times, want once:\n%s", said, n, out)
		}
	}
	if !strings.Contains(out, "3 results (3 ok, 0 error, 0 cancelled)") {
		t.Errorf("the batch did not finish once a worker came:\n%s", out)
	}
}

// TestStalledBatchSaysTheFleetIsPaused: a fleet paused by a 402 says so, with the time left,
// ahead of any other cause.
func TestStalledBatchSaysTheFleetIsPaused(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	q := fleettest.Queue(t, f.nats, queue.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pause, err := backoff.Open(ctx, q.JS, backoff.Config{Bucket: q.Names.BackoffBucket(), Account: backoff.AccountKey("https://tinker.example", "tml-k")})
	if err != nil {
		t.Fatal(err)
	}
	defer pause.Close()
	if err := pause.Signal(ctx, backoff.ReasonBilling, time.Hour); err != nil {
		t.Fatal(err)
	}
	stderr, done := watchedSubmit(t, ctx, f, 2)
	waitSaid(t, stderr, "the fleet is paused for 59m")
	waitSaid(t, stderr, "the Tinker service answers 402 (payment required)")
	cancel()
	<-done
}

// TestExamineNamesEachCause: what the server knows about a stalled batch names its likeliest
// cause, results an in-process worker cannot store first.
func TestExamineNamesEachCause(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	q := fleettest.Queue(t, f.nats, queue.Config{})
	ctx := context.Background()
	m := queue.Manifest{BatchID: "b-stall", Status: queue.BatchSubmitted, Jobs: 5, CreatedAt: time.Now()}
	if _, err := q.PutManifest(ctx, m, 0); err != nil {
		t.Fatal(err)
	}
	opening := false
	why := func(got int, held func() int) (stallKind, string) {
		t.Helper()
		var local *inProcess
		if held != nil {
			local = &inProcess{held: held, opening: func() bool { return opening }, dataDir: "data"}
		}
		s, err := examine(ctx, q, m, local)
		if err != nil {
			t.Fatal(err)
		}
		s.missing = m.Jobs - got
		return s.why(10 * time.Second)
	}
	if kind, text := why(3, nil); kind != stallGone || text != "2 results will never come: none of its jobs is left in the queue, and its results were removed from the NATS server" {
		t.Errorf("a batch without jobs in the queue: %v %q", kind, text)
	}
	if kind, text := why(3, func() int { return 7 }); kind != stallHeld || !strings.Contains(text, "holds 7 results that the NATS server cannot store") {
		t.Errorf("a worker holding results: %v %q", kind, text)
	}
	if kind, _ := why(3, func() int { return 0 }); kind != stallGone {
		t.Errorf("a worker holding none: %v, want the next cause", kind)
	}

	fleettest.Publish(t, q, m.BatchID, []jobs.Job{{CustomID: "j1", Model: "Qwen/Qwen3-8B", Prompt: "hi"}})
	if kind, text := why(0, nil); kind != stallNoWorker || !strings.Contains(text, "no worker is taking jobs: 1 job waits; start one") {
		t.Errorf("a fleet without workers: %v %q", kind, text)
	}
	if kind, text := why(0, func() int { return 0 }); kind != stallNoWorker || !strings.Contains(text, "the worker in this process takes no jobs: 1 job waits") {
		t.Errorf("a local run whose worker takes nothing: %v %q", kind, text)
	}
	opening = true
	if kind, text := why(0, func() int { return 0 }); kind != stallOpening || text != "1 job waits, and the worker in this process is still opening its Tinker session" {
		t.Errorf("a local run whose worker has not opened its session: %v %q", kind, text)
	}
	if _, text := (stall{missing: 1, waiting: 1, alone: true}).why(0); !strings.HasPrefix(text, "1 job waits, and no worker can take it: ") || !strings.HasSuffix(text, " to sample it") {
		t.Errorf("one job in a batch read by status --local: %q", text)
	}
	// A local run killed right after a 429 (the simulator's, or the service's) left a recent
	// pause: no worker here waits it out, and the run must be started again all the same.
	for _, left := range []time.Duration{-2 * time.Second, 3 * time.Second} {
		s := stall{missing: 3, waiting: 3, alone: true, pause: &backoff.Pause{Left: left, Reason: "rate_limited"}}
		if kind, text := s.why(statusLookBack); kind != stallNoWorker || !strings.HasPrefix(text, "3 jobs wait, and no worker can take them: ") {
			t.Errorf("a killed local run's batch after a pause %v from now: %v %q", left, kind, text)
		}
	}
}

// submitForStatus submits n jobs (jobLines) to f and returns what runs `submit status` on
// their batch, for as long as ctx lasts.
func submitForStatus(t *testing.T, ctx context.Context, f *fleet, n int) (status func() string) {
	t.Helper()
	stdout, _, err := f.submit(ctx, writeLines(t, jobLines(n)))
	if err != nil {
		t.Fatal(err)
	}
	batch := strings.TrimSpace(stdout)
	return func() string {
		t.Helper()
		out, _, err := f.submit(ctx, "status", batch)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
}

// TestStatusSaysWhatHoldsUpABatch: status names what holds up a batch that is not done (no
// worker, then jobs at a worker, then no worker running once it stopped) and the workers
// running.
func TestStatusSaysWhatHoldsUpABatch(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{BaseLatency: time.Minute})
	q := fleettest.Queue(t, f.nats, queue.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status := submitForStatus(t, ctx, f, 4)
	if out := status(); !regexp.MustCompile(`(?m)^activity +no worker is taking jobs: 4 jobs wait;`).MatchString(out) {
		t.Errorf("status without a worker:\n%s", out)
	}
	stop, _ := f.runWorker(q, 8)
	var out string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out = status()
		if strings.Contains(out, "activity  4 jobs at the workers\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status with the jobs at a worker:\n%s", out)
		}
	}
	host, _ := os.Hostname()
	if !strings.Contains(out, "workers   1 running ("+host+")\n") {
		t.Errorf("status does not name the running worker:\n%s", out)
	}

	// The worker stops and hands its jobs back. The server still counts them in flight until
	// another worker takes them, and no pull request waits, as when a worker's every slot is
	// busy: only the workers' presence tells the two apart.
	stop()
	if out := status(); !strings.Contains(out, "activity  no worker is running: 4 jobs wait; start one") || !strings.Contains(out, "workers   none running\n") {
		t.Errorf("status once the only worker stopped:\n%s", out)
	}
}

// TestAWorkerHoldingResultsOnAFullServerIsNotTakenForGone: a server whose store is full
// refuses the workers' presence notes as it refuses their results. Status asks the workers
// (queue.AskHeld), and names the worker that holds them, the full store and how to make room,
// rather than a worker that went silent.
func TestAWorkerHoldingResultsOnAFullServerIsNotTakenForGone(t *testing.T) {
	t.Parallel()
	srv := natsServer(t, server.Options{JetStreamMaxStore: 1 << 20})
	f := &fleet{t: t, nats: srv.ClientURL(), tok: builtinTokens()}
	f.sim, f.url = fleettest.Sim(t, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	submit := func(args ...string) string {
		t.Helper()
		stdout, stderr, err := f.submit(ctx, args...)
		if err != nil {
			t.Fatalf("submit %s: %v\n%s", args[0], err, stderr)
		}
		return stdout
	}
	batch := strings.TrimSpace(submit(writeLines(t, jobLines(20))))

	// Fill the store, then start a worker: it samples its jobs and holds their results.
	q := fleettest.Queue(t, f.nats, queue.Config{})
	if _, err := q.JS.CreateStream(ctx, jetstream.StreamConfig{Name: "BALLAST", Subjects: []string{"ballast"}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if _, err := q.JS.Publish(ctx, "ballast", make([]byte, 4096)); queue.StoreFull(err) {
			break
		} else if err != nil || i == 1000 {
			t.Fatalf("ballast %d: %v", i, err)
		}
	}
	f.startWorker(4)

	host, _ := os.Hostname()
	want := fmt.Sprintf("activity  a worker on %s holds 4 results that the NATS server cannot store, for ", host)
	var out string
	defer func() {
		if t.Failed() {
			t.Logf("the last status:\n%s", out)
		}
	}()
	fleettest.Eventually(t, 30*time.Second, "status naming the held results", func() bool {
		out = submit("status", batch)
		return strings.Contains(out, want)
	})
	if !strings.Contains(out, "its JetStream store is full; make room (delete finished batches: submit delete; or raise the server's max_file_store)") {
		t.Errorf("status does not say that the store is full and how to make room:\n%s", out)
	}
}

// TestHeldPhraseSaysWhatMakesRoom: held results are named with who holds them, for how long,
// and what to do, which depends on whether the store is full and whether the server is the
// embedded one.
func TestHeldPhraseSaysWhatMakesRoom(t *testing.T) {
	t.Parallel()
	full := queue.HeldReport{Host: "w-1", Held: 400, For: 42 * time.Second, Full: true, Error: "insufficient resources"}
	noAck := queue.HeldReport{Host: "w-2", Held: 100, For: 3 * time.Second, Error: "no ack from the stream within 5s"}
	for _, c := range []struct {
		s    stall
		want string
	}{
		{stall{held: 400, holders: []queue.HeldReport{full}},
			"a worker on w-1 holds 400 results that the NATS server cannot store, for 42s: its JetStream store is full; make room (delete finished batches: submit delete; or raise the server's max_file_store)"},
		{stall{held: 500, holders: []queue.HeldReport{noAck, full}},
			"2 workers hold 500 results that the NATS server cannot store, for 42s: its JetStream store is full"},
		{stall{held: 100, holders: []queue.HeldReport{noAck}},
			"a worker on w-2 holds 100 results that the NATS server cannot store, for 3s (no ack from the stream within 5s); they are tried again until the stream answers"},
		{stall{held: 400, holders: []queue.HeldReport{full}, local: true, dataDir: "/data/tf"},
			"the worker holds 400 results that the NATS server cannot store, for 42s: its store is full; delete finished batches (submit delete) or free disk space where /data/tf is, and they are stored within seconds"},
		{stall{held: 100, holders: []queue.HeldReport{noAck}, local: true, dataDir: "/data/tf"},
			"the worker holds 100 results that the NATS server cannot store, for 3s (no ack from the stream within 5s): is the disk of /data/tf full?"},
		{stall{held: 7, local: true}, "the worker holds 7 results that the NATS server cannot store (is its disk full?)"},
	} {
		if got := c.s.heldPhrase(); !strings.HasPrefix(got, c.want) {
			t.Errorf("heldPhrase(%+v) =\n%q\nwant it to begin\n%q", c.s.holders, got, c.want)
		}
	}
}

// TestStallWithoutBackoffPermissionStillSaysWhy: a submit user whose permissions do not reach
// the backoff bucket still learns that no worker takes jobs.
func TestStallWithoutBackoffPermissionStillSaysWhy(t *testing.T) {
	t.Parallel()
	srv := natsServer(t, server.Options{Users: []*server.User{
		{Username: "admin", Password: "a"},
		{Username: "submit", Password: "s", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.CONSUMER.CREATE.KV_tinkerfleet_backoff.>"}}}},
	}})
	q := fleettest.Queue(t, srv.ClientURL(), queue.Config{}, nats.UserInfo("admin", "a")) // as a worker would
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fb, err := backoff.Open(ctx, q.JS, backoff.Config{Bucket: q.Names.BackoffBucket(), Account: "acct"})
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()

	var stderr fleettest.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: &fleettest.Buffer{}, stderr: &stderr, tty: 0}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", srv.ClientURL(), "--nats-user", "submit", "--nats-password", "s",
			"--progress", "lines", "--progress-interval", "200ms", writeLines(t, []string{jobLine(0)}), "--wait"}, env)
	}()
	waitSaid(t, &stderr, "no worker is taking jobs: 1 job waits")
	cancel()
	<-done
}

// TestStalledBatchSaysWhyJobsAreTriedAgain: a batch whose jobs fail and wait for another
// delivery says why, in the words of the failure the worker met: its log may be on another
// machine, and the jobs are tried again for some twenty minutes before they end.
func TestStalledBatchSaysWhyJobsAreTriedAgain(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Faults: []tinkersim.Fault{
		{Kind: tinkersim.FaultFailed, Category: "server", Reason: "the backend fell over"}}})
	f.startWorker(4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stderr, done := watchedSubmit(t, ctx, f, 2)
	waitSaid(t, stderr, "2 jobs at the workers; some of its jobs failed and wait to be tried again, the last ")
	out := stderr.String()
	if !regexp.MustCompile(`the last \d+s ago: "job-0000[01]" on delivery 1 of 10, again in [1-5]s: .*the backend fell over`).MatchString(out) {
		t.Errorf("the retry is not named with its job, delivery, wait and cause:\n%s", out)
	}
	cancel()
	<-done
}

// TestStalledBatchSaysTheServiceFailsRequests: a service that answers 503 keeps a batch's
// jobs at the workers, whose client retries the requests for minutes; submit says so, with
// the request and the service's answer.
func TestStalledBatchSaysTheServiceFailsRequests(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Faults: []tinkersim.Fault{
		{Kind: tinkersim.FaultServerError, Status: 503, Endpoints: []string{"asample"}}}})
	f.startWorker(4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stderr, done := watchedSubmit(t, ctx, f, 2)
	waitSaid(t, stderr, "2 jobs at the workers; the Tinker service fails requests, which the workers try again: the last ")
	if out := stderr.String(); !regexp.MustCompile(`the last \d+s ago, asample answered 503, (again in \d+s|due now): tinker: POST asample: error code 503`).MatchString(out) {
		t.Errorf("the failing request is not named with the service's answer:\n%s", out)
	}
	cancel()
	<-done
}

// TestStallCountsInTheSingular: one job is "1 job", not "1 jobs".
func TestStallCountsInTheSingular(t *testing.T) {
	t.Parallel()
	s := stall{missing: 1, waiting: 1, inFlight: 1, maxInFlight: 1000, queued: 1}
	if _, text := s.why(10 * time.Second); text != "1 job at the workers; 1 job of other batches queued or at work" {
		t.Errorf("one job at the workers and one of another batch: %q", text)
	}
	s = stall{missing: 2, waiting: 2, noConsumer: true}
	if _, text := s.why(10 * time.Second); !strings.Contains(text, ": 2 jobs wait;") {
		t.Errorf("two jobs waiting: %q", text)
	}
}

// TestStalledBatchSaysTheWorkersCannotReachTheService: a worker that cannot reach the Tinker
// service retries its start for minutes and takes no jobs; submit says both.
func TestStalledBatchSaysTheWorkersCannotReachTheService(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := fleettest.Queue(t, f.nats, queue.Config{}) // set up by the worker before it dials Tinker
	opened := make(chan struct{})
	go func() { // Open retries the service until ctx ends
		defer close(opened)
		if w, err := worker.Open(ctx, worker.Config{Queue: q, TinkerBaseURL: gone.URL, TinkerAPIKey: fleettest.APIKey, Tokenizers: f.tok}); err == nil {
			w.Close()
		}
	}()
	stderr, done := watchedSubmit(t, ctx, f, 2)
	waitSaid(t, stderr, "no worker is taking jobs: 2 jobs wait, and the Tinker service fails the workers' requests: the last ")
	if out := stderr.String(); !strings.Contains(out, "client/config did not reach it") || !strings.Contains(out, "connection refused") {
		t.Errorf("the request and why it failed are not named:\n%s", out)
	}
	cancel()
	<-done
	<-opened
}

// TestStalledBatchSaysTheServiceRefusesTheWorkersKey: a worker whose key the service refuses
// (revoked after it started) stops, and submit says why no worker takes the batch's jobs:
// the refusal, and that it stopped a worker.
func TestStalledBatchSaysTheServiceRefusesTheWorkersKey(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Faults: []tinkersim.Fault{
		{Kind: tinkersim.FaultUnauthorized, Endpoints: []string{"asample", "session_heartbeat"}}}})
	f.startWorker(4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stderr, done := watchedSubmit(t, ctx, f, 2)
	waitSaid(t, stderr, "2 jobs wait, and the Tinker service refuses the workers' key: the last ")
	if out := stderr.String(); !regexp.MustCompile(`the last \d+s ago, session_heartbeat answered 401, and a worker stopped: the service refused the API key \(check TINKER_API_KEY`).MatchString(out) {
		t.Errorf("the refusal that stopped the worker is not named:\n%s", out)
	}
	cancel()
	<-done
}

// TestAStoppedWorkersNoteExplainsTheStallItBegan: a worker that stopped on a refused key
// leaves its note about when its last results came, a moment before or after the last one
// read; that note is why results stopped. One stored well before (results came after it)
// is not.
func TestAStoppedWorkersNoteExplainsTheStallItBegan(t *testing.T) {
	t.Parallel()
	now := time.Now()
	note := queue.ServiceNote{Endpoint: "session_heartbeat", Status: 401, Error: "the service refused the API key", Stopped: true}
	s := stall{missing: 5, waiting: 5, inFlight: 5, trouble: &note, now: now}
	note.At = now.Add(-11 * time.Second) // the results stopped 10 s ago
	if kind, text := s.why(10 * time.Second); kind != stallKeyRefused || !strings.Contains(text, "5 jobs wait, and the Tinker service refuses the workers' key: the last 11s ago, session_heartbeat answered 401, and a worker stopped") {
		t.Errorf("a note a second before the results stopped: %v %q", kind, text)
	}
	note.At = now.Add(-time.Minute)
	if kind, text := s.why(10 * time.Second); kind != stallAtWorkers {
		t.Errorf("a note from before the last results: %v %q", kind, text)
	}
}

// TestARefusedKeyStaysTheCauseWhileNoWorkerRuns: a refused key's note is why no worker runs
// however old it is (a fleet crash-looping in Kubernetes restarts minutes apart), as long as
// no worker runs: a worker that opens its session removes the note (queue.ForgetKeyRefusal).
func TestARefusedKeyStaysTheCauseWhileNoWorkerRuns(t *testing.T) {
	t.Parallel()
	now := time.Now()
	note := queue.ServiceNote{Endpoint: "client/config", Status: 401, Error: "the service refused the API key", Stopped: true,
		At: now.Add(-time.Hour)}
	s := stall{missing: 5, waiting: 5, trouble: &note, now: now, attendance: &queue.Attendance{Now: now}}
	want := "no worker is running: 5 jobs wait; the Tinker service refused the workers' key, and no worker has opened a session since: the last 1h0m0s ago, client/config answered 401, and a worker stopped: the service refused the API key"
	if kind, text := s.why(10 * time.Second); kind != stallKeyRefused || text != want {
		t.Errorf("an hour-old refusal, no worker running: %v %q", kind, text)
	}
	s.attendance.Running = []queue.Presence{{Worker: "w1", Host: "a", At: now}}
	if kind, text := s.why(10 * time.Second); kind == stallKeyRefused {
		t.Errorf("an hour-old refusal while a worker runs: %v %q", kind, text)
	}
	s.attendance, s.trouble = &queue.Attendance{Now: now}, &queue.ServiceNote{Endpoint: "asample", Status: 503, At: note.At}
	if kind, text := s.why(10 * time.Second); kind == stallKeyRefused || kind == stallServiceFails {
		t.Errorf("an hour-old 503, no worker running: %v %q", kind, text)
	}
}

// TestJobsInFlightWithNoWorkerRunningSayNoWorkerRuns: jobs a stopped or crashed worker held
// stay in flight, with no pull request, as the jobs of a fleet whose every slot is busy do.
// The workers' presence tells the two apart; a fleet that keeps no notes reads as before.
func TestJobsInFlightWithNoWorkerRunningSayNoWorkerRuns(t *testing.T) {
	t.Parallel()
	now := time.Now()
	s := stall{missing: 40, waiting: 40, inFlight: 12, now: now}
	if kind, text := s.why(10 * time.Second); kind != stallAtWorkers || text != "12 jobs at the workers" {
		t.Errorf("nobody can tell whether a worker runs: %v %q", kind, text)
	}
	s.attendance = &queue.Attendance{Now: now, Running: []queue.Presence{{Worker: "w1", Host: "a", At: now}}}
	if kind, text := s.why(10 * time.Second); kind != stallAtWorkers || text != "12 jobs at the workers" {
		t.Errorf("a worker runs: %v %q", kind, text)
	}
	s.attendance.Running = nil
	if kind, text := s.why(10 * time.Second); kind != stallNoWorker || text != "no worker is running: 40 jobs wait; start one, or see in the workers' logs why they stopped" {
		t.Errorf("no worker runs: %v %q", kind, text)
	}
	s.pulls = 1 // a worker that keeps no notes (an older version) asks for jobs
	if kind, _ := s.why(10 * time.Second); kind != stallAtWorkers {
		t.Errorf("a pull request waits: %v", kind)
	}

	// Workers that went silent (crashed) hold their jobs until the ack wait has passed.
	s.ackWait = 30 * time.Second
	s.attendance.Running = []queue.Presence{{Worker: "w1", Host: "a", At: now}}
	s.attendance.Silent = []queue.Presence{{Worker: "w2", Host: "b", At: now.Add(-20 * time.Second)}}
	if kind, text := s.why(10 * time.Second); kind != stallSilent || text != "12 jobs at the workers; a worker on b went silent 20s ago without handing back its jobs, which go out again once their ack wait (30s, --ack-wait) has passed" {
		t.Errorf("a worker went silent: %v %q", kind, text)
	}
	s.attendance.Silent = append(s.attendance.Silent, queue.Presence{Worker: "w3", Host: "c", At: now.Add(-17 * time.Second)})
	if kind, text := s.why(10 * time.Second); kind != stallSilent || text != "12 jobs at the workers; 2 workers went silent, the last 17s ago on c, without handing back their jobs, which go out again once their ack wait (30s, --ack-wait) has passed" {
		t.Errorf("two workers went silent: %v %q", kind, text)
	}

	// None runs, and some went silent, a crash or a link cut: that is where to look.
	s.attendance.Running = nil
	s.pulls = 0
	if kind, text := s.why(10 * time.Second); kind != stallNoWorker || text != "no worker is running: 40 jobs wait; 2 workers went silent, the last 17s ago on c (they crashed, or lost their link to the NATS server): start one, or see their logs" {
		t.Errorf("no worker runs, two went silent: %v %q", kind, text)
	}
	s.attendance.Silent = s.attendance.Silent[1:]
	if kind, text := s.why(10 * time.Second); kind != stallNoWorker || text != "no worker is running: 40 jobs wait; a worker on c went silent 17s ago (it crashed, or lost its link to the NATS server): start one, or see its log" {
		t.Errorf("no worker runs, one went silent: %v %q", kind, text)
	}
}

// TestStatusNamesAWorkerThatWentSilentWithItsJobs: a worker that crashed holding jobs keeps
// them until their ack wait has passed; status says so, and counts the worker still running.
// It waits for the crashed worker's note to age past queue.PresenceWindow (15 s).
func TestStatusNamesAWorkerThatWentSilentWithItsJobs(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{AckWait: time.Minute}, tinkersim.Config{BaseLatency: time.Minute})
	q := fleettest.Queue(t, f.nats, f.qcfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	status := submitForStatus(t, ctx, f, 3)
	_, kill := f.runWorker(q, 8)
	fleettest.Eventually(t, 20*time.Second, "the jobs at the worker", func() bool { return strings.Contains(status(), "activity  3 jobs at the workers\n") })
	f.startWorker(8)
	kill() // a crash: the connection goes first, and the worker removes no note

	host, _ := os.Hostname()
	want := "activity  3 jobs at the workers; a worker on " + host + " went silent "
	var out string
	fleettest.Eventually(t, 30*time.Second, "status naming the silent worker", func() bool {
		out = status()
		return strings.Contains(out, want)
	})
	if !strings.Contains(out, "without handing back its jobs, which go out again once their ack wait (1m0s, --ack-wait) has passed\n") ||
		!strings.Contains(out, "workers   1 running ("+host+")\n") {
		t.Errorf("status with one worker crashed and one running:\n%s", out)
	}
}

// TestResultsToStandardOutputShowProgress: `results --wait` writing to standard output (a
// pipe, a file) shows its progress on standard error, and says why results do not come, as
// it does with -o.
func TestResultsToStandardOutputShowProgress(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	batch, _, err := f.submit(ctx, writeLines(t, jobLines(3)))
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr fleettest.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, tty: 0}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"results", "--nats-url", f.nats, strings.TrimSpace(batch), "--wait", "--progress", "lines", "--progress-interval", "200ms"}, env)
	}()
	waitSaid(t, &stderr, "no worker has joined this NATS server yet: 3 jobs wait")
	f.startWorker(4)
	if err := <-done; err != nil {
		t.Fatalf("results: %v\n%s", err, stderr.String())
	}
	if n := strings.Count(stdout.String(), "\n"); n != 3 {
		t.Errorf("%d result lines on standard output, want 3:\n%s", n, stdout.String())
	}
	if strings.Contains(stdout.String(), "no worker") {
		t.Errorf("progress went to standard output:\n%s", stdout.String())
	}

	// With --progress auto and standard error off a terminal (under nohup, the results' own
	// file), nothing but the final line.
	var said fleettest.Buffer
	env.stderr = &said
	if err := run(ctx, []string{"results", "--nats-url", f.nats, strings.TrimSpace(batch), "--wait", "--progress-interval", "200ms"}, env); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(said.String(), "\n"); lines != 1 {
		t.Errorf("results --progress auto off a terminal said %d lines, want the final one:\n%s", lines, said.String())
	}
}

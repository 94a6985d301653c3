package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/share"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// violations collects the permission errors the server sends to one connection.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.errs = append(v.errs, err.Error())
}

func (v *violations) list() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.errs...)
}

// matching lists the collected errors that mention subject.
func (v *violations) matching(subject string) []string {
	var out []string
	for _, e := range v.list() {
		if strings.Contains(e, subject) {
			out = append(out, e)
		}
	}
	return out
}

// startFromConfig starts one server from deploy/nats/nats-1.conf (and what it includes), on
// loopback with a random port, a temporary store and no cluster. A prefix other than the
// default uses the auth.conf that deploy/nats/auth-for-prefix.sh makes for it.
func startFromConfig(t *testing.T, prefix string) *server.Server {
	t.Helper()
	for _, role := range []string{"ADMIN", "SUBMIT", "WORKER"} {
		t.Setenv("NATS_"+role+"_PASSWORD", "pw-"+strings.ToLower(role))
	}
	deployDir := filepath.Join("..", "..", "deploy", "nats")
	conf := filepath.Join(deployDir, "nats-1.conf")
	if prefix != queue.DefaultPrefix {
		dir := t.TempDir()
		for _, name := range []string{"nats-1.conf", "cluster.conf"} {
			data, err := os.ReadFile(filepath.Join(deployDir, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		auth, err := exec.Command("bash", filepath.Join(deployDir, "auth-for-prefix.sh"), prefix).Output()
		if err != nil {
			t.Fatalf("auth-for-prefix.sh %s: %v", prefix, err)
		}
		if err := os.WriteFile(filepath.Join(dir, "auth.conf"), auth, 0o600); err != nil {
			t.Fatal(err)
		}
		conf = filepath.Join(dir, "nats-1.conf")
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.Users) != 3 {
		t.Fatalf("config has %d users, want admin, submit and worker", len(opts.Users))
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.Cluster, opts.Routes = server.ClusterOpts{}, nil
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start() // stopped at cleanup
	if !srv.ReadyForConnections(30 * time.Second) {
		t.Fatal("server from deploy/nats/nats-1.conf not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// connectAs connects as user and returns a JetStream context and the permission errors the
// connection receives.
func connectAs(t *testing.T, srv *server.Server, user string) (jetstream.JetStream, *violations) {
	t.Helper()
	v := &violations{}
	nc, err := queue.Connect(queue.ConnectConfig{URL: srv.ClientURL(), Name: user, User: user, Password: "pw-" + user},
		nats.ErrorHandler(v.handler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js, v
}

// TestNATSConfigPermissions runs submit's and a worker's calls under the users of
// deploy/nats/auth.conf: normal work meets no permission violation, submit cannot take a
// job, and only admin can delete a stream. It does so for the default prefix and, with
// auth-for-prefix.sh's rendering, for another.
func TestNATSConfigPermissions(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the deploy NATS config into a server; skipped with -short")
	}
	for _, prefix := range []string{queue.DefaultPrefix, "acme-ml"} {
		t.Run(prefix, func(t *testing.T) { testNATSConfigPermissions(t, prefix) })
	}
}

func testNATSConfigPermissions(t *testing.T, prefix string) {
	srv := startFromConfig(t, prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	if _, err := queue.Connect(queue.ConnectConfig{URL: srv.ClientURL(), User: "worker", Password: "wrong"}); err == nil {
		t.Fatal("a wrong password was accepted")
	}

	// submit comes first, as on a fresh cluster: it creates what is missing (queue.Bind),
	// writes a manifest and publishes the jobs.
	subJS, subV := connectAs(t, srv, "submit")
	sub, err := queue.Bind(ctx, subJS, queue.Config{Prefix: prefix})
	if err != nil {
		t.Fatalf("submit: bind: %v", err)
	}
	const batch, total = "perm", 20
	if _, err := sub.PutManifest(ctx, queue.Manifest{BatchID: batch, Status: queue.BatchSubmitted, Jobs: total, CreatedAt: time.Now()}, 0); err != nil {
		t.Fatalf("submit: manifest: %v", err)
	}
	publishJobs(t, sub, batch, makeJobs(total))

	// The worker sets up the consumer (submit never does).
	wJS, wV := connectAs(t, srv, "worker")
	wq, err := queue.Setup(ctx, wJS, queue.Config{Prefix: prefix})
	if err != nil {
		t.Fatalf("worker: setup: %v", err)
	}

	// submit may look at the consumer but not pull from it nor make one of its own.
	subCons, err := subJS.Consumer(ctx, sub.Names.JobsStream(), queue.ConsumerName)
	if err != nil {
		t.Fatalf("submit: consumer info: %v", err)
	}
	msgs, err := subCons.Fetch(1, jetstream.FetchMaxWait(time.Second))
	if err == nil {
		for m := range msgs.Messages() {
			t.Errorf("submit pulled job %s", m.Subject())
		}
	}
	fleettest.Eventually(t, 10*time.Second, "a permission violation for submit's pull", func() bool {
		return len(subV.matching("$JS.API.CONSUMER.MSG.NEXT."+sub.Names.JobsStream())) > 0
	})
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err = subJS.CreateOrUpdateConsumer(short, sub.Names.JobsStream(), jetstream.ConsumerConfig{Durable: "thief", AckPolicy: jetstream.AckExplicitPolicy})
	cancelShort()
	if err == nil {
		t.Error("submit created a consumer on the jobs stream")
	}
	for _, js := range []jetstream.JetStream{subJS, wJS} {
		short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
		err := js.DeleteStream(short, sub.Names.JobsStream())
		cancelShort()
		if err == nil {
			t.Fatal("a non-admin user deleted the jobs stream")
		}
	}
	if info, err := sub.Jobs.Info(ctx); err != nil || info.State.Msgs != total {
		t.Fatalf("jobs stream after the attempts: %v, err %v; want %d jobs waiting", info, err, total)
	}
	subBefore, wBefore := len(subV.list()), len(wV.list())

	// A worker that stops with a job on its last delivery publishes it again, so that it does
	// not end as a dead letter although it never failed: a job taken by it, published again.
	puller, err := wq.NewJobPuller(ctx)
	if err != nil {
		t.Fatalf("worker: puller: %v", err)
	}
	var taken []jetstream.Msg
	if _, err := puller.Pull(ctx, 1, 5*time.Second, func(m jetstream.Msg) { taken = append(taken, m) }); err != nil || len(taken) != 1 {
		t.Fatalf("worker: pull: %d jobs, %v", len(taken), err)
	}
	if err := wq.PublishAgain(ctx, taken[0]); err != nil {
		t.Errorf("worker: publish a job again, on its last delivery: %v", err)
	}
	_ = puller.Close(nil)
	if info, err := sub.Jobs.Info(ctx); err != nil || info.State.Msgs != total {
		t.Fatalf("jobs stream after a job was published again: %v, err %v; want %d jobs waiting", info, err, total)
	}

	// Normal work: a worker runs the batch, submit follows the results, lists batches and
	// cancels one; none of it may hit a permission violation.
	// A 429 to the first sample makes the worker signal the fleet backoff (a KV write). Not
	// a 300 ms window from the injection: a worker slower to start on a loaded machine sent
	// its first sample after it, met no 429 and signalled nothing.
	sim, simURL := startSim(t, tinkersim.Config{Capacity: 16})
	if _, err := sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultRateLimit, Count: 1}); err != nil {
		t.Fatal(err)
	}
	runWorker(t, wq, simURL, 8)
	fleettest.Eventually(t, 60*time.Second, "every result", func() bool {
		n, err := sub.ResultsStored(ctx, batch)
		return err == nil && n == total
	})
	counts, _ := readResults(t, sub, batch)
	if len(counts) != total {
		t.Errorf("submit read %d results, want %d", len(counts), total)
	}
	if _, err := sub.Manifests(ctx); err != nil {
		t.Errorf("submit: list: %v", err)
	}
	if n, err := sub.ResultsStored(ctx, batch); err != nil || n != total {
		t.Errorf("submit: list's result count = %d, %v; want %d", n, err, total)
	}
	if _, err := sub.UpdateManifest(ctx, batch, func(m *queue.Manifest) error { m.Status = queue.BatchCancelled; return nil }); err != nil {
		t.Errorf("submit: cancel: %v", err)
	}
	if _, err := sub.Jobs.Info(ctx, jetstream.WithSubjectFilter(sub.Names.JobSubject(batch))); err != nil {
		t.Errorf("submit: status: %v", err)
	}
	// Why a batch makes no progress: the workers' consumer and the fleet's backoff, which the
	// worker signalled for the 429.
	if _, err := subCons.Info(ctx); err != nil {
		t.Errorf("submit: workers' consumer info: %v", err)
	}
	if pauses, err := backoff.Pauses(ctx, subJS, sub.Names.BackoffBucket()); err != nil || len(pauses) != 1 || pauses[0].Reason != backoff.ReasonRateLimited {
		t.Errorf("submit: the fleet's backoff: %+v, %v; want the worker's one pause for a 429", pauses, err)
	}
	// Whether a worker runs: the worker notes its presence, submit reads the notes.
	if a, known, err := sub.Present(ctx, queue.PresenceWindow, queue.PresenceWindow); err != nil || !known || len(a.Running) != 1 {
		t.Errorf("submit: the workers running: %+v (known %v), %v; want the one worker", a, known, err)
	}
	// Which results the workers hold that the server cannot store: submit asks over core
	// NATS, and a worker that holds some answers to submit's inbox (one answer per connection:
	// the server allows one response to a request a connection received).
	heldJS, heldV := connectAs(t, srv, "worker")
	answering, err := (&queue.Queue{JS: heldJS, Names: wq.Names}).AnswerHeld(func() (queue.HeldReport, bool) { return queue.HeldReport{Held: 3}, true })
	if err != nil {
		t.Fatalf("worker: answer for held results: %v", err)
	}
	if err := heldJS.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if got, err := sub.AskHeld(ctx, 2*time.Second); err != nil || len(got) != 1 || got[0].Held != 3 {
		t.Errorf("submit: ask which results the workers hold: %+v, %v; want the one answer", got, err)
	}
	_ = answering.Unsubscribe()
	// A capacity round (internal/share) as the worker: its report, and the round read back.
	board, err := share.Open(ctx, wJS, sub.Names.BackoffBucket(), "perm-account", share.Config{})
	if err != nil {
		t.Fatalf("worker: share board: %v", err)
	}
	if s, err := board.Split(ctx, share.Report{Peak: 4, Want: 8}); err != nil || s.Part != 4 {
		t.Errorf("worker: capacity round = %+v, %v; want its own 4", s, err)
	}
	// Watching for workers that leave: a watch the user may not make fails (its consumer is
	// not created); one it may runs until its context ends.
	watchCtx, stopWatch := context.WithTimeout(ctx, 2*time.Second)
	if err := board.WatchLeaves(watchCtx, func(string) {}); err != nil {
		t.Errorf("worker: watch the share board: %v", err)
	}
	stopWatch()
	if err := board.Close(ctx); err != nil {
		t.Errorf("worker: close share board: %v", err)
	}
	// A job put off after a failure, and a request the service failed: the worker notes why,
	// and submit reads the notes.
	if err := wq.NoteRetry(batch, queue.RetryNote{CustomID: "j-1", Delivery: 1, MaxDeliver: 10, RetryInMS: 5000, Error: "hub down"}); err != nil {
		t.Errorf("worker: note a retry: %v", err)
	}
	if err := wq.NoteServiceRetry(queue.ServiceNote{Endpoint: "asample", Status: 503, RetryInMS: 1000, Error: "unavailable"}); err != nil {
		t.Errorf("worker: note a service failure: %v", err)
	}
	fleettest.Eventually(t, 10*time.Second, "submit reading the worker's retry and service notes", func() bool {
		n, err := sub.ReadNotes(ctx, batch)
		return err == nil && n.Retry != nil && n.Retry.Error == "hub down" && n.Service != nil && n.Service.Status == 503
	})
	time.Sleep(200 * time.Millisecond) // let late asynchronous errors arrive
	if v := subV.list()[subBefore:]; len(v) > 0 {
		t.Errorf("submit met permission violations in normal work: %q", v)
	}
	if v := append(wV.list()[wBefore:], heldV.list()...); len(v) > 0 {
		t.Errorf("worker met permission violations in normal work: %q", v)
	}

	// Deleting a batch purges streams: submit may not, and changes nothing; admin may. The
	// server does not answer a refused request: submit learns of the refusal from the
	// connection's error, well before the request's deadline.
	delCtx, cancelDel := context.WithTimeout(ctx, 60*time.Second)
	defer cancelDel()
	start := time.Now()
	if err := sub.DeleteBatch(delCtx, batch); err == nil || !strings.Contains(err.Error(), "needs a NATS user that may purge streams") || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("submit: delete: %v; want it refused, saying why", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("submit's refused delete took %v: it waited for the request's deadline", took)
	}
	if m, _, err := sub.GetManifest(ctx, batch); err != nil || m.Status == queue.BatchDeleted {
		t.Errorf("submit's refused delete marked the batch: %+v, %v", m, err)
	}

	// admin can do what the others cannot.
	adminJS, _ := connectAs(t, srv, "admin")
	adminQ, err := queue.Bind(ctx, adminJS, queue.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if err := adminQ.DeleteBatch(ctx, batch); err != nil {
		t.Errorf("admin: delete batch: %v", err)
	}
	if n, err := adminQ.ResultsStored(ctx, batch); err != nil || n != 0 {
		t.Errorf("%d results left after admin deleted the batch (%v)", n, err)
	}
	if n, err := adminQ.ReadNotes(ctx, batch); n.Retry != nil || err != nil {
		t.Errorf("the retry note left after admin deleted the batch: %+v (%v)", n.Retry, err)
	}
	kv, err := adminJS.KeyValue(ctx, sub.Names.BackoffBucket())
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := kv.Keys(ctx); err != nil || len(keys) == 0 {
		t.Errorf("backoff bucket keys %v, err %v: the worker never signalled the 429", keys, err)
	}
	if err := adminJS.DeleteStream(ctx, sub.Names.DeadStream()); err != nil {
		t.Errorf("admin: delete stream: %v", err)
	}
	if _, err := adminJS.Stream(ctx, sub.Names.DeadStream()); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("dead stream after admin deleted it: %v", err)
	}
}

// TestAuthForPrefixRefusesToWriteTheFileItReads: "auth-for-prefix.sh P > auth.conf" empties
// auth.conf before the script reads it, and a server loads an empty auth.conf as no users at
// all. The script fails then, naming the file, as it does on any auth.conf without users.
func TestAuthForPrefixRefusesToWriteTheFileItReads(t *testing.T) {
	t.Parallel()
	script, err := filepath.Abs(filepath.Join("..", "..", "deploy", "nats", "auth-for-prefix.sh"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "nats", "auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(conf, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", "-c", `"$0" acme-ml "$1" > "$1"`, script, conf).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the file it reads") {
		t.Fatalf("writing into its input: %v, %s", err, out)
	}
	// Its own output for another prefix names none of the default prefix's streams: renaming
	// again would change the header only.
	renamed := filepath.Join(t.TempDir(), "auth.conf")
	out, err = exec.Command("bash", "-c", `"$0" acme-ml > "$1"`, script, renamed).CombinedOutput()
	if err != nil {
		t.Fatalf("auth-for-prefix.sh acme-ml: %v, %s", err, out)
	}
	out, err = exec.Command("bash", "-c", `"$0" beta "$1" > /dev/null`, script, renamed).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "names no stream of the default prefix") {
		t.Fatalf("renaming its own output again: %v, %s", err, out)
	}
	// The file is now empty, as the shell left it: a second run on it fails too.
	out, err = exec.Command("bash", script, "acme-ml", conf).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "holds no authorization block") {
		t.Fatalf("an empty auth.conf: %v, %s", err, out)
	}
}

// TestNATSConfigPermitsDeadLetters runs, under the worker user of deploy/nats/auth.conf, the
// two ways a job ends as a dead letter: a worker gets it on the delivery the consumer keeps
// for its dead letter, and ends it; or that delivery dies with its worker too, and a worker
// that hears the server's max-deliveries advisory reads it from the work queue, stores its
// dead letter and result, and deletes it. Neither may meet a permission violation: a refused
// advisory subscription or message delete leaves the job in the work queue for ever.
func TestNATSConfigPermitsDeadLetters(t *testing.T) {
	if testing.Short() {
		t.Skip("loads the deploy NATS config into a server; skipped with -short")
	}
	srv := startFromConfig(t, queue.DefaultPrefix)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	subJS, _ := connectAs(t, srv, "submit")
	sub, err := queue.Bind(ctx, subJS, queue.Config{})
	if err != nil {
		t.Fatalf("submit: bind: %v", err)
	}
	const batch = "dead"
	if _, err := sub.PutManifest(ctx, queue.Manifest{BatchID: batch, Status: queue.BatchSubmitted, Jobs: 2, CreatedAt: time.Now()}, 0); err != nil {
		t.Fatalf("submit: manifest: %v", err)
	}
	publishJobs(t, sub, batch, makeJobs(2))

	const ackWait = 3 * time.Second
	wJS, wV := connectAs(t, srv, "worker")
	wq, err := queue.Setup(ctx, wJS, queue.Config{MaxDeliver: 1, AckWait: ackWait})
	if err != nil {
		t.Fatalf("worker: setup: %v", err)
	}
	// A worker that dies with both jobs on their one delivery, and again with one of them on
	// the delivery kept for its dead letter.
	puller, err := wq.NewJobPuller(ctx)
	if err != nil {
		t.Fatalf("worker: puller: %v", err)
	}
	if n, err := puller.Pull(ctx, 2, 5*time.Second, func(jetstream.Msg) {}); err != nil || n != 2 {
		t.Fatalf("worker: first deliveries: %d jobs, %v", n, err)
	}
	time.Sleep(ackWait + 500*time.Millisecond)
	if n, err := puller.Pull(ctx, 1, 5*time.Second, func(jetstream.Msg) {}); err != nil || n != 1 {
		t.Fatalf("worker: the delivery kept for a dead letter: %d jobs, %v", n, err)
	}
	taken := time.Now()
	// A worker started now gets the other job on its kept delivery, and hears the advisory of
	// the one whose kept delivery died.
	sim, simURL := startSim(t, tinkersim.Config{Capacity: 8})
	runWorker(t, wq, simURL, 4)
	subject := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + wq.Names.JobsStream() + "." + queue.ConsumerName
	fleettest.Eventually(t, 10*time.Second, "the worker to listen for max-deliveries advisories", func() bool {
		return srv.GlobalAccount().Interest(subject) >= 1 || len(wV.matching(subject)) > 0
	})
	if v := wV.matching(subject); len(v) > 0 {
		t.Fatalf("the worker may not hear the max-deliveries advisories: %q", v)
	}
	if time.Since(taken) > ackWait*3/4 {
		t.Skip("the worker took longer to start than the jobs' ack wait leaves: the machine is too busy for this test")
	}
	fleettest.Eventually(t, 30*time.Second, "both dead letters' results", func() bool {
		n, err := sub.ResultsStored(ctx, batch)
		return err == nil && n == 2
	})
	_, results := readResults(t, sub, batch)
	for id, r := range results {
		if r.Status != jobs.StatusError || r.Error == nil || r.Error.Code != jobs.CodeDeadLetter {
			t.Errorf("result of %s = %+v, want a dead letter", id, r)
		}
	}
	fleettest.Eventually(t, 10*time.Second, "the jobs to leave the work queue", func() bool {
		info, err := sub.Jobs.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	if info, err := sub.Dead.Info(ctx); err != nil || info.State.Msgs != 2 {
		t.Errorf("dead stream: %+v, %v; want both payloads", info, err)
	}
	if n := sim.Stats().SamplesAccepted; n != 0 {
		t.Errorf("%d samples of jobs out of deliveries", n)
	}
	time.Sleep(200 * time.Millisecond) // let late asynchronous errors arrive
	if v := wV.list(); len(v) > 0 {
		t.Errorf("worker met permission violations dead-lettering: %q", v)
	}
}

// violationLog keeps the permission violations a server logs, of every connection.
type violationLog struct{ violations }

func (l *violationLog) Noticef(string, ...any) {}
func (l *violationLog) Warnf(string, ...any)   {}
func (l *violationLog) Fatalf(string, ...any)  {}
func (l *violationLog) Debugf(string, ...any)  {}
func (l *violationLog) Tracef(string, ...any)  {}
func (l *violationLog) Errorf(format string, v ...any) {
	if line := fmt.Sprintf(format, v...); strings.Contains(line, "Violation") {
		l.handler(nil, nil, errors.New(line))
	}
}

// TestSubmitCommandsRunUnderTheSubmitUser runs the submit program as compose runs it, with
// NATS_USER=submit of deploy/nats/auth.conf, through every subcommand that reads or writes
// the server: a batch followed to its end, status, list, results (stored so far, and --wait),
// failed, cancel of a second batch, and delete, which only admin may. The server logs no
// permission violation but the delete's.
func TestSubmitCommandsRunUnderTheSubmitUser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/submit and loads the deploy NATS config into a server; skipped with -short")
	}
	srv := startFromConfig(t, queue.DefaultPrefix)
	logged := &violationLog{}
	srv.SetLogger(logged, false, false)
	dir := t.TempDir()
	bin := filepath.Join(dir, "submit")
	build := exec.Command("go", "build", "-o", bin, "./cmd/submit")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build submit: %v\n%s", err, out)
	}
	env := append(os.Environ(), "NATS_URL="+srv.ClientURL(), "NATS_USER=submit", "NATS_PASSWORD=pw-submit",
		"TINKERFLEET_PROGRESS=none", "TINKER_API_KEY=", "TINKER_API_KEY_FILE=")
	submit := func(wantOK bool, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env, cmd.Dir = env, dir
		out, err := cmd.CombinedOutput()
		if (err == nil) != wantOK {
			t.Fatalf("submit %q: %v (want success %v)\n%s", args, err, wantOK, out)
		}
		return string(out)
	}

	// One job of the batch ends in an error: a prompt longer than the model's context.
	lines := make([]string, 0, 11)
	for i := range 10 {
		lines = append(lines, fmt.Sprintf(`{"custom_id":"job-%d","model":"Qwen/Qwen3-8B","prompt_tokens":[9707,11,%d],"sampling_params":{"max_tokens":4}}`, i, 1000+i))
	}
	long := strings.Repeat("1,", 40000) + "1"
	lines = append(lines, `{"custom_id":"too-long","model":"Qwen/Qwen3-8B","prompt_tokens":[`+long+`],"sampling_params":{"max_tokens":4}}`)
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	wJS, _ := connectAs(t, srv, "worker")
	wq, err := queue.Setup(context.Background(), wJS, queue.Config{})
	if err != nil {
		t.Fatalf("worker: setup: %v", err)
	}
	_, simURL := startSim(t, tinkersim.Config{Capacity: 16})
	stopWorker := runWorker(t, wq, simURL, 8)

	submit(true, "--batch-id", "cli", in, "-o", "out.jsonl")
	submit(true, "status", "cli")
	submit(true, "status", "--json", "cli")
	submit(true, "list")
	submit(true, "results", "cli", "-o", "results.jsonl")
	submit(true, "results", "--wait", "cli", "-o", "waited.jsonl")
	submit(true, "failed", "cli", "-o", "failed.jsonl")
	if data, err := os.ReadFile(filepath.Join(dir, "failed.jsonl")); err != nil || !strings.Contains(string(data), `"too-long"`) {
		t.Errorf("failed wrote %q, %v; want the too-long line", data, err)
	}
	// A batch with no worker to take it: cancelled, and its status says why it waits.
	stopWorker()
	submit(true, "--batch-id", "later", in)
	submit(true, "status", "later")
	submit(true, "cancel", "later")
	if out := submit(false, "delete", "cli"); !strings.Contains(out, "may purge streams") {
		t.Errorf("delete as the submit user: %s; want it refused, saying why", out)
	}
	time.Sleep(200 * time.Millisecond) // let late asynchronous errors arrive
	for _, v := range logged.list() {
		if !strings.Contains(v, ".STREAM.PURGE.") {
			t.Errorf("permission violation: %s", v)
		}
	}
}

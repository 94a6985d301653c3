package worker

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// gathered returns every series of reg as "name{label=value,...}" → counter or gauge value,
// or the sample count of a histogram.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			if h := m.GetHistogram(); h != nil {
				out[key] = float64(h.GetSampleCount())
			} else if g := m.GetGauge(); g != nil {
				out[key] = g.GetValue()
			} else {
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestMetricsCountEachSeriesApart: the series the hot paths keep (by endpoint and status, by
// job status and code) count what their labels say, each apart.
func TestMetricsCountEachSeriesApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for _, e := range []tinker.Event{
		{Kind: tinker.EventRequest, Endpoint: "asample", StatusCode: 200, Duration: 10 * time.Millisecond},
		{Kind: tinker.EventRequest, Endpoint: "asample", StatusCode: 200, Duration: 20 * time.Millisecond},
		{Kind: tinker.EventRequest, Endpoint: "asample", StatusCode: 429, Duration: time.Millisecond},
		{Kind: tinker.EventRequest, Endpoint: "retrieve_future", StatusCode: 200, Duration: time.Millisecond},
	} {
		m.event(e)
	}
	ok := &jobs.Result{Status: jobs.StatusOK}
	invalid := &jobs.Result{Status: jobs.StatusError, Error: &jobs.ResultError{Code: jobs.CodeInvalidJob}}
	failed := &jobs.Result{Status: jobs.StatusError, Error: &jobs.ResultError{Code: jobs.CodeFailedFuture}}
	for _, r := range []*jobs.Result{ok, ok, invalid, failed, failed} {
		m.finished(r, time.Second)
	}

	got := gathered(t, reg)
	for key, want := range map[string]float64{
		"tinkerfleet_tinker_requests_total{endpoint=asample,status=200}":                   2,
		"tinkerfleet_tinker_requests_total{endpoint=asample,status=429}":                   1,
		"tinkerfleet_tinker_requests_total{endpoint=retrieve_future,status=200}":           1,
		"tinkerfleet_tinker_request_duration_seconds{endpoint=asample}":                    3,
		"tinkerfleet_tinker_request_duration_seconds{endpoint=retrieve_future}":            1,
		"tinkerfleet_jobs_finished_total{code=,status=ok}":                                 2,
		"tinkerfleet_jobs_finished_total{code=" + jobs.CodeInvalidJob + ",status=error}":   1,
		"tinkerfleet_jobs_finished_total{code=" + jobs.CodeFailedFuture + ",status=error}": 2,
	} {
		if got[key] != want {
			t.Errorf("%s = %v, want %v", key, got[key], want)
		}
	}
	if t.Failed() {
		t.Logf("all series: %v", got)
	}
}

// TestMetricsFollowTheNATSConnection: the connection's state and its reconnects are
// series, so that a link that keeps dying (a NAT that drops flows) shows on a dashboard.
func TestMetricsFollowTheNATSConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{})
	q := b.connect(t)
	reg := prometheus.NewRegistry()
	b.open(t, q, Config{Concurrency: 1, Registerer: reg})
	if got := gathered(t, reg); got["tinkerfleet_nats_connected{}"] != 1 || got["tinkerfleet_nats_reconnects_total{}"] != 0 {
		t.Fatalf("connected %v, reconnects %v; want 1 and 0", got["tinkerfleet_nats_connected{}"], got["tinkerfleet_nats_reconnects_total{}"])
	}
	nc := q.JS.Conn()
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	fleettest.Eventually(t, 10*time.Second, "the reconnect in the metrics", func() bool {
		got := gathered(t, reg)
		return got["tinkerfleet_nats_reconnects_total{}"] == 1 && got["tinkerfleet_nats_connected{}"] == 1
	})
	nc.Close()
	if got := gathered(t, reg)["tinkerfleet_nats_connected{}"]; got != 0 {
		t.Errorf("connected %v with the connection closed; want 0", got)
	}
}

// TestReconnectsCountOnlyReconnects: tinkerfleet_nats_reconnects_total counted nats.go's
// tries that reached a server (its Stats().Reconnects), refused ones included: a server that
// refused the worker's credentials for a while (a password rotated on the servers first)
// counted about three a second, for one drop, and the alert on a connection that keeps
// dropping fired. It counts the times the connection was made again, as its help says.
func TestReconnectsCountOnlyReconnects(t *testing.T) {
	t.Parallel()
	b := restartable(t)
	q := b.connect(t)
	reg := prometheus.NewRegistry()
	b.open(t, q, Config{Concurrency: 1, Registerer: reg})
	nc := q.JS.Conn()
	b.emb.Shutdown()
	fleettest.Eventually(t, 10*time.Second, "the worker to lose its server", func() bool { return !nc.IsConnected() })
	// A server on the same port that refuses the worker's (lack of) credentials.
	refusing, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: b.port, NoLog: true, NoSigs: true, Username: "fleet", Password: "rotated"})
	if err != nil {
		t.Fatal(err)
	}
	go refusing.Start()
	if !refusing.ReadyForConnections(10 * time.Second) {
		t.Fatal("the refusing server is not ready")
	}
	fleettest.Eventually(t, 10*time.Second, "tries that the server refuses", func() bool { return nc.Stats().Reconnects >= 3 })
	if got := gathered(t, reg)["tinkerfleet_nats_reconnects_total{}"]; got != 0 {
		t.Errorf("reconnects_total %v while every try was refused, want 0", got)
	}
	refusing.Shutdown()
	refusing.WaitForShutdown()
	b.startAgain(t)
	fleettest.Eventually(t, 10*time.Second, "the reconnect", nc.IsConnected)
	fleettest.Eventually(t, 10*time.Second, "the reconnect in the metrics", func() bool {
		return gathered(t, reg)["tinkerfleet_nats_reconnects_total{}"] == 1
	})
	if got := gathered(t, reg)["tinkerfleet_nats_reconnects_total{}"]; got != 1 {
		t.Errorf("reconnects_total %v after one drop and one reconnect, want 1", got)
	}
}

// A paused queue window the service reports while samples are polled (§4.3): the worker
// logs each paused sampler once (the Tinker client's §4.3 line, with the sampler and the
// state as attributes), signals the fleet backoff for it, counts its samplers in the state
// gauge until they sample again, and every job still ends ok once the window is over.
func TestAPausedQueueIsLoggedOnceAndPausesTheFleet(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 64, BaseLatency: 50 * time.Millisecond})
	var logs fleettest.Buffer
	reg := prometheus.NewRegistry()
	w := b.open(t, b.connect(t), Config{Concurrency: 8, Registerer: reg, PausedBackoff: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	run(t, w)
	const n = 40
	publishJobs(t, b.results, "paused", tokenJobs("p", n))
	waitFirstResult(t, b.results, "paused")
	if _, err := b.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultPausedCapacity, Duration: 1500 * time.Millisecond, Reason: "hold on"}); err != nil {
		t.Fatal(err)
	}
	fleet := w.Backoff().(*backoff.Fleet)
	deadline := time.Now().Add(10 * time.Second)
	for gathered(t, reg)["tinkerfleet_sampler_queue_state{state=paused_capacity}"] != 1 || fleet.State().Reason != backoff.ReasonPausedCapacity {
		if time.Now().After(deadline) {
			t.Fatalf("the paused queue was not counted (%v) or did not pause the fleet (%+v)", gathered(t, reg), fleet.State())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for id, r := range waitResults(t, b.results, "paused", n, 30*time.Second) {
		if r.Status != jobs.StatusOK {
			t.Errorf("%s: %+v", id, r.Error)
		}
	}
	if got := counterValue(t, reg, "tinkerfleet_backoff_signals_total", backoff.ReasonPausedCapacity); got == 0 {
		t.Error("no backoff signal counted for the paused queue")
	}
	// The pause ended, and the sampler's samples completed: it counts as active again,
	// although no poll expired to report its state.
	if got := gathered(t, reg); got["tinkerfleet_sampler_queue_state{state=paused_capacity}"] != 0 ||
		got["tinkerfleet_sampler_queue_state{state=active}"] != 1 {
		t.Errorf("after the pause, samplers by state: paused_capacity %v, active %v; want 0 and 1",
			got["tinkerfleet_sampler_queue_state{state=paused_capacity}"], got["tinkerfleet_sampler_queue_state{state=active}"])
	}
	if got := strings.Count(logs.String(), "Sampling is paused for sampler"); got != 1 ||
		!strings.Contains(logs.String(), "Reason: hold on") || !strings.Contains(logs.String(), "queue_state=paused_capacity") {
		t.Errorf("%d paused lines, want one naming the reason and the state:\n%s", got, logs.String())
	}
}

// TestAQueueStateTheClientDoesNotKnowPausesNothing: a poll reporting a queue state the client
// does not know (a state the service added, or only a reason) counts its sampler in the
// gauge as unknown and pauses nothing: were it a normal state, every poll reporting it would
// pause the fleet. paused_capacity and paused_rate_limit do pause it (--paused-backoff).
func TestAQueueStateTheClientDoesNotKnowPausesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{})
	reg := prometheus.NewRegistry()
	w := b.open(t, b.connect(t), Config{Concurrency: 1, Registerer: reg, PausedBackoff: time.Minute})
	state := func(q tinker.QueueState) {
		w.onEvent(tinker.Event{Kind: tinker.EventQueueState, Endpoint: "retrieve_future", QueueState: q, Reason: "why", SamplerID: "s1"})
	}
	state(tinker.QueueUnknown)
	if until := w.Backoff().Until(); time.Until(until) > 0 {
		t.Fatalf("an unknown queue state paused the fleet until %v", until)
	}
	if got := gathered(t, reg)["tinkerfleet_sampler_queue_state{state=unknown}"]; got != 1 {
		t.Errorf("%v samplers counted in the unknown state, want 1", got)
	}
	for _, q := range []tinker.QueueState{tinker.QueuePausedRateLimit, tinker.QueuePausedCapacity} {
		start := time.Now()
		state(q)
		if until := w.Backoff().Until(); until.Before(start.Add(30 * time.Second)) {
			t.Errorf("%s paused the fleet until %v, want about a minute", q, until)
		}
	}
}

// TestJobDurationsUpToTheSampleTimeoutAreMeasured: a job may take up to --sample-timeout (30
// min) per try. One slower than the top finite bucket falls into +Inf, whose quantile
// histogram_quantile answers with that bucket's bound: the dashboard showed 327.68 s for jobs
// of 10 and 20 minutes.
func TestJobDurationsUpToTheSampleTimeoutAreMeasured(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for _, d := range []time.Duration{10 * time.Minute, 2 * DefaultSampleTimeout} {
		m.finished(&jobs.Result{Status: jobs.StatusOK}, d)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tinkerfleet_job_duration_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		top := h.GetBucket()[len(h.GetBucket())-1]
		if top.GetCumulativeCount() != h.GetSampleCount() {
			t.Fatalf("%d of %d jobs in a finite bucket (the top is %g s)", top.GetCumulativeCount(), h.GetSampleCount(), top.GetUpperBound())
		}
		return
	}
	t.Fatal("no tinkerfleet_job_duration_seconds")
}

// TestAResultTheStreamHadAlreadyIsNotCounted: a job whose result another worker stored first
// (two workers raced on it: one's InProgress came too late, and both sampled it) is settled
// without storing this worker's result. It ended with a published result once, in the other
// worker: counted here too, the fleet's jobs/s, tokens and latencies counted it twice.
func TestAResultTheStreamHadAlreadyIsNotCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{})
	reg := runRacedJob(t, b, "raced")
	if n := b.sim.Stats().SamplesCompleted; n != 1 {
		t.Fatalf("%d samples completed, want the job's", n)
	}
	wantNoneCounted(t, gathered(t, reg), "tinkerfleet_jobs_finished_total{code=,status=ok}",
		"tinkerfleet_job_duration_seconds{}", "tinkerfleet_prompt_tokens_total{}")
}

// wantNoneCounted fails for each of series that got counts: the job's stored result is another
// worker's, and this worker's metrics must not count it.
func wantNoneCounted(t *testing.T, got map[string]float64, series ...string) {
	t.Helper()
	for _, name := range series {
		if n := got[name]; n != 0 {
			t.Errorf("%s = %v, want 0: the stored result is the other worker's", name, n)
		}
	}
}

// TestADeadLetterTheStreamHadAResultForIsNotCounted: a job that ends as a dead letter here,
// on its last delivery, while another worker's result for it is stored already (they raced on
// it), is settled without storing the dead letter. The job ended once, with the other result:
// tinkerfleet_dead_letters_total counts dead-letter results stored, so it stays 0 here.
func TestADeadLetterTheStreamHadAResultForIsNotCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 1}, tinkersim.Config{
		Faults: []tinkersim.Fault{{Kind: tinkersim.FaultFailed, Category: "server"}}})
	reg := runRacedJob(t, b, "racedead")
	if st := b.sim.Stats(); st.SamplesAccepted != 1 || st.SamplesCompleted != 0 {
		t.Fatalf("%d samples accepted, %d completed: want the job's sample, failed", st.SamplesAccepted, st.SamplesCompleted)
	}
	wantNoneCounted(t, gathered(t, reg), "tinkerfleet_dead_letters_total{}",
		"tinkerfleet_jobs_finished_total{code=dead_letter,status=error}")
}

// TestADeadLetterNotStoredIsNotCounted: a job that ends as a dead letter on its last delivery
// while the results stream refuses its result (full) is handed back when the worker stops, and
// the next worker dead-letters it again. The job ran out of deliveries once:
// tinkerfleet_dead_letters_total counts it once, as its result is stored, not once per worker
// that tried to store one.
func TestADeadLetterNotStoredIsNotCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{MaxDeliver: 1}, tinkersim.Config{
		Faults: []tinkersim.Fault{{Kind: tinkersim.FaultFailed, Category: "server"}}})
	first := prometheus.NewRegistry()
	w := b.open(t, b.connect(t), Config{Concurrency: 4, Registerer: first})
	resultsRoom(t, b.results, 1) // after the worker's set-up, which would undo it
	publishJobs(t, b.results, "unstored", tokenJobs("u", 1))
	stop := run(t, w)
	fleettest.Eventually(t, 30*time.Second, "the dead letter held, its result refused", func() bool {
		return w.resultsHeld.Load() == 1
	})
	stop() // the held result is let go and its job handed back
	if n := gathered(t, first)["tinkerfleet_dead_letters_total{}"]; n != 0 {
		t.Errorf("tinkerfleet_dead_letters_total = %v for a dead letter whose result was not stored, want 0", n)
	}

	resultsRoom(t, b.results, -1)
	second := prometheus.NewRegistry()
	run(t, b.open(t, b.connect(t), Config{Concurrency: 4, Registerer: second}))
	r := waitResults(t, b.results, "unstored", 1, 30*time.Second)["u0000"]
	if r.Status != jobs.StatusError || r.Error == nil || r.Error.Code != jobs.CodeDeadLetter {
		t.Fatalf("stored result %+v, want a dead letter", r)
	}
	fleettest.Eventually(t, 10*time.Second, "the stored dead letter counted", func() bool {
		return gathered(t, second)["tinkerfleet_dead_letters_total{}"] == 1
	})
	if n := gathered(t, first)["tinkerfleet_dead_letters_total{}"] + gathered(t, second)["tinkerfleet_dead_letters_total{}"]; n != 1 {
		t.Errorf("the fleet counted %v dead letters for one, want 1", n)
	}
	// Handed back on its last delivery, it went back as it was, not published again: the
	// delivery kept for its dead letter stored that, and it was not sampled once more.
	if n := b.sim.Stats().SamplesAccepted; n != 1 {
		t.Errorf("the job was sampled %d times, want once", n)
	}
}

// TestPollsAgainAfterA5xxAreCountedAsPollRetries: a poll answered 5xx is polled again at once
// (§4.2), a retry of the poll layer: tinkerfleet_tinker_retries_total{layer="poll"} counts each,
// as deploy/README says. Left out, it read 0 through a service failing every poll.
func TestPollsAgainAfterA5xxAreCountedAsPollRetries(t *testing.T) {
	t.Parallel()
	const failed = 3
	b := setup(t, queue.Config{}, tinkersim.Config{Faults: []tinkersim.Fault{
		{Kind: tinkersim.FaultServerError, Status: 503, Endpoints: []string{"retrieve_future"}, Count: failed}}})
	reg := prometheus.NewRegistry()
	run(t, b.open(t, b.connect(t), Config{Concurrency: 4, Registerer: reg}))
	publishJobs(t, b.results, "polls", tokenJobs("p", 1))
	if r := waitResults(t, b.results, "polls", 1, 30*time.Second)["p0000"]; r.Status != jobs.StatusOK {
		t.Fatalf("result %+v, want ok once the polls answer again", r)
	}
	if n := b.sim.Stats().Requests["retrieve_future"][503]; n != failed {
		t.Fatalf("%d polls answered 503, want %d", n, failed)
	}
	if n := gathered(t, reg)["tinkerfleet_tinker_retries_total{layer=poll}"]; n != failed {
		t.Errorf("tinkerfleet_tinker_retries_total{layer=poll} = %v after %d polls answered 503, want %d", n, failed, failed)
	}
}

// runRacedJob stores another worker's ok result for a job of batch, then has a worker of b
// work that job, and returns the worker's metrics once the job is settled. The job is a first
// delivery of a first publish, which skips the lookup of a stored result, as it does when the
// race is real.
func runRacedJob(t *testing.T, b *testBundle, batch string) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	w := b.open(t, b.connect(t), Config{Concurrency: 4, Registerer: reg})
	js := tokenJobs("raced-", 1)
	other := jobs.Result{CustomID: js[0].CustomID, BatchID: batch, Status: jobs.StatusOK, Model: js[0].Model}
	if first, err := w.publish(context.Background(), batch, &other); err != nil || !first {
		t.Fatalf("store the other worker's result: first %v, %v", first, err)
	}
	run(t, w)
	publishJobs(t, b.results, batch, js)
	fleettest.Eventually(t, 30*time.Second, "the job worked and settled", func() bool {
		info, err := b.results.Jobs.Info(context.Background())
		return err == nil && info.State.Msgs == 0 && b.sim.Stats().SamplesAccepted == 1
	})
	// settled runs after the ack, and decides on the metrics before it keeps the job's
	// settlement for a next job: the kept settlement (the worker's only one, from its only
	// job) says the metrics are final, as a sleep could not.
	fleettest.Eventually(t, 10*time.Second, "the job's settlement kept, its metrics counted or not", func() bool {
		return len(w.settlements) == 1
	})
	if r := waitResults(t, b.results, batch, 1, 10*time.Second)[js[0].CustomID]; r.Status != jobs.StatusOK || r.Model != js[0].Model {
		t.Fatalf("stored result %+v, want the other worker's", r)
	}
	return reg
}

// TestAnIdleWorkerHoldsNoDispatchPermitsInUse: once a batch is done, the dispatch gauges are
// back at 0. The count permits the puller holds for its next pull request (up to 64) are no
// job's: counted, an idle worker read as 64 permits in use, and one of 64 job slots or fewer
// as full.
func TestAnIdleWorkerHoldsNoDispatchPermitsInUse(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{})
	reg := prometheus.NewRegistry()
	w := b.open(t, b.connect(t), Config{Concurrency: 32, Registerer: reg})
	run(t, w)
	const n = 50
	publishJobs(t, b.results, "idle", tokenJobs("i", n))
	waitResults(t, b.results, "idle", n, 30*time.Second)
	fleettest.Eventually(t, 10*time.Second, "the pull after the last job", func() bool {
		return w.limiter.Stats().CountInUse > 0 // the puller's reservations for the next jobs
	})
	var got map[string]float64
	deadline := time.Now().Add(5 * time.Second)
	for {
		got = gathered(t, reg)
		if got["tinkerfleet_dispatch_count_in_use{}"] == 0 && got["tinkerfleet_jobs_finished_total{code=,status=ok}"] == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle worker: tinkerfleet_dispatch_count_in_use = %v (of 32 slots), want 0",
				got["tinkerfleet_dispatch_count_in_use{}"])
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, k := range []string{"tinkerfleet_dispatch_throttled_in_use{}", "tinkerfleet_dispatch_bytes_charged{}",
		"tinkerfleet_dispatch_bytes_in_flight{}", "tinkerfleet_dispatch_waiting{}", "tinkerfleet_result_memory_bytes{}", "tinkerfleet_results_held{}",
		"tinkerfleet_samples_in_flight{}"} {
		if got[k] != 0 {
			t.Errorf("idle worker: %s = %v, want 0", k, got[k])
		}
	}
}

// TestSamplesInFlightAreThoseTheServiceHolds: tinkerfleet_samples_in_flight reads the samples
// the service holds for the worker (accepted, their results not back) while it holds them,
// and 0 once the results are in (TestAnIdleWorkerHoldsNoDispatchPermitsInUse).
func TestSamplesInFlightAreThoseTheServiceHolds(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{BaseLatency: 3 * time.Second})
	reg := prometheus.NewRegistry()
	w := b.open(t, b.connect(t), Config{Concurrency: 32, Registerer: reg})
	run(t, w)
	const n = 5
	publishJobs(t, b.results, "inflight", tokenJobs("f", n))
	fleettest.Eventually(t, 10*time.Second, "the service holding every sample", func() bool {
		return b.sim.Stats().Concurrent == n
	})
	// The service holds them for 3 s: the worker reads each acceptance well before.
	var got float64
	fleettest.Eventually(t, 2*time.Second, "the gauge at the samples the service holds", func() bool {
		got = gathered(t, reg)["tinkerfleet_samples_in_flight{}"]
		return got == n
	})
	if c := b.sim.Stats().Concurrent; c != n {
		t.Fatalf("the service holds %d samples by the time the gauge read %v, want %d still held", c, got, n)
	}
	waitResults(t, b.results, "inflight", n, 30*time.Second)
}

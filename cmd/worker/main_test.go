package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
	"github.com/tinkerfleet/tinkerfleet/internal/worker"
)

// env is an injected environment.
func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--nats-url", "nats://n:4222"}, env(map[string]string{
		"TINKERFLEET_CONCURRENCY": "7", "TINKERFLEET_LOG_LEVEL": "debug", "TINKERFLEET_RESULT_MEMORY": "512",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.conn.URL != "nats://n:4222" || o.concurrency != 7 || o.logLevel != "debug" || o.metricsAddr != ":9464" || o.resultMemory != 512 {
		t.Errorf("options %+v: want the flag's URL, the env's concurrency, level and result memory, the default metrics address", o)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "--nats-url"},
		{[]string{"--embedded-nats", "--log-level", "loud"}, nil, `--log-level (or TINKERFLEET_LOG_LEVEL) "loud"`},
		{[]string{"--embedded-nats"}, map[string]string{"TINKERFLEET_LOG_LEVEL": "loud"}, `--log-level (or TINKERFLEET_LOG_LEVEL) "loud"`},
		{[]string{"--embedded-nats"}, map[string]string{"TINKERFLEET_LOG_JSON": "yes"}, "TINKERFLEET_LOG_JSON=\"yes\" (the default of --log-json)"},
		{[]string{"--embedded-nats", "extra"}, nil, `unexpected argument "extra"`},
		{[]string{"--embedded-nats", "--result-memory", "0"}, nil, "-result-memory: must not be 0"},
		{[]string{"--embedded-nats", "--shutdown-grace", "0"}, nil, "-shutdown-grace: must be a positive duration"},
		{[]string{"--embedded-nats", "--concurrency", "0"}, nil, "-concurrency: must be a positive integer"},
		{[]string{"--embedded-nats", "--capacity-ttl", "0s"}, nil, "-capacity-ttl: must not be 0"},
		{[]string{"--embedded-nats"}, map[string]string{"TINKERFLEET_RESULTS_MAX_AGE": "0"}, "TINKERFLEET_RESULTS_MAX_AGE"},
		{[]string{"--embedded-nats", "--results-max-age", "0s"}, nil, "-results-max-age: must be a positive duration"},
		{[]string{"--embedded-nats", "--max-deliver", "0"}, nil, "-max-deliver: must not be 0"},
		{[]string{"--embedded-nats", "--embedded-port", "0"}, nil, "-embedded-port: must not be 0"}, // nats-server reads 0 as 4222
		{[]string{"--embedded-nats"}, map[string]string{"TINKERFLEET_CONCURRENCY": "many"}, "TINKERFLEET_CONCURRENCY"},
	} {
		if _, err := parseFlags(tc.args, env(tc.env), io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q, %v): %v, want an error naming %s", tc.args, tc.env, err, tc.want)
		}
	}
	// A mistyped flag prints the usage, with the flags' defaults, into the worker's log: the
	// NATS password, token and URL (which may hold a password) taken from the environment
	// are not among them.
	var usage strings.Builder
	secrets := map[string]string{"NATS_PASSWORD": "hunter2-password", "NATS_TOKEN": "s3cr3t-token", "NATS_URL": "nats://u:pw-in-url@h:4222"}
	if _, err := parseFlags([]string{"--concurency", "5"}, env(secrets), &usage); err == nil {
		t.Fatal("a mistyped flag was accepted")
	}
	for _, secret := range []string{"hunter2-password", "s3cr3t-token", "pw-in-url"} {
		if strings.Contains(usage.String(), secret) {
			t.Errorf("the usage printed %q:\n%s", secret, usage.String())
		}
	}
	if o, err := parseFlags(nil, env(secrets), io.Discard); err != nil || o.conn.Password != "hunter2-password" || o.conn.Token != "s3cr3t-token" || o.conn.URL != secrets["NATS_URL"] {
		t.Errorf("the environment's NATS credentials were not taken: %v", err)
	}
}

func TestRunNeedsAPIKey(t *testing.T) {
	err := run(context.Background(), []string{"--nats-url", "nats://127.0.0.1:1"}, env(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "TINKER_API_KEY") {
		t.Fatalf("run without a key: %v, want an error naming TINKER_API_KEY", err)
	}
}

// TestRunWorksABatch runs the program against a real NATS server and the simulator: it works
// every job, serves /healthz, /readyz and /metrics on the address it logs, never logs the key,
// and returns nil when its context ends.
func TestRunWorksABatch(t *testing.T) {
	emb := fleettest.NATS(t)
	sim, simURL := fleettest.Sim(t, tinkersim.Config{})
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	const batch, total = "cmd-worker", 12
	mt := 8
	var js []jobs.Job
	for i := range total {
		js = append(js, jobs.Job{CustomID: fmt.Sprintf("j%02d", i), Model: "Qwen/Qwen3-8B",
			Prompt: fmt.Sprintf("Say %d.", i), NumSamples: 1, Params: jobs.SamplingParams{MaxTokens: &mt}})
	}
	fleettest.Publish(t, q, batch, js)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs, done := startRun(ctx, []string{"--nats-url", emb.ClientURL(), "--tinker-base-url", simURL,
		"--metrics-addr", "127.0.0.1:0", "--concurrency", "4", "--shutdown-grace", "2s"},
		map[string]string{"TINKER_API_KEY": fleettest.APIKey, "HF_HUB_OFFLINE": "1"})

	results, counts := fleettest.Results(t, q, batch, total, time.Minute)
	for _, j := range js {
		r, ok := results[j.CustomID]
		if !ok || r.Status != jobs.StatusOK || counts[j.CustomID] != 1 || len(r.Samples) != 1 || r.Samples[0].Text == "" {
			t.Errorf("%s: result %+v (%d messages), want one ok result with text", j.CustomID, r, counts[j.CustomID])
		}
	}
	if got := sim.Stats().SamplesCompleted; got != total {
		t.Errorf("simulator completed %d samples, want %d", got, total)
	}

	addr := metricsAddr(t, logs)
	get := func(path string) (int, string) { return httpGet(t, addr, path) }
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(path); code != http.StatusOK {
			t.Errorf("GET %s: %d %q", path, code, body)
		}
	}
	// A job is counted once its settlement is through, after its result is stored and its
	// ack sent: the last may be counted a moment after its result is read.
	want := fmt.Sprintf(`tinkerfleet_jobs_finished_total{code="",status="ok"} %d`, total)
	var code int
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if code, body = get("/metrics"); code == http.StatusOK && strings.Contains(body, want) || time.Now().After(deadline) {
			break
		}
	}
	if code != http.StatusOK || !strings.Contains(body, want) || !strings.Contains(body, "go_goroutines") {
		t.Errorf("GET /metrics: %d, want %q and the Go collector in:\n%.2000s", code, want, body)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel: %v, want nil (a clean stop)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
	if strings.Contains(logs.String(), fleettest.APIKey) {
		t.Error("the log holds the API key")
	}
	if !strings.Contains(logs.String(), "worker stopped") {
		t.Errorf("no clean stop in the log:\n%s", logs.String())
	}
}

// TestRunWithCredentialCmd: with no API key but TINKER_CREDENTIAL_CMD, against a service that
// exchanges credentials for JWTs (§2.2), the worker authenticates with what the command prints
// and works its jobs; neither the command nor the credential is logged.
func TestRunWithCredentialCmd(t *testing.T) {
	emb := fleettest.NATS(t)
	sim, simURL := fleettest.Sim(t, tinkersim.Config{JWTAuth: true})
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	const batch, total = "cmd-worker-credential-cmd", 3
	var js []jobs.Job
	for i := range total {
		js = append(js, jobs.Job{CustomID: fmt.Sprintf("c%d", i), Model: "Qwen/Qwen3-8B", Prompt: "Hi.", NumSamples: 1})
	}
	fleettest.Publish(t, q, batch, js)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := "printf '%s' " + fleettest.APIKey
	logs, done := startRun(ctx, []string{"--nats-url", emb.ClientURL(), "--tinker-base-url", simURL,
		"--metrics-addr", "127.0.0.1:0", "--concurrency", "4", "--shutdown-grace", "2s"},
		map[string]string{"TINKER_CREDENTIAL_CMD": cmd, "HF_HUB_OFFLINE": "1"})
	results, _ := fleettest.Results(t, q, batch, total, time.Minute)
	for _, j := range js {
		if r := results[j.CustomID]; r.Status != jobs.StatusOK {
			t.Errorf("%s: result %+v, want ok", j.CustomID, r)
		}
	}
	if st := sim.Stats(); st.TokensMinted == 0 || st.JWTRejections != 0 {
		t.Errorf("%d JWTs minted, %d requests refused: want the command's key exchanged", st.TokensMinted, st.JWTRejections)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after cancel: %v", err)
	}
	if strings.Contains(logs.String(), fleettest.APIKey) || strings.Contains(logs.String(), "printf") {
		t.Errorf("the log shows the credential or the command:\n%s", logs.String())
	}
}

// TestReadyzIsNotReadyWhileStopping: once told to stop, a worker finishing the jobs in hand
// within its shutdown grace takes no more, and says so on /readyz at once (503 "stopping"),
// while /healthz still answers; ready until its last moment, it read as able to work.
func TestReadyzIsNotReadyWhileStopping(t *testing.T) {
	emb := fleettest.NATS(t)
	sim, simURL := fleettest.Sim(t, tinkersim.Config{BaseLatency: time.Hour}) // jobs stay in hand
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	fleettest.Publish(t, q, "stopping", []jobs.Job{{CustomID: "slow", Model: "Qwen/Qwen3-8B", Prompt: "Hi.", NumSamples: 1}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs, done := startRun(ctx, []string{"--nats-url", emb.ClientURL(), "--tinker-base-url", simURL,
		"--metrics-addr", "127.0.0.1:0", "--concurrency", "4", "--shutdown-grace", "10s"},
		map[string]string{"TINKER_API_KEY": fleettest.APIKey, "HF_HUB_OFFLINE": "1"})
	fleettest.Eventually(t, 30*time.Second, "the job's sample accepted", func() bool { return sim.Stats().SamplesAccepted == 1 })
	addr := metricsAddr(t, logs)
	if code, body := httpGet(t, addr, "/readyz"); code != http.StatusOK {
		t.Fatalf("GET /readyz while working: %d %q", code, body)
	}

	cancel()
	fleettest.Eventually(t, 5*time.Second, "/readyz to say stopping", func() bool {
		code, body := httpGet(t, addr, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "stopping")
	})
	if code, body := httpGet(t, addr, "/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz while stopping: %d %q", code, body)
	}
	select {
	case err := <-done:
		t.Fatalf("run returned (%v) before its grace was over: /readyz was not seen during the grace", err)
	default:
	}
	if err := <-done; err != nil {
		t.Errorf("run after cancel: %v", err)
	}
}

// TestReadyzIsNotReadyOnceTheKeyIsRefused: a worker that stops by itself, because the
// service refused its key, takes no more jobs while it finishes those in hand, and /readyz
// says so (503, and why, without the key). It read ready until Run returned.
func TestReadyzIsNotReadyOnceTheKeyIsRefused(t *testing.T) {
	emb := fleettest.NATS(t)
	sim, simURL := fleettest.Sim(t, tinkersim.Config{BaseLatency: time.Hour}) // the first job stays in hand
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	fleettest.Publish(t, q, "refused", []jobs.Job{{CustomID: "slow", Model: "Qwen/Qwen3-8B", PromptTokens: []int{1, 2}, NumSamples: 1}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs, done := startRun(ctx, []string{"--nats-url", emb.ClientURL(), "--tinker-base-url", simURL,
		"--metrics-addr", "127.0.0.1:0", "--concurrency", "4", "--shutdown-grace", "10s"},
		map[string]string{"TINKER_API_KEY": fleettest.APIKey})
	fleettest.Eventually(t, 30*time.Second, "the first job's sample accepted", func() bool { return sim.Stats().SamplesAccepted == 1 })
	addr := metricsAddr(t, logs)
	if code, body := httpGet(t, addr, "/readyz"); code != http.StatusOK {
		t.Fatalf("GET /readyz while working: %d %q", code, body)
	}

	if _, err := sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultUnauthorized, Endpoints: []string{"asample", "session_heartbeat"}}); err != nil {
		t.Fatal(err)
	}
	fleettest.Publish(t, q, "refused", []jobs.Job{{CustomID: "refused", Model: "Qwen/Qwen3-8B", PromptTokens: []int{1, 2}, NumSamples: 1}})
	fleettest.Eventually(t, 10*time.Second, "/readyz to say stopping, and why", func() bool {
		code, body := httpGet(t, addr, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "stopping") && strings.Contains(body, "refused the API key")
	})
	if _, body := httpGet(t, addr, "/readyz"); strings.Contains(body, fleettest.APIKey) {
		t.Errorf("/readyz shows the key: %q", body)
	}
	select {
	case err := <-done:
		t.Fatalf("run returned (%v) before its grace was over: /readyz was not seen during the grace", err)
	default:
	}
	if err := <-done; !errors.Is(err, worker.ErrCredentialRefused) {
		t.Fatalf("run = %v, want the refusal", err)
	}
}

// startRun runs the program with args and the environment vars in a goroutine, as main
// does; it returns the program's log and a channel that gets run's error once it returns.
func startRun(ctx context.Context, args []string, vars map[string]string) (*fleettest.Buffer, <-chan error) {
	logs := &fleettest.Buffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(vars), logs) }()
	return logs, done
}

// metricsAddr returns the address of /metrics, /healthz and /readyz that run logged.
func metricsAddr(t *testing.T, logs *fleettest.Buffer) string {
	t.Helper()
	m := regexp.MustCompile(`msg="serving /metrics, /healthz and /readyz" addr=(\S+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", logs.String())
	}
	return m[1]
}

// httpGet returns the status and body of GET http://addr/path.
func httpGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestReadyzIsNotReadyWhileNATSDoesNotAnswer: a worker whose link to NATS stalls (as a link
// that died without closing, which the connection notices only after 20-30 s) is not ready
// within seconds, saying why, and ready again once the link is back.
func TestReadyzIsNotReadyWhileNATSDoesNotAnswer(t *testing.T) {
	emb := fleettest.NATS(t)
	_, simURL := fleettest.Sim(t, tinkersim.Config{})
	var stall fleettest.Stall
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{}, nats.SetCustomDialer(&stall))
	w, err := worker.Open(context.Background(), worker.Config{Queue: q, TinkerBaseURL: simURL, TinkerAPIKey: fleettest.APIKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	t.Cleanup(stall.Resume) // registered last, so run first: the stop waits on held writes
	srv, addr, err := serveHealth("127.0.0.1:0", prometheus.NewRegistry(), func() *worker.Worker { return w }, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	readyz := func(code int, says string) func() bool {
		return func() bool {
			got, body := httpGet(t, addr, "/readyz")
			return got == code && strings.Contains(body, says)
		}
	}
	fleettest.Eventually(t, 10*time.Second, "ready", readyz(http.StatusOK, "ready"))
	stall.Stall()
	fleettest.Eventually(t, 10*time.Second, "not ready while NATS does not answer",
		readyz(http.StatusServiceUnavailable, "nats: no answer to the worker's pings for"))
	stall.Resume()
	fleettest.Eventually(t, 10*time.Second, "ready once the link is back", readyz(http.StatusOK, "ready"))
}

// TestRunWaitsForNATS: a worker started before its NATS server (as compose or Kubernetes may
// start them) warns and waits, alive (/healthz) but not ready (/readyz), and works jobs once
// the server is up.
func TestRunWaitsForNATS(t *testing.T) {
	// A port known before the server starts, that nothing else takes meanwhile.
	port := fleettest.FreePorts(t, 1)[0]
	host := "127.0.0.1:" + strconv.Itoa(port)
	_, simURL := fleettest.Sim(t, tinkersim.Config{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs, done := startRun(ctx, []string{"--nats-url", "nats://" + host, "--tinker-base-url", simURL,
		"--metrics-addr", "127.0.0.1:0", "--concurrency", "2", "--shutdown-grace", "2s"},
		map[string]string{"TINKER_API_KEY": fleettest.APIKey, "HF_HUB_OFFLINE": "1"})
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "waiting for a NATS server") {
		select {
		case err := <-done:
			t.Fatalf("run returned %v before NATS was up; log:\n%s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no warning while NATS is down; log:\n%s", logs.String())
		}
	}
	addr := metricsAddr(t, logs)
	if code, body := httpGet(t, addr, "/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz while waiting for NATS: %d %q, want 200 (alive)", code, body)
	}
	if code, body := httpGet(t, addr, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Errorf("GET /readyz while waiting for NATS: %d %q, want 503 starting", code, body)
	}
	// The alert on a worker cut off from NATS reads this gauge: a worker that never reached
	// NATS (a mistyped host waits for ever) must show it too, not only one that lost it.
	if _, body := httpGet(t, addr, "/metrics"); !strings.Contains(body, "\ntinkerfleet_nats_connected 0\n") {
		t.Errorf("GET /metrics while waiting for NATS has no tinkerfleet_nats_connected 0:\n%s", body)
	}

	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir(), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	q := fleettest.Queue(t, emb.ClientURL(), queue.Config{})
	mt := 4
	fleettest.Publish(t, q, "late-nats", []jobs.Job{{CustomID: "only", Model: "Qwen/Qwen3-8B", Prompt: "Hi.", NumSamples: 1, Params: jobs.SamplingParams{MaxTokens: &mt}}})
	results, _ := fleettest.Results(t, q, "late-nats", 1, time.Minute)
	if r := results["only"]; r.Status != jobs.StatusOK {
		t.Errorf("result %+v, want ok", r)
	}
	if code, body := httpGet(t, addr, "/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz once working: %d %q, want 200", code, body)
	}
	if _, body := httpGet(t, addr, "/metrics"); !strings.Contains(body, "\ntinkerfleet_nats_connected 1\n") {
		t.Errorf("GET /metrics once working has no tinkerfleet_nats_connected 1:\n%s", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after cancel: %v, want nil", err)
	}
}

// TestRunStoppedWhileWaitingForNATS: a worker told to stop while it waits for NATS stops
// cleanly.
func TestRunStoppedWhileWaitingForNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	logs := &fleettest.Buffer{}
	u, err := url.Parse(fleettest.ClosedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	err = run(ctx, []string{"--nats-url", "nats://" + u.Host, "--metrics-addr", ""},
		env(map[string]string{"TINKER_API_KEY": fleettest.APIKey}), logs)
	if err != nil || !strings.Contains(logs.String(), "worker stopped before NATS could be reached") {
		t.Errorf("run = %v, want nil and a line saying why it stopped; log:\n%s", err, logs.String())
	}
}

// TestMetricsOffServesNone: an empty TINKERFLEET_METRICS_ADDR reads as unset (the default
// :9464), so the environment turns the metrics server off with "off".
func TestMetricsOffServesNone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	logs := &fleettest.Buffer{}
	u, err := url.Parse(fleettest.ClosedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	err = run(ctx, []string{"--nats-url", "nats://" + u.Host},
		env(map[string]string{"TINKER_API_KEY": fleettest.APIKey, "TINKERFLEET_METRICS_ADDR": "off"}), logs)
	if err != nil || strings.Contains(logs.String(), "serving /metrics") {
		t.Errorf("run = %v; log:\n%s", err, logs.String())
	}
}

// TestRunStoppedWhileOpeningTheTinkerSession: a stop while the worker waits for the Tinker
// service (it keeps trying to open its session for about 5 minutes) is a clean stop too, not
// a failure that a service manager would report.
func TestRunStoppedWhileOpeningTheTinkerSession(t *testing.T) {
	emb := fleettest.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	logs := &fleettest.Buffer{}
	err := run(ctx, []string{"--nats-url", emb.ClientURL(), "--tinker-base-url", fleettest.ClosedURL(t), "--metrics-addr", ""},
		env(map[string]string{"TINKER_API_KEY": fleettest.APIKey}), logs)
	if err != nil || !strings.Contains(logs.String(), "worker stopped before its Tinker session opened") {
		t.Errorf("run = %v, want nil and a line saying why it stopped; log:\n%s", err, logs.String())
	}
}

// TestRunSaysWhatFailedOnce: a session the service refuses ends the program with an error
// that names it and the key as the cause, without the package prefix that main adds
// ("worker: worker: …"), and without the key.
func TestRunSaysWhatFailedOnce(t *testing.T) {
	emb := fleettest.NATS(t)
	_, simURL := fleettest.Sim(t, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := run(ctx, []string{"--nats-url", emb.ClientURL(), "--tinker-base-url", simURL, "--metrics-addr", ""},
		env(map[string]string{"TINKER_API_KEY": fleettest.APIKey + ".refused"}), io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "tinker session: the service refused the API key (check TINKER_API_KEY, ") {
		t.Fatalf("run = %v, want an error starting with the session that failed, and why", err)
	}
	if strings.Contains(err.Error(), fleettest.APIKey) {
		t.Errorf("the error holds the API key: %v", err)
	}
}

// TestRunOnATakenMetricsPortSaysWhatToDo: a second worker on one machine, whose metrics
// address the first holds, stops at once with what to do about it.
func TestRunOnATakenMetricsPortSaysWhatToDo(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	u, err := url.Parse(fleettest.ClosedURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = run(ctx, []string{"--nats-url", "nats://" + u.Host, "--metrics-addr", taken.Addr().String()},
		env(map[string]string{"TINKER_API_KEY": fleettest.APIKey}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "give each its own --metrics-addr") {
		t.Fatalf("run = %v, want that the address is taken, and what to do", err)
	}
}

// TestAHostWhoseKeyIsRefusedGoesOnServingNATS: a worker that hosts the NATS server
// (--embedded-nats) and stops because the service refuses its key (revoked after it started)
// keeps serving NATS, with the job it handed back, until it is stopped; then it ends with
// the refusal. Exiting at once would cut the other workers and submit off every batch.
// TestHealthIsServedBeforeTheEmbeddedServerStarts: with --embedded-nats, /healthz answers
// before the embedded server starts (README: from the process's first moment), since
// recovering a large store takes long enough for a liveness probe to restart the process.
func TestHealthIsServedBeforeTheEmbeddedServerStarts(t *testing.T) {
	port := fleettest.FreePorts(t, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs, done := startRun(ctx, []string{"--embedded-nats", "--embedded-port", strconv.Itoa(port), "--data-dir", t.TempDir(),
		"--tinker-base-url", fleettest.ClosedURL(t), "--metrics-addr", "127.0.0.1:0"},
		map[string]string{"TINKER_API_KEY": fleettest.APIKey})
	fleettest.Eventually(t, 30*time.Second, "the embedded server ready", func() bool {
		return strings.Contains(logs.String(), "embedded NATS server ready")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run = %v", err)
	}
	out := logs.String()
	if health, emb := strings.Index(out, "serving /metrics"), strings.Index(out, "embedded NATS server ready"); health < 0 || health > emb {
		t.Fatalf("/healthz was not served before the embedded server started; log:\n%s", out)
	}
}

// TestAnEmbeddedServerIsReachedWithoutAFleetsNATSSettings: a worker that serves its own
// embedded NATS server connects to it without the TLS and credentials a fleet's environment
// names (NATS_TLS_CA, NATS_CREDS), which that server does not ask for.
func TestAnEmbeddedServerIsReachedWithoutAFleetsNATSSettings(t *testing.T) {
	_, simURL := fleettest.Sim(t, tinkersim.Config{})
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs, done := startRun(ctx, []string{"--embedded-nats", "--embedded-port", "-1", "--data-dir", dir,
		"--tinker-base-url", simURL, "--metrics-addr", ""},
		map[string]string{"TINKER_API_KEY": fleettest.APIKey, "NATS_TLS_CA": filepath.Join(dir, "fleet-ca.pem"), "NATS_CREDS": filepath.Join(dir, "fleet.creds")})
	fleettest.Eventually(t, 30*time.Second, "the worker started", func() bool {
		select {
		case err := <-done:
			t.Fatalf("run: %v", err)
		default:
		}
		return strings.Contains(logs.String(), "worker started")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestAHostWhoseKeyIsRefusedGoesOnServingNATS(t *testing.T) {
	_, simURL := fleettest.Sim(t, tinkersim.Config{Faults: []tinkersim.Fault{
		{Kind: tinkersim.FaultUnauthorized, Endpoints: []string{"asample", "session_heartbeat"}}}})
	port := fleettest.FreePorts(t, 1)[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs, done := startRun(ctx, []string{"--embedded-nats", "--embedded-port", strconv.Itoa(port), "--data-dir", t.TempDir(),
		"--tinker-base-url", simURL, "--metrics-addr", ""},
		map[string]string{"TINKER_API_KEY": fleettest.APIKey})
	fleettest.Eventually(t, 30*time.Second, "the worker started", func() bool { return strings.Contains(logs.String(), "worker started") })
	q := fleettest.Queue(t, fmt.Sprintf("nats://127.0.0.1:%d", port), queue.Config{})
	fleettest.Publish(t, q, "refused", []jobs.Job{{CustomID: "j", Model: "Qwen/Qwen3-8B", PromptTokens: []int{1, 2}, NumSamples: 1}})

	fleettest.Eventually(t, 30*time.Second, "the worker stopped, NATS still served", func() bool {
		return strings.Contains(logs.String(), "goes on serving NATS")
	})
	// Handed back, not held until AckWait (30 s by default): the job can be taken now.
	cons, err := q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range msgs.Messages() {
		got++
		_ = m.Nak()
	}
	if got != 1 {
		t.Fatalf("%d jobs ready to be taken, want the one the stopped worker handed back", got)
	}
	select {
	case err := <-done:
		t.Fatalf("the host ended while it was not stopped: %v", err)
	default:
	}
	cancel()
	if err := <-done; !errors.Is(err, worker.ErrCredentialRefused) {
		t.Fatalf("run = %v, want the refusal", err)
	}
}

// TestNATSConnectedIsServedWhileTheTinkerSessionOpens: a worker that reached NATS and waits
// for the Tinker service (an outage at start-up: it retries client/config for five minutes)
// still says whether its NATS connection is up. The gauge of start-up was unregistered
// before the session opened, and the worker's own registered after it: meanwhile there was
// none, and the alert on a worker cut off from NATS could not see one that lost it then.
func TestNATSConnectedIsServedWhileTheTinkerSessionOpens(t *testing.T) {
	emb := fleettest.NATS(t)
	sim, simURL := fleettest.Sim(t, tinkersim.Config{})
	if _, err := sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultDrop, Endpoints: []string{"client/config"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	logs, done := startRun(ctx, []string{"--nats-url", emb.ClientURL(), "--tinker-base-url", simURL, "--metrics-addr", "127.0.0.1:0"},
		map[string]string{"TINKER_API_KEY": fleettest.APIKey, "HF_HUB_OFFLINE": "1"})
	defer func() { cancel(); <-done }()
	fleettest.Eventually(t, 30*time.Second, "the worker asking the service for its config", func() bool {
		return sim.Stats().Requests["client/config"][0] > 0
	})
	addr := metricsAddr(t, logs)
	if _, body := httpGet(t, addr, "/metrics"); !strings.Contains(body, "\ntinkerfleet_nats_connected 1\n") {
		t.Errorf("GET /metrics while the Tinker session opens has no tinkerfleet_nats_connected 1")
	}
}

// TestFlagsAfterAnUnexpectedArgumentAreNotPrinted: a boolean flag given its value apart, as
// in `--setup-streams false`, leaves "false" as an argument; the flags after it are read (as
// submit reads them), not printed back in the error, where a NATS password or a URL holding
// one would reach the worker's log.
func TestFlagsAfterAnUnexpectedArgumentAreNotPrinted(t *testing.T) {
	_, err := parseFlags([]string{"--setup-streams", "false", "--nats-url", "nats://u:pw-in-url@h:4222", "--nats-password", "hunter2-password"}, env(nil), io.Discard)
	if err == nil {
		t.Fatal("the argument false was accepted")
	}
	for _, secret := range []string{"hunter2-password", "pw-in-url"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error %q prints %q", err, secret)
		}
	}
	if !strings.Contains(err.Error(), "--setup-streams=false") {
		t.Errorf("the error %q does not say how to give a boolean flag its value", err)
	}
}

// TestANegativeEmbeddedPortOtherThanMinusOneIsRefused: -1 asks for any free port; another
// negative port was passed to nats-server, which cannot listen on it and says nothing: the
// worker waited 30 s for it and failed without naming the port.
func TestANegativeEmbeddedPortOtherThanMinusOneIsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--embedded-nats", "--embedded-port", "-2"}, nil},
		{[]string{"--embedded-nats"}, map[string]string{"TINKERFLEET_EMBEDDED_PORT": "-4222"}},
	} {
		_, err := parseFlags(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--embedded-port (or TINKERFLEET_EMBEDDED_PORT)") {
			t.Errorf("parseFlags(%q, %v): %v, want an error naming --embedded-port and TINKERFLEET_EMBEDDED_PORT", tc.args, tc.env, err)
		}
	}
	if o, err := parseFlags([]string{"--embedded-nats", "--embedded-port", "-1"}, env(nil), io.Discard); err != nil || o.embeddedPort != -1 {
		t.Errorf("--embedded-port -1: %+v, %v", o.embeddedPort, err)
	}
}

// TestAnEmbeddedServerOffLoopbackIsSaidToHaveNoAuthentication: --embedded-host 0.0.0.0 (as
// the README's fleet example has it) serves NATS with no users to anyone who reaches it; the
// worker's log says so, and a loopback host's does not.
func TestAnEmbeddedServerOffLoopbackIsSaidToHaveNoAuthentication(t *testing.T) {
	const warning = "the embedded NATS server has no authentication"
	for host, warned := range map[string]bool{"0.0.0.0": true, "127.0.0.1": false, "localhost": false} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		logs, done := startRun(ctx, []string{"--embedded-nats", "--embedded-host", host, "--embedded-port", "-1", "--data-dir", t.TempDir(),
			"--tinker-base-url", fleettest.ClosedURL(t), "--metrics-addr", ""},
			map[string]string{"TINKER_API_KEY": fleettest.APIKey})
		fleettest.Eventually(t, 30*time.Second, "the embedded server ready", func() bool {
			return strings.Contains(logs.String(), "embedded NATS server ready")
		})
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("%s: run = %v", host, err)
		}
		if got := strings.Contains(logs.String(), warning); got != warned {
			t.Errorf("--embedded-host %s: warned %v, want %v; log:\n%s", host, got, warned, logs.String())
		}
	}
}

// TestATokenizerDirThatIsNotThereIsRefused: a --tokenizer-dir (or TINKERFLEET_TOKENIZER_DIR)
// that does not exist, a typo, was passed over without a word: the worker started, and every
// tokenizer came from the HF cache or the hub instead. It is refused at start-up, named.
func TestATokenizerDirThatIsNotThereIsRefused(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "tokenizres")
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--embedded-nats", "--tokenizer-dir", missing}, nil},
		{[]string{"--embedded-nats"}, map[string]string{"TINKERFLEET_TOKENIZER_DIR": missing}},
	} {
		_, err := parseFlags(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--tokenizer-dir (or TINKERFLEET_TOKENIZER_DIR)") || !strings.Contains(err.Error(), missing) {
			t.Errorf("parseFlags(%q, %v): %v, want an error naming --tokenizer-dir and %s", tc.args, tc.env, err, missing)
		}
	}
	there := t.TempDir()
	if o, err := parseFlags([]string{"--embedded-nats", "--tokenizer-dir", there}, env(nil), io.Discard); err != nil || o.tokenizerDir != there {
		t.Errorf("an existing --tokenizer-dir: %q, %v", o.tokenizerDir, err)
	}
}

// TestAPausedBackoffPastMaxPauseIsRefused: a --paused-backoff longer than the longest pause a
// worker honours (backoff.MaxPause) was cut to it by Signal without a word; it is refused at
// start-up, and one of MaxPause is taken.
func TestAPausedBackoffPastMaxPauseIsRefused(t *testing.T) {
	_, err := parseFlags([]string{"--embedded-nats", "--paused-backoff", "2h"}, env(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--paused-backoff") || !strings.Contains(err.Error(), "1h0m0s") {
		t.Errorf("--paused-backoff 2h: %v, want an error naming the flag and its most", err)
	}
	if o, err := parseFlags([]string{"--embedded-nats"}, env(map[string]string{"TINKERFLEET_PAUSED_BACKOFF": "1h"}), io.Discard); err != nil || o.pausedBackoff != time.Hour {
		t.Errorf("TINKERFLEET_PAUSED_BACKOFF=1h: %v, %v", o.pausedBackoff, err)
	}
}

// TestAResultMemoryWhoseBytesOverflowIsRefused: --result-memory is in MiB and the worker
// bounds bytes, MiB << 20 in an int64. A value of 2^43 MiB or more overflowed it: 2^43 became
// a negative bound, which the worker reads as no bound at all, and 2^44 a bound of 0, which it
// reads as the default 256 MiB. Such a value is refused at start-up, named; the largest that
// fits is taken.
func TestAResultMemoryWhoseBytesOverflowIsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--embedded-nats", "--result-memory", "8796093022208"}, nil},                          // 2^43: << 20 is math.MinInt64
		{[]string{"--embedded-nats"}, map[string]string{"TINKERFLEET_RESULT_MEMORY": "17592186044416"}}, // 2^44: << 20 is 0
		{[]string{"--embedded-nats", "--result-memory", "-17592186044416"}, nil},                        // << 20 is 0, not no bound
	} {
		_, err := parseFlags(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--result-memory (or TINKERFLEET_RESULT_MEMORY)") {
			t.Errorf("parseFlags(%q, %v): %v, want an error naming --result-memory and TINKERFLEET_RESULT_MEMORY", tc.args, tc.env, err)
		}
	}
	for _, mib := range []int{8796093022207, -1, -8796093022208} { // math.MaxInt64 >> 20, no bound, math.MinInt64 >> 20
		o, err := parseFlags([]string{"--embedded-nats", "--result-memory", strconv.Itoa(mib)}, env(nil), io.Discard)
		if err != nil || o.resultMemory != mib {
			t.Errorf("--result-memory %d: %d, %v", mib, o.resultMemory, err)
		}
	}
}

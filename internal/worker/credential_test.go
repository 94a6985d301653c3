package worker

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// A key revoked in the middle of a batch stops the worker at once: Run returns
// ErrCredentialRefused, no job gets a result for it (no error, no dead letter), the jobs not
// done wait in the stream, and the service saw no more asample calls than the worker had jobs
// in hand, nor more than one credential check; the NATS server holds a note of why, for
// submit. A worker whose key is accepted then finishes the batch, each job once.
func TestARevokedKeyStopsTheWorkerAndFailsNoJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 64, BaseLatency: 100 * time.Millisecond})
	const n, concurrency = 60, 8
	w := b.open(t, b.connect(t), Config{Concurrency: concurrency})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	publishJobs(t, b.results, "revoked", tokenJobs("j", n))
	waitFirstResult(t, b.results, "revoked")
	revoked, err := b.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultUnauthorized})
	if err != nil {
		t.Fatal(err)
	}

	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker went on with a revoked key")
	}
	if !errors.Is(err, ErrCredentialRefused) || strings.Contains(err.Error(), fleettest.APIKey) {
		t.Fatalf("Run: %v, want ErrCredentialRefused without the key", err)
	}
	before, _ := fleettest.Results(t, b.results, "revoked", 0, 0)
	for id, r := range before {
		if r.Status != jobs.StatusOK {
			t.Errorf("%s ended while the key was refused: %+v", id, r.Error)
		}
	}
	fleettest.Eventually(t, 10*time.Second, "the jobs not done back in the stream", func() bool {
		info, err := b.results.Jobs.Info(context.Background())
		return err == nil && info.State.Msgs == uint64(n-len(before))
	})
	fleettest.Eventually(t, 5*time.Second, "a note of the refusal that stopped the worker, for submit", func() bool {
		notes, err := b.results.ReadNotes(context.Background(), "revoked")
		n := notes.Service
		return err == nil && n != nil && n.Stopped && n.Status == http.StatusUnauthorized && strings.Contains(n.Error, "refused the API key")
	})
	st := b.sim.Stats()
	if calls := st.Windows[0].AsampleCalls; calls > concurrency {
		t.Errorf("%d asample calls with the key refused, want at most the %d jobs in hand", calls, concurrency)
	}
	// One check for all the jobs refused (and perhaps the client's own heartbeat).
	if checks := st.Requests["session_heartbeat"][401]; checks > 2 {
		t.Errorf("%d heartbeats refused: the credential was checked for each job", checks)
	}

	b.sim.RemoveFault(revoked)
	run(t, b.open(t, b.connect(t), Config{Concurrency: concurrency}))
	for id, r := range waitResults(t, b.results, "revoked", n, 30*time.Second) {
		if r.Status != jobs.StatusOK {
			t.Errorf("%s: %+v", id, r.Error)
		}
	}
	// The worker whose key the service accepted removed the refusal's note, so that submit no
	// longer takes it for why no worker runs.
	notes, err := b.results.ReadNotes(context.Background(), "revoked")
	if err != nil || notes.Service != nil && notes.Service.Stopped {
		t.Errorf("the refusal's note once a worker's key was accepted: %+v, %v; want it removed", notes.Service, err)
	}
}

// A key rotated in its file (TINKER_API_KEY_FILE, as a mounted Kubernetes secret is
// rotated) costs no restart and fails no job: when the service refuses the old key, the
// worker reads the file again and goes on with the new key. A refused key that its file
// still holds stops the worker, as one without a file.
func TestAKeyRotatedInItsFileIsTakenWithoutARestart(t *testing.T) {
	t.Parallel()
	const oldKey, newKey, newerKey = fleettest.APIKey, "tml-new-key", "tml-newer-key"
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 64, BaseLatency: 50 * time.Millisecond})
	file := filepath.Join(t.TempDir(), "tinker-api-key")
	if err := os.WriteFile(file, []byte(oldKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const n = 60
	// The jobs the old key was refused for go back at once, not after the retry delay, which
	// is longer here than the test waits for the results.
	w := b.open(t, b.connect(t), Config{Concurrency: 8, RetryDelay: time.Minute, TinkerAPIKey: oldKey, TinkerAPIKeyFile: file})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	publishJobs(t, b.results, "rotated", tokenJobs("j", n))
	waitFirstResult(t, b.results, "rotated")

	// The secret is rotated: the file first (as a mounted secret changes), then the service.
	if err := os.WriteFile(file, []byte(newKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.sim.SetAPIKeys(newKey); err != nil {
		t.Fatal(err)
	}
	for id, r := range waitResults(t, b.results, "rotated", n, 30*time.Second) {
		if r.Status != jobs.StatusOK {
			t.Errorf("%s: %+v", id, r.Error)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("the worker stopped: %v", err)
	default:
	}
	if refused := b.sim.Stats().Requests["session_heartbeat"][401]; refused == 0 {
		t.Fatal("the service never refused the old key: the test rotated nothing")
	}

	// Rotated again, but not in the file: the worker stops, and says why without the key.
	if err := b.sim.SetAPIKeys(newerKey); err != nil {
		t.Fatal(err)
	}
	publishJobs(t, b.results, "after", tokenJobs("k", 4))
	select {
	case err := <-done:
		if !errors.Is(err, ErrCredentialRefused) || strings.Contains(err.Error(), newerKey) || strings.Contains(err.Error(), newKey) || strings.Contains(err.Error(), oldKey) {
			t.Fatalf("Run: %v, want ErrCredentialRefused without the key", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker went on with a key the service refuses")
	}
}

// A JWT the service stops honouring (RevokeJWTs: it lost its signing key) fails no job and
// does not stop the worker: the credential check mints a new JWT, and the jobs refused are
// tried again on it.
func TestARevokedJWTFailsNoJob(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 64, BaseLatency: 100 * time.Millisecond, JWTAuth: true})
	const n = 40
	w := b.open(t, b.connect(t), Config{Concurrency: 8, RetryDelay: 100 * time.Millisecond})
	run(t, w)
	publishJobs(t, b.results, "jwt", tokenJobs("j", n))
	waitFirstResult(t, b.results, "jwt")
	b.sim.RevokeJWTs()
	for id, r := range waitResults(t, b.results, "jwt", n, 30*time.Second) {
		if r.Status != jobs.StatusOK {
			t.Errorf("%s: %+v", id, r.Error)
		}
	}
	if st := b.sim.Stats(); st.JWTRejections == 0 || st.Requests["auth/token"][200] < 2 {
		t.Errorf("%d JWT refusals, %d JWTs minted: want the revoked JWT refused and a new one minted",
			st.JWTRejections, st.Requests["auth/token"][200])
	}
}

// A credential the service accepts again once checked (a key rotated in its file, a JWT
// renewed) fails no job on its last delivery either (every delivery is, with MaxDeliver 1):
// the jobs it was refused for were sent back to the stream, which on the last delivery made
// each of them (one per job slot) a dead letter, "gave up after 1 delivery: ... 401",
// though none had failed. They are worked on again at once instead.
func TestARenewedCredentialFailsNoJobOnItsLastDelivery(t *testing.T) {
	t.Parallel()
	const oldKey, newKey = fleettest.APIKey, "tml-new-key"
	for _, tc := range []struct {
		name   string
		jwt    bool
		revoke func(t *testing.T, sim *tinkersim.Server, file string)
	}{
		{"rotated key", false, func(t *testing.T, sim *tinkersim.Server, file string) {
			if err := os.WriteFile(file, []byte(newKey+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := sim.SetAPIKeys(newKey); err != nil {
				t.Fatal(err)
			}
		}},
		{"renewed JWT", true, func(t *testing.T, sim *tinkersim.Server, _ string) { sim.RevokeJWTs() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, queue.Config{MaxDeliver: 1}, tinkersim.Config{Capacity: 64, BaseLatency: 100 * time.Millisecond, JWTAuth: tc.jwt})
			file := filepath.Join(t.TempDir(), "tinker-api-key")
			if err := os.WriteFile(file, []byte(oldKey+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			const n = 40
			run(t, b.open(t, b.connect(t), Config{Concurrency: 8, TinkerAPIKey: oldKey, TinkerAPIKeyFile: file}))
			publishJobs(t, b.results, "renewed", tokenJobs("j", n))
			waitFirstResult(t, b.results, "renewed")
			tc.revoke(t, b.sim, file)
			for id, r := range waitResults(t, b.results, "renewed", n, 30*time.Second) {
				if r.Status != jobs.StatusOK {
					t.Errorf("%s: %+v", id, r.Error)
				}
			}
			if st := b.sim.Stats(); st.Requests["session_heartbeat"][401] == 0 && st.JWTRejections == 0 {
				t.Fatal("the service never refused the worker's credential: the test renewed nothing")
			}
		})
	}
}

// A 403 on one job's request, while the service accepts the key, ends that job alone with an
// api_error result; the worker and the other jobs go on.
func TestAJobTheKeyMayNotRunEndsAloneWithAnAPIError(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 64, BaseLatency: 50 * time.Millisecond})
	if _, err := b.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultForbidden, Count: 1, Reason: "no access to this model"}); err != nil {
		t.Fatal(err)
	}
	const n = 20
	run(t, b.open(t, b.connect(t), Config{Concurrency: 4}))
	publishJobs(t, b.results, "forbidden", tokenJobs("j", n))
	failed := 0
	for id, r := range waitResults(t, b.results, "forbidden", n, 30*time.Second) {
		if r.Status == jobs.StatusOK {
			continue
		}
		failed++
		if r.Error.Code != jobs.CodeAPIError || r.Error.Category != jobs.CategoryUser || !strings.Contains(r.Error.Message, "no access to this model") {
			t.Errorf("%s: %+v, want an api_error of category user naming the refusal", id, r.Error)
		}
		// The refused request was one sampling attempt, which the result counts, as it
		// counts the attempt of an api_error of any other status (result.schema.json).
		if r.Attempts != 1 {
			t.Errorf("%s: attempts %d, want 1", id, r.Attempts)
		}
	}
	if failed != 1 {
		t.Fatalf("%d jobs failed, want the one refused", failed)
	}
}

// One check answers every refusal that came before it began, and a credential found refused
// answers every later refusal too (the worker stops; each job's next poll, coming back 401
// over the long-poll wait, must not send a check of its own); one found accepted does not.
func TestOneCredentialCheckAnswersTheRefusalsBeforeIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	refusedErr := &tinker.StatusError{Endpoint: "session_heartbeat", StatusCode: http.StatusUnauthorized}
	for _, tc := range []struct {
		name   string
		answer error
		later  int // checks run for a refusal after the first check
	}{
		{"refused", refusedErr, 0},
		{"accepted", nil, 1},
	} {
		var c credentialCheck
		checks := 0
		check := func(context.Context) error { checks++; return tc.answer }
		before := time.Now()
		if err := c.since(ctx, before, check); err != tc.answer {
			t.Fatalf("%s: first check: %v", tc.name, err)
		}
		if err := c.since(ctx, before, check); err != tc.answer || checks != 1 {
			t.Fatalf("%s: a refusal from before the check: %v after %d checks, want its answer from 1", tc.name, err, checks)
		}
		if err := c.since(ctx, time.Now().Add(time.Millisecond), check); err != tc.answer || checks != 1+tc.later {
			t.Fatalf("%s: a later refusal: %v after %d checks, want %d", tc.name, err, checks, 1+tc.later)
		}
	}
}

// A worker whose key the service refuses at start (restarted with a key still revoked) fails
// to open with ErrCredentialRefused, and leaves the same note for submit as one that stopped.
func TestAWorkerRefusedAtStartLeavesANote(t *testing.T) {
	t.Parallel()
	b := setup(t, queue.Config{}, tinkersim.Config{Faults: []tinkersim.Fault{{Kind: tinkersim.FaultUnauthorized}}})
	q := b.connect(t)
	_, err := Open(context.Background(), Config{Queue: q, TinkerBaseURL: b.simURL, TinkerAPIKey: fleettest.APIKey, Tokenizers: b.tokens})
	if !errors.Is(err, ErrCredentialRefused) {
		t.Fatalf("Open: %v, want ErrCredentialRefused", err)
	}
	if err := q.JS.Conn().Flush(); err != nil { // the note is not waited for
		t.Fatal(err)
	}
	fleettest.Eventually(t, 5*time.Second, "a note of the refusal, for submit", func() bool {
		notes, err := b.results.ReadNotes(context.Background(), "any")
		n := notes.Service
		return err == nil && n != nil && n.Stopped && n.Status == http.StatusUnauthorized && n.Endpoint == "client/config"
	})
}

// Workers that name their account (Config.Account) back off as one fleet whatever key each
// holds, as after a key rotation, where some took the new key from their file and others
// started with it; workers that name none back off with those of their own key only.
func TestANamedAccountIsOneFleetAcrossKeys(t *testing.T) {
	t.Parallel()
	const oldKey, newKey = fleettest.APIKey, "tml-new-key"
	b := setup(t, queue.Config{}, tinkersim.Config{Capacity: 64})
	if err := b.sim.SetAPIKeys(oldKey, newKey); err != nil {
		t.Fatal(err)
	}
	signaller := b.open(t, b.connect(t), Config{TinkerAPIKey: oldKey, Account: "research"})
	named := b.open(t, b.connect(t), Config{TinkerAPIKey: newKey, Account: "research"})
	unnamed := b.open(t, b.connect(t), Config{TinkerAPIKey: newKey})

	if err := signaller.backoff.Signal(context.Background(), backoff.ReasonRateLimited, time.Minute); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !time.Now().Before(named.backoff.Until()) {
		if time.Now().After(deadline) {
			t.Fatal("a worker of the same named account with another key never saw the backoff")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A barrier on the unnamed worker's own key, after the signal in the bucket's stream: a
	// delete, which changes no deadline. Its watch delivers entries in the stream's order, so
	// once it has applied the delete it has applied the signal too, had its watch seen it.
	ctx := context.Background()
	kv, err := b.results.JS.KeyValue(ctx, b.results.Names.BackoffBucket())
	if err != nil {
		t.Fatal(err)
	}
	key := accountKey(b.simURL, Config{TinkerAPIKey: newKey})
	if err := kv.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	hist, err := kv.History(ctx, key)
	if err != nil || len(hist) == 0 || hist[len(hist)-1].Operation() != jetstream.KeyValueDelete {
		t.Fatalf("the barrier's delete of %s: %v, history %v", key, err, hist)
	}
	barrier := hist[len(hist)-1].Revision()
	fleet := unnamed.Backoff().(*backoff.Fleet)
	fleettest.Eventually(t, 10*time.Second, "the unnamed worker's watch past the barrier", func() bool {
		return fleet.State().Revision >= barrier
	})
	if until := unnamed.backoff.Until(); time.Now().Before(until) {
		t.Fatalf("a worker of another key and no account name backs off until %v: its fleet is its key's", until)
	}
}

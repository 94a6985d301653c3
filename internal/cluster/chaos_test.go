package cluster

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

var (
	chaosOn       = flag.Bool("chaos", false, "run TestChaos: worker processes killed, a NATS node restarted, simulator faults")
	chaosDuration = flag.Duration("chaos.duration", 60*time.Second, "how long TestChaos injects faults")
	chaosJobs     = flag.Int("chaos.jobs", 5000, "jobs in TestChaos's batch")
	chaosWorkers  = flag.Int("chaos.workers", 3, "worker processes in TestChaos")
	chaosSeed     = flag.Uint64("chaos.seed", 1, "seed of TestChaos's schedule of kills")
)

// workerProc supervises one worker process slot: it can be killed and started again on the
// same metrics port.
type workerProc struct {
	bin, logDir string
	env         []string
	metricsAddr string
	slot        int

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	starts   int
	sigkills int
}

func (p *workerProc) start(t *testing.T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.starts++
	logf, err := os.Create(filepath.Join(p.logDir, fmt.Sprintf("worker-%d-%d.log", p.slot, p.starts)))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(p.bin)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Env = append(cmd.Env, "TINKERFLEET_METRICS_ADDR="+p.metricsAddr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		t.Fatalf("start worker %d: %v", p.slot, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(done) }() // ends when the process does
	p.cmd, p.done = cmd, done
}

// kill sends sig and waits for the process to end.
func (p *workerProc) kill(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if sig == syscall.SIGKILL {
		p.sigkills++
	}
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// backoffActive scrapes tinkerfleet_backoff_active from the worker; ok is false when the
// worker does not answer (killed, or starting).
func (p *workerProc) backoffActive(client *http.Client) (active, ok bool) {
	resp, err := client.Get("http://" + p.metricsAddr + "/metrics")
	if err != nil {
		return false, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, found := strings.CutPrefix(sc.Text(), "tinkerfleet_backoff_active "); found {
			return strings.TrimSpace(v) == "1", true
		}
	}
	return false, false
}

// buildWorker builds cmd/worker into dir.
func buildWorker(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "worker")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/worker")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build worker: %v\n%s", err, out)
	}
	return bin
}

// unionDuration is the total length of the union of intervals, clipped to [from, to].
func unionDuration(iv [][2]time.Time, from, to time.Time) time.Duration {
	sort.Slice(iv, func(i, j int) bool { return iv[i][0].Before(iv[j][0]) })
	var total time.Duration
	var curS, curE time.Time
	for _, x := range iv {
		s, e := x[0], x[1]
		if s.Before(from) {
			s = from
		}
		if e.After(to) {
			e = to
		}
		if !e.After(s) {
			continue
		}
		if curE.IsZero() || s.After(curE) {
			total += curE.Sub(curS)
			curS, curE = s, e
		} else if e.After(curE) {
			curE = e
		}
	}
	return total + curE.Sub(curS)
}

// TestChaos runs a batch on worker processes while they are SIGKILLed and restarted, a NATS
// node restarts, and the simulator injects 429 storms, paused queues, 5xx and 410s at once.
// Every job must end with exactly one result. Run with -chaos (see doc.go).
func TestChaos(t *testing.T) {
	if !*chaosOn {
		t.Skip("chaos run: go test ./internal/cluster -run Chaos -chaos -v")
	}
	dir := t.TempDir()
	bin := buildWorker(t, dir)
	rng := rand.New(rand.NewPCG(*chaosSeed, 0x7469))

	c := fleettest.StartCluster(t, 3)
	const concurrency = 16
	qcfg := queue.Config{Replicas: 3, AckWait: 5 * time.Second, MaxAckPending: *chaosWorkers * concurrency}
	admin := c.Connect(t, 0, "chaos-admin", qcfg)
	// Capacity above MaxAckPending: the backend is never full, so every 429 the fleet sees is
	// an injected one and the paused time can be set against the windows the simulator asked.
	sim, simURL := startSim(t, tinkersim.Config{
		Capacity: 256, BaseLatency: 500 * time.Millisecond, PerTokenLatency: 5 * time.Millisecond,
		LongPollWait: 500 * time.Millisecond, Seed: int64(*chaosSeed),
	})

	ports := fleettest.FreePorts(t, *chaosWorkers)
	env := []string{
		"NATS_URL=" + c.URLs(0),
		"TINKER_API_KEY=" + testKey,
		"TINKER_BASE_URL=" + simURL,
		"TINKERFLEET_REPLICAS=3",
		"TINKERFLEET_CONCURRENCY=" + strconv.Itoa(concurrency),
		"TINKERFLEET_ACK_WAIT=5s",
		"TINKERFLEET_MAX_ACK_PENDING=" + strconv.Itoa(qcfg.MaxAckPending),
		"TINKERFLEET_SHUTDOWN_GRACE=2s",
		"TINKERFLEET_LOG_LEVEL=info",
		"HF_HUB_OFFLINE=1",
	}
	procs := make([]*workerProc, *chaosWorkers)
	for i := range procs {
		procs[i] = &workerProc{bin: bin, logDir: dir, env: env, metricsAddr: "127.0.0.1:" + strconv.Itoa(ports[i]), slot: i + 1}
		procs[i].start(t)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.kill(syscall.SIGTERM)
		}
	})

	const batch = "chaos"
	published := makeJobs(*chaosJobs)
	publishJobs(t, admin, batch, published)
	begin := time.Now()
	t.Logf("published %d jobs; %d worker processes, concurrency %d, MaxAckPending %d", len(published), len(procs), concurrency, qcfg.MaxAckPending)

	// The simulator's faults: background 5xx and 410s for the whole chaos phase, and a
	// 429 storm or a paused queue every ten seconds.
	chaosEnd := begin.Add(*chaosDuration)
	mustInject := func(f tinkersim.Fault) {
		if _, err := sim.Inject(f); err != nil {
			t.Fatal(err)
		}
	}
	mustInject(tinkersim.Fault{Kind: tinkersim.FaultServerError, Rate: 0.03, Duration: *chaosDuration, Status: 503})
	mustInject(tinkersim.Fault{Kind: tinkersim.FaultExpired, Rate: 0.02, Duration: *chaosDuration})
	kinds := []tinkersim.FaultKind{tinkersim.FaultRateLimit, tinkersim.FaultPausedCapacity, tinkersim.FaultRateLimit, tinkersim.FaultPausedRateLimit}
	for i, at := 0, 5*time.Second; at+4*time.Second < *chaosDuration; i, at = i+1, at+10*time.Second {
		d := 2*time.Second + time.Duration(rng.IntN(3))*time.Second
		mustInject(tinkersim.Fault{Kind: kinds[i%len(kinds)], Start: begin.Add(at), Duration: d, Reason: "chaos"})
	}

	// Sample the fleet's backoff gauge every 100 ms: paused while any live worker says so.
	ctx, stopSampling := context.WithCancel(context.Background())
	var (
		sampling    sync.WaitGroup
		pausedMu    sync.Mutex
		paused      [][2]time.Time
		pausedSince time.Time
	)
	sampling.Go(func() {
		client := &http.Client{Timeout: 500 * time.Millisecond}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				on := false
				for _, p := range procs {
					if a, ok := p.backoffActive(client); ok && a {
						on = true
						break
					}
				}
				pausedMu.Lock()
				switch {
				case on && pausedSince.IsZero():
					pausedSince = now
				case !on && !pausedSince.IsZero():
					paused = append(paused, [2]time.Time{pausedSince, now})
					pausedSince = time.Time{}
				}
				pausedMu.Unlock()
			}
		}
	})

	// Kill a random worker with SIGKILL every 4-8 s and start it again a second later;
	// restart one NATS node (not node 0, the admin's first) a third of the way through.
	natsRestarted := false
	for time.Now().Before(chaosEnd) {
		time.Sleep(4*time.Second + time.Duration(rng.IntN(4000))*time.Millisecond)
		if !natsRestarted && time.Since(begin) > *chaosDuration/3 {
			victim := 1 + rng.IntN(c.Len()-1)
			t.Logf("%5.1fs restarting NATS node %s", time.Since(begin).Seconds(), c.Name(victim))
			c.Stop(victim)
			time.Sleep(3 * time.Second)
			c.Start(victim)
			natsRestarted = true
			continue
		}
		p := procs[rng.IntN(len(procs))]
		t.Logf("%5.1fs SIGKILL worker %d", time.Since(begin).Seconds(), p.slot)
		p.kill(syscall.SIGKILL)
		time.Sleep(time.Second)
		p.start(t)
	}
	t.Logf("%5.1fs chaos over; waiting for the batch to finish", time.Since(begin).Seconds())

	err := func() error {
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) {
			n, err := admin.ResultsStored(context.Background(), batch)
			if err == nil && n >= len(published) {
				return nil
			}
			time.Sleep(500 * time.Millisecond)
		}
		return errors.New("batch did not finish within 3 minutes of the chaos phase")
	}()
	finished := time.Now()
	stopSampling()
	sampling.Wait()
	pausedMu.Lock()
	if !pausedSince.IsZero() {
		paused = append(paused, [2]time.Time{pausedSince, finished})
	}
	fleetPaused := unionDuration(paused, begin, finished)
	pausedMu.Unlock()

	var asked [][2]time.Time
	windows := 0
	for _, w := range sim.Stats().Windows {
		end := w.End
		if end.IsZero() {
			end = finished
		}
		asked = append(asked, [2]time.Time{w.Start, end})
		windows++
	}
	simAsked := unionDuration(asked, begin, finished)

	counts, results := readResults(t, admin, batch)
	rinfo, rerr := admin.Results.Info(context.Background())
	if rerr != nil {
		t.Fatal(rerr)
	}
	losses := 0
	for _, j := range published {
		if counts[j.CustomID] == 0 {
			losses++
		}
	}
	// One message per subject is kept: a second result for a job replaces the first and
	// shows as a sequence number beyond the message count.
	duplicates := int(rinfo.State.LastSeq) - int(rinfo.State.Msgs)
	byStatus := map[string]int{}
	for _, r := range results {
		key := string(r.Status)
		if r.Status != jobs.StatusOK && r.Error != nil {
			key += "/" + r.Error.Code
		}
		byStatus[key]++
	}
	statusKeys := make([]string, 0, len(byStatus))
	for k := range byStatus {
		statusKeys = append(statusKeys, k)
	}
	sort.Strings(statusKeys)
	var statusParts []string
	for _, k := range statusKeys {
		statusParts = append(statusParts, fmt.Sprintf("%s %d", k, byStatus[k]))
	}
	kills, starts := 0, 0
	for _, p := range procs {
		kills += p.sigkills
		starts += p.starts
	}
	st := sim.Stats()
	summary := []string{
		fmt.Sprintf("chaos: %s of faults, batch done in %s", chaosDuration.String(), finished.Sub(begin).Round(100*time.Millisecond)),
		fmt.Sprintf("  worker processes: %d, SIGKILLed %d times, started %d times; NATS node restarts: 1", len(procs), kills, starts),
		fmt.Sprintf("  simulator: %d 429/pause windows, 5xx at 3%% and 410 at 2%% of requests; asample 429: %d (capacity %d), 503: %d; retrieve_future 410: %d, 503: %d",
			windows, st.Requests["asample"][429], st.CapacityRejections, st.Requests["asample"][503], st.Requests["retrieve_future"][410], st.Requests["retrieve_future"][503]),
		fmt.Sprintf("  jobs in: %d, results out: %d (%s)", len(published), len(counts), strings.Join(statusParts, ", ")),
		fmt.Sprintf("  duplicates: %d, losses: %d", duplicates, losses),
		fmt.Sprintf("  fleet paused (tinkerfleet_backoff_active=1 on any worker): %s; simulator asked (429 and pause windows): %s",
			fleetPaused.Round(100*time.Millisecond), simAsked.Round(100*time.Millisecond)),
	}
	for _, l := range summary {
		t.Log(l)
	}
	if err != nil {
		t.Fatal(err)
	}
	if duplicates != 0 || losses != 0 || len(counts) != len(published) {
		t.Fatalf("duplicates %d, losses %d, results %d of %d", duplicates, losses, len(counts), len(published))
	}
}

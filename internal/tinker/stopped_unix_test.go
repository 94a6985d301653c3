//go:build unix

package tinker_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// stoppedChild names the environment variable that makes this test binary the sampling
// process of TestAnswersThatCameWhileTheProcessWasStoppedAreRead: its value is the
// simulator's URL.
const stoppedChild = "TINKERFLEET_TEST_STOPPED_SIM"

const (
	stoppedSamples     = 24
	stoppedPollTimeout = time.Second
)

// TestAnswersThatCameWhileTheProcessWasStoppedAreRead: a process stopped while its polls wait
// (Ctrl-Z, SIGSTOP, a paused container or VM) finds on waking the answers that came meanwhile
// in its sockets, and its polls' timeouts, due during the stop, firing at the same moment. It
// reads the answers: none of its samples is sent again, though the service has let the
// futures go by then (410 to any poll sent again, §4.2), so that a sample sent again would be
// paid for twice.
func TestAnswersThatCameWhileTheProcessWasStoppedAreRead(t *testing.T) {
	if url := os.Getenv(stoppedChild); url != "" {
		sampleThroughAStop(url)
		return
	}
	t.Parallel()
	sim, err := tinkersim.New(tinkersim.Config{
		APIKeys:      []string{simKey},
		BaseLatency:  200 * time.Millisecond,
		LongPollWait: 10 * time.Second,
		// Gone 300 ms after the answer was sent, long before the process wakes.
		ReadTTL: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	t.Cleanup(func() { ts.Close(); sim.Close() })

	child := exec.Command(os.Args[0], "-test.run=^TestAnswersThatCameWhileTheProcessWasStoppedAreRead$")
	child.Env = append(os.Environ(), stoppedChild+"="+ts.URL)
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	child.Stderr = &stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "submitted" {
		t.Fatalf("the sampling process said %q, want \"submitted\"; stderr:\n%s", lines.Text(), stderr.String())
	}
	// Every poll is out, and its answer comes within 200 ms. Stopped for 3 s, the process
	// wakes 2 s past its polls' timeouts and 2.5 s after the service let the futures go.
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stdout)
	if err := child.Wait(); err != nil {
		t.Fatalf("the sampling process: %v\nstdout: %s\nstderr:\n%s", err, rest, stderr.String())
	}
	if got, want := strings.TrimSpace(string(rest)), fmt.Sprintf("%d samples, %d submissions", stoppedSamples, stoppedSamples); got != want {
		t.Errorf("the sampling process said %q, want %q (a sample submitted again lost its answer)", got, want)
	}
	if got := sim.Stats().SamplesAccepted; got != stoppedSamples {
		t.Errorf("the service accepted %d samples, want %d", got, stoppedSamples)
	}
}

// sampleThroughAStop is the stopped process: it sends stoppedSamples samples to the simulator
// at url, says "submitted" once the service accepted them all (its parent stops it then), and
// says how many samples ended and how many submissions they took.
func sampleThroughAStop(url string) {
	var accepted atomic.Int64
	submitted := make(chan struct{})
	ctx := context.Background()
	c, err := tinker.Dial(ctx, tinker.Config{
		BaseURL: url, APIKey: simKey,
		Timing: tinker.Timing{PollTimeout: stoppedPollTimeout, HeartbeatInterval: time.Hour},
		OnEvent: func(e tinker.Event) {
			if e.Kind == tinker.EventRequest && e.Endpoint == "asample" && e.StatusCode == 200 &&
				accepted.Add(1) == stoppedSamples {
				close(submitted)
			}
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer c.Close()
	s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var (
		wg          sync.WaitGroup
		submissions atomic.Int64
		ok          atomic.Int64
	)
	for i := range stoppedSamples {
		wg.Go(func() {
			res, err := s.Sample(ctx, simRequest(int64(i)))
			if err != nil {
				fmt.Fprintln(os.Stderr, "sample:", err)
				return
			}
			ok.Add(1)
			submissions.Add(int64(res.Submissions))
		})
	}
	<-submitted
	fmt.Println("submitted")
	wg.Wait()
	fmt.Printf("%d samples, %d submissions\n", ok.Load(), submissions.Load())
	os.Exit(0)
}

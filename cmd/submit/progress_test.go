package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestProgressRateCountsFromTheFirstRead: the first read brings at once the results stored
// while the batch was published (or a resumed reader's backlog); the rate and ETA count from
// it, and show only once a second has passed. Before, they counted from before the first
// read, and the first line of a 200,000-line run read "1024/200000 0% | … | 87095.7/s | ETA 2s".
func TestProgressRateCountsFromTheFirstRead(t *testing.T) {
	var out bytes.Buffer
	clock := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	p := newProgress(progressOptions{mode: "lines", interval: 10 * time.Second}, &environment{stderr: &out}, 10000)
	p.now = func() time.Time { return clock }

	clock = clock.Add(12 * time.Millisecond) // the first read, 12 ms after newProgress
	s := summary{ok: 1024}
	p.update(&s)
	if line := strings.TrimSpace(out.String()); line != "1024/10000 10% | ok 1024 error 0" {
		t.Fatalf("first line %q: want no rate", line)
	}
	clock = clock.Add(500 * time.Millisecond)
	s.ok = 1100
	if line := p.text(&s, clock); strings.Contains(line, "/s") {
		t.Fatalf("a rate half a second after the first read: %q", line)
	}
	// 100 a second since the first read: 1,000 more in 10 s, 5,976 left.
	clock = clock.Add(9500 * time.Millisecond)
	s.ok, s.failed = 1974, 50
	p.update(&s)
	want := "2024/10000 20% | ok 1974 error 50 | 100.0/s | ETA 1m20s"
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || lines[1] != want {
		t.Fatalf("printed %q: want a second line %q", lines, want)
	}
}

// TestProgressLinesEndOnTheLastState: in lines mode the run's last state is printed at its
// end, unless the last line said it already; before, a short run's log read "1/21 4%" and then
// its summary, as if it had stalled at 4 %.
func TestProgressLinesEndOnTheLastState(t *testing.T) {
	var out bytes.Buffer
	clock := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	p := newProgress(progressOptions{mode: "lines", interval: 10 * time.Second}, &environment{stderr: &out}, 21)
	p.now = func() time.Time { return clock }
	s := summary{ok: 1}
	p.update(&s)
	clock = clock.Add(2 * time.Second)
	s.ok, s.failed = 19, 2
	p.update(&s) // within the interval: not printed
	p.finish(&s)
	p.finish(&s) // the last line says it already
	want := []string{"1/21 4% | ok 1 error 0", "21/21 100% | ok 19 error 2 | 10.0/s"}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("printed %q, want %q", lines, want)
	}
}

// TestStalledProgressShowsHowLongNotWhen: while a stall is explained, the line says how long
// no result has come instead of an ETA (which would be a guess), and the explanation is
// printed once per cause; the ETA comes back with the next result.
func TestStalledProgressShowsHowLongNotWhen(t *testing.T) {
	var out bytes.Buffer
	clock := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	p := newProgress(progressOptions{mode: "lines", interval: 10 * time.Second}, &environment{stderr: &out}, 1000)
	p.now = func() time.Time { return clock }
	s := summary{ok: 100}
	p.update(&s)
	p.resumed()
	clock = clock.Add(10 * time.Second)
	s.ok = 200
	p.resumed() // the last result, 10 s after the first read
	if line := p.text(&s, clock); !strings.HasSuffix(line, "| 10.0/s | ETA 1m20s") {
		t.Fatalf("before the stall: %q", line)
	}

	clock = clock.Add(25 * time.Second)
	p.stalled(stallNoWorker, "no result for 25s: no worker is taking jobs")
	p.stalled(stallNoWorker, "no result for 25s: no worker is taking jobs")
	if n := strings.Count(out.String(), "no worker is taking jobs"); n != 1 {
		t.Fatalf("the cause was printed %d times, want once:\n%s", n, out.String())
	}
	if line := p.text(&s, clock); !strings.HasSuffix(line, "| 2.9/s | no result for 25s") || strings.Contains(line, "ETA") {
		t.Fatalf("during the stall: %q", line)
	}
	p.stalled(stallPaused, "no result for 35s: the fleet is paused")
	if !strings.HasSuffix(strings.TrimSpace(out.String()), "no result for 35s: the fleet is paused") {
		t.Fatalf("a new cause was not printed:\n%s", out.String())
	}

	clock = clock.Add(time.Second)
	s.ok = 201
	p.resumed()
	if line := p.text(&s, clock); !strings.Contains(line, "ETA") || strings.Contains(line, "no result") {
		t.Fatalf("after a result: %q", line)
	}
}

// TestProgressRateFollowsTheLastMinute: the rate is that of the last minute, so the ETA
// follows a fleet that grows; and a stall that was shown does not hold it down once results
// come again.
func TestProgressRateFollowsTheLastMinute(t *testing.T) {
	var out bytes.Buffer
	clock := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	p := newProgress(progressOptions{mode: "lines", interval: 10 * time.Second}, &environment{stderr: &out}, 1_000_000)
	p.now = func() time.Time { return clock }
	s := summary{}
	run := func(d time.Duration, perSecond int) { // results come for d at perSecond, read every 100 ms
		for end := clock.Add(d); clock.Before(end); {
			clock = clock.Add(100 * time.Millisecond)
			s.ok += perSecond / 10
			p.resumed()
			p.update(&s)
		}
	}

	run(10*time.Minute, 100) // one worker
	run(2*time.Minute, 1000) // ten
	if line := p.text(&s, clock); !strings.HasSuffix(line, "| 1000.0/s | ETA 13m40s") {
		t.Fatalf("two minutes after the fleet grew tenfold: %q; want the rate of ten workers", line)
	}

	clock = clock.Add(5 * time.Minute) // nothing for five minutes, said
	p.stalled(stallNoWorker, "no result for 5m0s: no worker is taking jobs")
	run(10*time.Second, 100)
	if line := p.text(&s, clock); !strings.HasSuffix(line, "| 100.0/s | ETA 2h16m30s") {
		t.Fatalf("ten seconds after results came back at 100/s: %q; want that rate, not one held down by the stall", line)
	}
}

// TestProgressRateLeavesOutTheBacklog: a reader that joins a batch whose results are mostly
// stored (results --wait after a submit without it, or a new -o file) reads them all in its
// first moments; its rate and ETA count from when it has caught up, not from its first read.
// Before, the backlog, read result by result, counted as the first second's results, and the
// lines of the next minute read hundreds a second for a batch that got ten.
func TestProgressRateLeavesOutTheBacklog(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n, backlog = 300, 250
	stdout, _, err := f.submit(ctx, writeLines(t, jobLines(n)))
	if err != nil {
		t.Fatal(err)
	}
	batch := strings.TrimSpace(stdout)
	q := bind(t, f)
	codec, err := queue.NewCodec(0)
	if err != nil {
		t.Fatal(err)
	}
	store := func(i int) {
		res := jobs.Result{CustomID: fmt.Sprintf("job-%05d", i), BatchID: batch, Status: jobs.StatusOK, Model: "Qwen/Qwen3-8B"}
		data, err := res.AppendJSON(nil)
		if err == nil {
			var m *nats.Msg
			if m, err = q.ResultMsg(nil, codec, batch, res.CustomID, string(res.Status), queue.Tokens{}, data, 0); err == nil {
				_, err = q.PublishResult(ctx, m)
			}
		}
		if err != nil {
			t.Error(err)
		}
	}
	for i := range backlog {
		store(i)
	}
	var stderr fleettest.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr, tty: 0}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"results", "--nats-url", f.nats, batch, "--wait", "-o", filepath.Join(t.TempDir(), "out.jsonl"),
			"--progress", "lines", "--progress-interval", "1s"}, env)
	}()
	time.Sleep(500 * time.Millisecond) // the reader has read the backlog
	for i := backlog; i < n; i++ {     // then 10 a second
		store(i)
		time.Sleep(100 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatalf("results: %v\n%s", err, stderr.String())
	}
	rates := regexp.MustCompile(`\| ([0-9.]+)/s`).FindAllStringSubmatch(stderr.String(), -1)
	if len(rates) == 0 {
		t.Fatalf("no rate shown:\n%s", stderr.String())
	}
	for _, r := range rates {
		if rate, _ := strconv.ParseFloat(r[1], 64); rate > 20 {
			t.Fatalf("a rate of %s/s shown for results that came at 10 a second:\n%s", r[1], stderr.String())
		}
	}
}

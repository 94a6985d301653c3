package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// testPass is a pass's progress in mode, on a clock that the test moves.
func testPass(mode string, total int) (*passProgress, *bytes.Buffer, *time.Time) {
	out := new(bytes.Buffer)
	clock := new(time.Time)
	*clock = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p := newPassProgress(progressOptions{mode: mode, interval: 10 * time.Second}, &environment{stderr: out}, "publishing", "jobs stored", total)
	p.now = func() time.Time { return *clock }
	p.start = *clock
	return p, out, clock
}

// TestAPassShowsALineEveryIntervalAndEndsOnItsLastState: in lines mode a pass prints a line
// each interval, none before the first, and its last state at its end if the last line
// printed did not say it.
func TestAPassShowsALineEveryIntervalAndEndsOnItsLastState(t *testing.T) {
	p, out, clock := testPass("lines", 10000)
	*clock = clock.Add(5 * time.Second)
	p.update(1024)
	if out.Len() != 0 {
		t.Fatalf("printed %q within the first interval", out)
	}
	*clock = clock.Add(5 * time.Second)
	p.update(2048)
	*clock = clock.Add(5 * time.Second)
	p.update(4096) // within the interval after the line
	*clock = clock.Add(2 * time.Second)
	p.end(10000, true)
	p.end(10000, true) // once
	want := "publishing: 2048/10000 jobs stored 20% | 204.8/s | ETA 39s\n" +
		"publishing: 10000/10000 jobs stored 100% | 588.2/s\n"
	if out.String() != want {
		t.Fatalf("printed %q, want %q", out, want)
	}
}

// TestAPassOnATerminalIsDrawnAfterASecondAndCleared: on a terminal a pass shows nothing for a
// second, then draws its line in place (at most every passRedraw), which it clears at its
// end; a line printed meanwhile starts on a cleared line.
func TestAPassOnATerminalIsDrawnAfterASecondAndCleared(t *testing.T) {
	p, out, clock := testPass("bar", 0)
	p.what, p.counted = "validating", "lines"
	*clock = clock.Add(500 * time.Millisecond)
	p.update(500)
	if out.Len() != 0 {
		t.Fatalf("drew %q within the first second", out)
	}
	*clock = clock.Add(750 * time.Millisecond)
	p.update(1000)
	*clock = clock.Add(50 * time.Millisecond)
	p.update(1100) // too soon after the last drawing
	fmt.Fprintln(p.lines(), "in.jsonl:1200: field model: is required")
	*clock = clock.Add(100 * time.Millisecond)
	p.update(1300)
	p.end(1400, true)
	want := "\r\033[Kvalidating: 1000 lines | 800.0/s" +
		"\r\033[Kin.jsonl:1200: field model: is required\n" +
		"\r\033[Kvalidating: 1300 lines | 928.6/s" +
		"\r\033[K"
	if out.String() != want {
		t.Fatalf("wrote %q, want %q", out, want)
	}
}

// TestAShortPassSaysNothing: a pass over before its first line is due (the interval in lines
// mode, a second on a terminal) writes nothing, so a small batch's output is what it was.
func TestAShortPassSaysNothing(t *testing.T) {
	for mode, lasts := range map[string]time.Duration{"lines": 9 * time.Second, "bar": 900 * time.Millisecond} {
		p, out, clock := testPass(mode, 100)
		*clock = clock.Add(lasts)
		p.update(90)
		p.end(100, true)
		if out.Len() != 0 {
			t.Errorf("%s: a pass of %v wrote %q", mode, lasts, out)
		}
	}
}

// TestAPassWithoutProgressSaysNothing: --progress none shows no pass, and lines printed
// during one are printed as they are.
func TestAPassWithoutProgressSaysNothing(t *testing.T) {
	p, out, clock := testPass("none", 100)
	*clock = clock.Add(time.Minute)
	p.update(50)
	fmt.Fprintln(p.lines(), "a line")
	p.end(100, true)
	if out.String() != "a line\n" {
		t.Fatalf("wrote %q", out)
	}
}

// TestAPassShowsHowMuchOfItsInputItHasRead: a pass whose count has no total shows the share
// of its input's bytes read, and the time left at the rate so far; at most 99 % until it
// ends (the bytes are read ahead of the lines), 100 % at its end; nothing of the kind where
// the input's size is not known.
func TestAPassShowsHowMuchOfItsInputItHasRead(t *testing.T) {
	p, out, clock := testPass("lines", 0)
	p.what, p.counted = "validating", "lines"
	var read atomic.Int64
	p.setRead(&read, 4000)
	*clock = clock.Add(10 * time.Second)
	read.Store(1000)
	p.update(2000)
	*clock = clock.Add(10 * time.Second)
	read.Store(4000)
	p.update(7900)
	*clock = clock.Add(time.Second)
	p.end(7900, true)   // the count shown, but not the whole
	p.setRead(&read, 0) // a pipe among the inputs
	*clock = clock.Add(10 * time.Second)
	p.update(9000)
	want := "validating: 2000 lines 25% | 200.0/s | ETA 30s\n" +
		"validating: 7900 lines 99% | 395.0/s\n" +
		"validating: 7900 lines 100% | 376.2/s\n" +
		"validating: 9000 lines | 290.3/s\n"
	if out.String() != want {
		t.Fatalf("printed %q, want %q", out, want)
	}
}

// TestAStoppedPassEndsOnWhatItDid: a pass stopped by an error or an interrupt ends on the share
// it had read (in whole per cents, not cut short by floating point: 29 of 100 bytes is 29 %),
// and, as a publishing pass too, shows no time left.
func TestAStoppedPassEndsOnWhatItDid(t *testing.T) {
	p, out, clock := testPass("lines", 0)
	p.what, p.counted = "validating", "lines"
	var read atomic.Int64
	p.setRead(&read, 100)
	*clock = clock.Add(10 * time.Second)
	read.Store(20)
	p.update(2000)
	*clock = clock.Add(5 * time.Second)
	read.Store(29)
	p.end(2900, false)
	publishing, out2, clock2 := testPass("lines", 10000)
	*clock2 = clock2.Add(10 * time.Second)
	publishing.update(2048)
	*clock2 = clock2.Add(2 * time.Second)
	publishing.end(4096, false)
	want := "validating: 2000 lines 20% | 200.0/s | ETA 40s\n" +
		"validating: 2900 lines 29% | 193.3/s\n"
	if out.String() != want {
		t.Errorf("printed %q, want %q", out, want)
	}
	want = "publishing: 2048/10000 jobs stored 20% | 204.8/s | ETA 39s\n" +
		"publishing: 4096/10000 jobs stored 40% | 341.3/s\n"
	if out2.String() != want {
		t.Errorf("printed %q, want %q", out2, want)
	}
}

// TestSubmitShowsHowFarItsPassesAre: a submit run shows how far its validation and its
// publishing are (here a line each millisecond), and ends the publishing on every job stored.
func TestSubmitShowsHowFarItsPassesAre(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	in := writeLines(t, jobLines(20000))
	_, stderr, err := f.submit(context.Background(), "--batch-id", "passes", "--progress", "lines", "--progress-interval", "1ms", in)
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, stderr)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^validating: [0-9]+ lines [0-9]+%`), // of the file's bytes
		regexp.MustCompile(`(?m)^publishing: [0-9]+/20000 jobs stored [0-9]+%`),
		regexp.MustCompile(`(?m)^publishing: 20000/20000 jobs stored 100%.*\nbatch passes: 20000 jobs submitted$`),
	} {
		if !want.MatchString(strings.TrimSpace(stderr)) {
			t.Errorf("stderr has no line like %s:\n%s", want, stderr)
		}
	}
	if n := jobsIn(t, bind(t, f)); n != 20000 {
		t.Fatalf("the stream holds %d jobs, want 20000", n)
	}
}

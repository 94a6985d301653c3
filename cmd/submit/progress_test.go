package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
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
	if line := p.line(&s, clock, false); strings.Contains(line, "/s") {
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

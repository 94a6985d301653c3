package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestDrawnLinesFitTheTerminal: a line drawn in place is cut a column short of the
// terminal's width, counting the bar's dots as the one column each they take, and left whole
// where the width is not known.
func TestDrawnLinesFitTheTerminal(t *testing.T) {
	for _, c := range []struct {
		line  string
		width int
		want  string
	}{
		{"abcdef", 4, "abc"},
		{"[##··] 1/2", 5, "[##·"},
		{"abcdef", 7, "abcdef"},
		{"abcdef", 6, "abcde"},
		{"abcdef", 0, "abcdef"},
	} {
		if got := drawn(c.line, c.width); got != c.want {
			t.Errorf("drawn(%q, %d) = %q, want %q", c.line, c.width, got, c.want)
		}
	}
}

// TestProgressIsDrawnWithinTheTerminal: the results' bar of a batch of 100,000 jobs takes 85
// columns; on a terminal 80 wide it is drawn in 79, its bar narrower and every figure kept,
// so that each drawing replaces the last rather than wrapping below it. On one too narrow for
// the figures and a bar of minBarWidth, the bar is left out and the figures cut. A pass's
// line is cut likewise.
func TestProgressIsDrawnWithinTheTerminal(t *testing.T) {
	var out bytes.Buffer
	clock := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	p := newProgress(progressOptions{mode: "bar", interval: 10 * time.Second}, &environment{stderr: &out}, 100000)
	p.now = func() time.Time { return clock }
	columns := 0
	p.width = func() int { return columns }
	s := summary{ok: 50000}
	p.update(&s)
	clock = clock.Add(2 * time.Second)
	s.ok, s.failed = 50190, 10
	text := p.text(&s, clock)
	if whole := p.barLine(&s, clock, 0); utf8.RuneCountInString(whole) != 85 || !strings.HasSuffix(whole, "] "+text) || !strings.Contains(text, "ETA") {
		t.Fatalf("with the width not known, the bar is %q: the test needs one of 85 columns, with the rate and ETA", whole)
	}
	draw := func(cols int) string {
		columns = cols
		out.Reset()
		p.last = time.Time{}
		p.update(&s)
		return strings.TrimPrefix(out.String(), "\r\033[K")
	}
	if got := draw(80); utf8.RuneCountInString(got) != 79 || !strings.HasPrefix(got, "[#########·········] ") || !strings.HasSuffix(got, "] "+text) {
		t.Fatalf("on 80 columns, drew %q: want 79 columns, a bar of 18 and every figure (%q)", got, text)
	}
	if got := draw(40); got != text[:39] {
		t.Fatalf("on 40 columns, drew %q, want the figures cut to 39 columns and no bar", got)
	}
	columns = 80
	out.Reset()
	p.finish(&s)
	if !strings.HasSuffix(out.String(), "] "+text+"\n") || utf8.RuneCountInString(out.String()) != len("\r\033[K")+79+1 {
		t.Fatalf("finished with %q: want the line as drawn on 80 columns", out.String())
	}

	pass, out2, clock2 := testPass("bar", 1000000)
	pass.width = func() int { return 30 }
	*clock2 = clock2.Add(2 * time.Second)
	pass.update(430000)
	if got, want := out2.String(), "\r\033[K"+pass.line(430000, *clock2, passRunning)[:29]; got != want {
		t.Fatalf("the pass drew %q, want %q", got, want)
	}
}

package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress shows how far a batch is: a redrawn bar on a terminal, a plain line every interval
// otherwise.
type progress struct {
	w        io.Writer
	bar      bool
	none     bool
	interval time.Duration
	total    int
	now      func() time.Time
	width    func() int // of the terminal drawn on (terminalWidth; 0: not known)
	last     time.Time
	shown    int // the results done on the last line printed (lines mode)

	// The rate and ETA count over the last minute of reads (marks, oldest first, one a second
	// at most), so that they follow a fleet that grows, shrinks or is throttled. They start
	// once the reader has caught up (caughtUp), not at newProgress nor at its first read: it
	// reads at once the results stored while the batch was being published, or a resumed
	// reader's backlog, which over the milliseconds since newProgress made a rate of tens of
	// thousands a second, and, counted from the first of them, hundreds a second for a
	// minute where ten came. A stall that was shown starts them again when results come
	// back: the minutes without any would otherwise hold the rate down, and the ETA up, for
	// a minute more.
	marks   []mark
	restart bool // the reader caught up, or a shown stall ended: the next read starts the marks again

	said       stallKind // the cause of the current stall last shown, stallNone if none
	lastResult time.Time // when the last result came (newProgress's time before the first)
}

// mark is how many results were done at a read.
type mark struct {
	at   time.Time
	done int
}

const (
	rateWindow = time.Second // the shortest time over which a rate is shown
	rateSpan   = time.Minute // the longest: the rate of the last minute
)

func newProgress(o progressOptions, env *environment, total int) *progress {
	p := &progress{w: env.stderr, interval: o.interval, total: total, now: time.Now}
	p.width = func() int { return terminalWidth(p.w) }
	p.lastResult = p.now()
	p.none, p.bar = o.style(env)
	return p
}

// isTerminal reports whether progress, on env's standard error, is shown on a terminal.
func isTerminal(env *environment) bool {
	switch env.tty {
	case 1:
		return true
	case 0:
		return false
	}
	return writesToTerminal(env.stderr)
}

// writesToTerminal reports whether w is a terminal.
func writesToTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// update shows s, after each read of results.
func (p *progress) update(s *summary) {
	if p.none {
		return
	}
	now := p.now()
	p.mark(now, s.total())
	if p.bar {
		if now.Sub(p.last) < 100*time.Millisecond {
			return
		}
		p.last = now
		columns := p.width()
		fmt.Fprintf(p.w, "\r\033[K%s", drawn(p.barLine(s, now, columns), columns))
		return
	}
	if now.Sub(p.last) < p.interval {
		return
	}
	p.last, p.shown = now, s.total()
	fmt.Fprintln(p.w, p.text(s, now))
}

// finish shows the last state: the bar's last drawing, or a last line unless the last one
// printed says it already. A short run's log otherwise ended on its first line, "1/21 4%",
// as if it had stalled there.
func (p *progress) finish(s *summary) {
	if p.none {
		return
	}
	if p.bar {
		fmt.Fprintf(p.w, "\r\033[K%s\n", p.barLine(s, p.now(), p.width()))
		return
	}
	if !p.last.IsZero() && s.total() != p.shown {
		p.shown = s.total()
		fmt.Fprintln(p.w, p.text(s, p.now()))
	}
}

// drawn is line as it is drawn in place on a terminal width columns wide (0: not known): cut
// a column short of the width. A longer line wraps, and "\r\033[K" then clears only its last
// row, so each drawing left the rows above it behind, ten a second: the results' bar of a
// batch of 100,000 jobs took about 85 columns, where a terminal opens 80 wide on many
// systems. That bar narrows first, to keep its figures whole (progress.barLine); this cuts what
// is still too long. The lines drawn hold only characters one column wide.
func drawn(line string, width int) string {
	if width <= 1 {
		return line
	}
	columns := 0
	for i := range line {
		if columns == width-1 {
			return line[:i]
		}
		columns++
	}
	return line
}

// stalled shows why results stopped (explain), on a line of its own above the bar, when the
// cause is new: a stall that goes on says it once, not at every look.
func (p *progress) stalled(kind stallKind, text string) {
	if p.none || kind == stallNone || kind == p.said {
		return
	}
	p.said = kind
	if p.bar {
		fmt.Fprintf(p.w, "\r\033[K%s\n", text)
		p.last = time.Time{} // draw the bar again below it at once
		return
	}
	fmt.Fprintln(p.w, text)
}

// mark records done at now, at most once a second, and forgets the marks the last minute
// does not need.
func (p *progress) mark(now time.Time, done int) {
	if p.restart {
		p.marks, p.restart = p.marks[:0], false
	}
	if n := len(p.marks); n > 0 && now.Sub(p.marks[n-1].at) < time.Second {
		return
	}
	p.marks = append(p.marks, mark{now, done})
	drop := 0
	for drop+1 < len(p.marks) && now.Sub(p.marks[drop+1].at) >= rateSpan {
		drop++
	}
	p.marks = append(p.marks[:0], p.marks[drop:]...)
}

// resumed records that a result came: the next stall is shown whatever its cause, and one
// that was shown ends (the rate starts again).
func (p *progress) resumed() {
	if p.said != stallNone {
		p.restart = true
	}
	p.said, p.lastResult = stallNone, p.now()
}

// caughtUp records that the reader has read every result stored when it began: the rate
// counts from the next read.
func (p *progress) caughtUp() { p.restart = true }

// quiet is how long no result has come (since newProgress, before the first).
func (p *progress) quiet() time.Duration { return p.now().Sub(p.lastResult) }

// barLine renders the bar and the figures, e.g. "[#####·····] 512/1000 51% | ok 500 error 12 |
// 85.3/s | ETA 5s", for a terminal columns wide (0: not known; see barWidth).
func (p *progress) barLine(s *summary, now time.Time, columns int) string {
	text := p.text(s, now)
	if p.total <= 0 {
		return text
	}
	width := barWidth
	if columns > 0 {
		width = min(width, columns-1-len("[] ")-len(text)) // the figures first: a bar fits the rest
	}
	if width < minBarWidth {
		return text
	}
	filled := min(width, s.total()*width/p.total)
	return "[" + strings.Repeat("#", filled) + strings.Repeat("·", width-filled) + "] " + text
}

// The bar is barWidth columns wide, or narrower on a terminal that has not the room for it
// and the figures after it, down to minBarWidth; narrower, it is left out.
const (
	barWidth    = 24
	minBarWidth = 8
)

// text renders the figures, the line printed where no bar is drawn: e.g. "512/1000 51% | ok 500 error 12 | 85.3/s | ETA 5s".
func (p *progress) text(s *summary, now time.Time) string {
	done := s.total()
	var b strings.Builder
	pct := 100
	if p.total > 0 {
		pct = done * 100 / p.total
	}
	fmt.Fprintf(&b, "%d/%d %d%% | ok %d error %d", done, p.total, pct, s.ok, s.failed)
	if s.cancelled > 0 {
		fmt.Fprintf(&b, " cancelled %d", s.cancelled)
	}
	if len(p.marks) == 0 || now.Sub(p.marks[0].at) < rateWindow {
		return b.String()
	}
	since := p.marks[0]
	if rate := float64(done-since.done) / now.Sub(since.at).Seconds(); rate > 0 {
		fmt.Fprintf(&b, " | %.1f/s", rate)
		if left := p.total - done; left > 0 && p.said == stallNone {
			fmt.Fprintf(&b, " | ETA %s", time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second))
		}
	}
	if p.said != stallNone { // an ETA would be a guess while nothing comes
		fmt.Fprintf(&b, " | no result for %s", now.Sub(p.lastResult).Round(time.Second))
	}
	return b.String()
}

// clearLine writes each write (a log line) at the start of a cleared terminal line, so that a
// line logged while the progress bar is shown does not run on from the bar; the bar is drawn
// again below it at its next update.
type clearLine struct{ w io.Writer }

func (c clearLine) Write(p []byte) (int, error) {
	if _, err := c.w.Write(append([]byte("\r\033[K"), p...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

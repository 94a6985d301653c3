package main

import (
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"
)

// passProgress shows how far a pass over the input has gone: the validation pass, or the
// publishing. Both take seconds for a file of a million lines, and minutes against a distant
// NATS cluster, before the first result comes for progress to show; a run said nothing
// meanwhile. A pass shorter than a second shows nothing, nor does one shorter than the
// interval in lines mode, so a small batch's output is what it was.
//
// On a terminal the line is redrawn in place, at most every passRedraw, and cleared when the
// pass ends; otherwise a line is printed every interval, and one more at the end if any was.
type passProgress struct {
	w        io.Writer
	redraw   bool
	none     bool
	interval time.Duration
	now      func() time.Time
	width    func() int // of the terminal drawn on (terminalWidth; 0: not known)
	what     string     // the pass: "validating", "publishing"
	counted  string     // what it counts: "lines", "jobs stored"
	total    int        // what the count comes to; 0: not known
	// read and size, when size is not 0, tell how far the pass has read its input, where
	// the count has no total (setRead): the bytes read so far, and those it comes to.
	read *atomic.Int64
	size int64

	start time.Time
	last  time.Time // when a line was last shown; zero: none was
	done  int       // as of the last line shown
}

// passState is where a pass is, for its progress line.
type passState int

const (
	passRunning  passState = iota
	passFinished           // through all of its input
	passStopped            // by an error or an interrupt
)

const (
	passQuiet  = time.Second            // on a terminal, a pass shows nothing before this
	passRedraw = 100 * time.Millisecond // and is redrawn at most this often
)

// newPassProgress starts the progress of the pass what, which counts what counted says up
// to total (0 if that is not known), in the mode of o.
func newPassProgress(o progressOptions, env *environment, what, counted string, total int) *passProgress {
	p := &passProgress{w: env.stderr, interval: o.interval, now: time.Now, what: what, counted: counted, total: total}
	p.width = func() int { return terminalWidth(p.w) }
	p.none, p.redraw = o.style(env)
	p.start = p.now()
	return p
}

// setRead has the pass show how far it has read its input: read counts the bytes read,
// against size (0: not known, when one input is a pipe; then nothing is shown).
func (p *passProgress) setRead(read *atomic.Int64, size int64) {
	p.read, p.size = read, size
}

// update shows done, if it is time to. It may be called often: it reads the clock only.
func (p *passProgress) update(done int) {
	if p.none {
		return
	}
	now := p.now()
	if p.redraw {
		if now.Sub(p.start) < passQuiet || now.Sub(p.last) < passRedraw {
			return
		}
		fmt.Fprintf(p.w, "\r\033[K%s", drawn(p.line(done, now, passRunning), p.width()))
	} else {
		since := p.last
		if since.IsZero() {
			since = p.start
		}
		if now.Sub(since) < p.interval {
			return
		}
		fmt.Fprintln(p.w, p.line(done, now, passRunning))
	}
	p.last, p.done = now, done
}

// lines returns where to print other lines during the pass: on a terminal, each begins on
// a cleared line, so that it does not run on from the line drawn there (drawn again below it
// at the next update).
func (p *passProgress) lines() io.Writer {
	if p.none || !p.redraw {
		return p.w
	}
	return clearLine{p.w}
}

// end ends the pass at done: it clears the line drawn on a terminal, or prints the last state
// if a line was printed and did not say it. finished says that the pass went through all of
// its input, rather than stopping on an error or an interrupt: only then is all of it read.
func (p *passProgress) end(done int, finished bool) {
	if p.none || p.last.IsZero() {
		return
	}
	switch {
	case p.redraw:
		fmt.Fprint(p.w, "\r\033[K")
	case done != p.done || finished && p.size > 0: // the last line said 99 % at most
		state := passStopped
		if finished {
			state = passFinished
		}
		fmt.Fprintln(p.w, p.line(done, p.now(), state))
	}
	p.last = time.Time{}
}

// line renders e.g. "publishing: 430000/1000000 jobs stored 43% | 85000.0/s | ETA 7s", or
// "validating: 2310000 lines 43% | 812000.0/s | ETA 9s", the share of the input's bytes read,
// or "validating: 2310000 lines | 812000.0/s" where the input's size is not known either.
// state says whether the pass still runs: an ended one shows no time left, and one that
// finished has read all of its input.
func (p *passProgress) line(done int, now time.Time, state passState) string {
	var b strings.Builder
	left := 0.0 // what is left of the pass, in proportion to what is done
	switch {
	case p.total > 0:
		fmt.Fprintf(&b, "%s: %d/%d %s %d%%", p.what, done, p.total, p.counted, done*100/p.total)
		left = float64(p.total-done) / float64(max(done, 1))
	case p.size > 0 && p.read != nil:
		// Of the input's bytes, 99 % at most until the pass ends: they are read ahead of the
		// lines (and a file may have grown since it was measured).
		percent := int64(100)
		if state != passFinished {
			read := p.read.Load()
			percent = min(read*100/p.size, 99)
			left = float64(p.size-read) / float64(max(read, 1))
		}
		fmt.Fprintf(&b, "%s: %d %s %d%%", p.what, done, p.counted, percent)
	default:
		fmt.Fprintf(&b, "%s: %d %s", p.what, done, p.counted)
	}
	elapsed := now.Sub(p.start)
	if elapsed < time.Second || done == 0 {
		return b.String()
	}
	fmt.Fprintf(&b, " | %.1f/s", float64(done)/elapsed.Seconds())
	if left > 0 && state == passRunning {
		// What is left takes as long as what is done took, in proportion.
		fmt.Fprintf(&b, " | ETA %s", time.Duration(left*float64(elapsed)).Round(time.Second))
	}
	return b.String()
}

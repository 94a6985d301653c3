package jobs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
)

// Reader reads jobs from a JSONL input, one line at a time, through a buffer of readBuffer
// bytes; a longer line is gathered in a second buffer, which grows to the longest line read
// (at most Limits.MaxLineBytes). Memory does not grow with the file, except for the set of
// custom_ids seen (about 40 bytes plus the id's length per job, see idSet). With SetParallel
// it parses groups of lines on several goroutines, and reads ahead two groups of about a MiB.
//
// A line may be a native tinkerfleet job or an OpenAI Batch API request (detected per line by the
// presence of body, url or method). Blank lines are skipped, CRLF line ends and a UTF-8 byte order
// mark on the first line are accepted.
type Reader struct {
	br       *bufio.Reader
	err      error // sticky: io.EOF or a read error
	file     string
	files    []string // every input so far, for duplicates found across them
	ids      idSet
	limits   Limits
	line     int    // number of the last line read
	nonBlank int    // lines that were not blank
	raw      []byte // the last valid line, as read
	long     []byte // a line longer than br's buffer, gathered
	check    func(Job) *FieldError

	// With SetParallel, lines are read and parsed ahead, a group at a time (see readAhead).
	parallel  int
	group     lineGroup // the group being returned; pos is the first line not yet returned
	pos       int
	queued    lineGroup // the group after it, read but not parsed yet
	readLines int       // lines read so far from the current input (ahead of line with SetParallel)
}

// lineGroup is a group of lines read ahead (Reader.SetParallel): the lines as read, in one
// arena, and what ended the reading after them, if anything did.
type lineGroup struct {
	lines []parsedLine
	arena []byte
	end   error // io.EOF or a read error, once the group's lines are returned
}

// read reports whether the group has been read: a group read holds a line or an end.
func (g *lineGroup) read() bool { return len(g.lines) > 0 || g.end != nil }

// reset empties the group, keeping its memory.
func (g *lineGroup) reset() { g.lines, g.arena, g.end = g.lines[:0], g.arena[:0], nil }

// parsedLine is a line read ahead: its number, where it is in its group's arena, and its job
// or what is wrong with it; for a valid job, its custom_id's hash and, once added to the set
// of ids, the line of that id's first use if it was used before.
type parsedLine struct {
	line       int
	start, end int
	tooLong    bool
	job        Job
	fe         *FieldError
	idHash     uint64
	dup        bool
	first      int
}

// A group read ahead ends after aheadLines non-blank lines, or once it holds aheadBytes (and
// one line more, up to MaxLineBytes). While one group is parsed on up to SetParallel
// goroutines, the Next call reads the following one, then the parsed group's custom_ids are
// added to the set on up to as many goroutines (idSet's shards). Of submit's validation pass
// over 1M lines of about 240 bytes, parsing is 1.13 s of CPU, the set 0.30 s and reading (with
// the digest) 0.22 s; on 2 cores the pass took 1.20-1.24 s, against 1.53-1.60 s when the
// reading and the set waited for the parsing.
const (
	aheadLines = 512
	aheadBytes = 1 << 20
)

// readBuffer is the size of a Reader's buffer: lines up to it are parsed where they were
// read.
const readBuffer = 256 << 10

// NewReader returns a Reader of r. file names the input in errors (it may be empty); zero fields
// of l take their defaults.
func NewReader(r io.Reader, file string, l Limits) *Reader {
	l = l.withDefaults()
	return &Reader{
		br:     bufio.NewReaderSize(r, min(l.MaxLineBytes+2, readBuffer)),
		file:   file,
		files:  []string{file},
		ids:    newIDSet(),
		limits: l,
	}
}

// SetCheck makes check a part of every line's validation: a job that it refuses is a bad line,
// with its field error, and like any bad line it does not take its custom_id (a later line
// with that id is no duplicate of it).
func (r *Reader) SetCheck(check func(Job) *FieldError) { r.check = check }

// SetParallel makes the Reader parse its lines on up to n goroutines at once (n <= 1: one at
// a time, the default): it reads a group of lines ahead, parses them all while it reads the
// next group, then returns them one by one. What Next, Line and Raw return is the same either
// way, custom_id duplicates included; the two groups read ahead take up to about aheadBytes
// each, plus one line. A check given to SetCheck is then called from several goroutines at
// once. The goroutines are started by Next calls, which wait for them: none outlives a call.
func (r *Reader) SetParallel(n int) { r.parallel = n }

// fileShift splits the first-use position kept per custom_id into an input index and a line.
const fileShift = 40

// NextFile goes on reading from in, named file, as part of the same batch: line numbers start
// again at 1, and a custom_id already used in an earlier input is a duplicate (the error names
// that input and line). The limits stay those of NewReader. The lines of the current input
// that Next has not returned are left, as if it ended there.
func (r *Reader) NextFile(in io.Reader, file string) {
	r.br.Reset(in)
	r.err = nil
	r.file = file
	r.files = append(r.files, file)
	r.line = 0
	r.nonBlank = 0
	for i := r.pos; i < len(r.group.lines); i++ { // added to the set ahead of their return: forget them
		if p := &r.group.lines[i]; !p.tooLong && p.fe == nil && !p.dup {
			r.ids.shards[shardOf(p.idHash)].remove(p.idHash, p.job.CustomID, r.ids.hash)
		}
	}
	r.group.reset()
	r.queued.reset()
	r.pos, r.readLines = 0, 0
}

// Line returns the 1-based number of the line the last Next call returned a job or a *LineError
// for (0 before the first line).
func (r *Reader) Line() int { return r.line }

// Next returns the next valid job. For a bad line it returns a *LineError naming the file, line and
// field; the next call goes on with the following line. At the end it returns io.EOF, except for
// an input without a single non-blank line, where it first returns an error wrapping ErrEmptyFile.
// A failure of the underlying reader is returned wrapped, and again on every later call.
//
// Bad lines include: oversize lines (skipped up to the next newline, kept no further than the limit),
// invalid UTF-8, malformed JSON, a line that is not an object, unknown, repeated or mistyped
// fields, values out of range, both or neither of model and model_path, zero or several prompt
// kinds, and a custom_id already used by an earlier valid line of this Reader (the error names the
// line of its first use).
func (r *Reader) Next() (Job, error) {
	if r.parallel > 1 {
		return r.nextAhead()
	}
	if r.err != nil {
		return Job{}, r.err
	}
	b, tooLong, err := r.nextText()
	r.line = r.readLines
	switch {
	case err != nil:
		return Job{}, r.end(err)
	case tooLong:
		return Job{}, r.tooLong()
	}
	j, fe := r.parse(b)
	return r.admit(b, j, fe)
}

// nextText reads up to the next line that is not blank and returns its text (lineText), or
// tooLong for a line over MaxLineBytes; err ends the input (readLine). It counts every line
// read, and those not blank.
func (r *Reader) nextText() (b []byte, tooLong bool, err error) {
	for {
		raw, tooLong, err := r.readLine()
		if err != nil {
			return nil, false, err
		}
		r.readLines++
		if tooLong {
			r.nonBlank++
			return nil, true, nil
		}
		if b := lineText(raw); len(b) > 0 {
			r.nonBlank++
			return b, false, nil
		}
	}
}

// nextAhead is Next with SetParallel: the next line of the group read ahead, or of a new one.
func (r *Reader) nextAhead() (Job, error) {
	for r.pos == len(r.group.lines) {
		switch {
		case r.err != nil:
			return Job{}, r.err
		case r.group.end != nil:
			r.line = r.readLines // the blank lines after the last one count, as in Next
			return Job{}, r.end(r.group.end)
		}
		r.readAhead()
	}
	p := &r.group.lines[r.pos]
	r.pos++
	r.line = p.line
	switch {
	case p.tooLong:
		return Job{}, r.tooLong()
	case p.fe != nil:
		return Job{}, r.lineErr(p.fe)
	case p.dup:
		return Job{}, r.duplicate(p.job.CustomID, p.first)
	}
	r.raw = r.group.arena[p.start:p.end]
	return p.job, nil
}

// readAhead makes the group queued (read at once if it was not) the group returned, and
// parses its lines on up to r.parallel goroutines while it reads the next group into queued
// (unless the input ended). Then it adds the group's custom_ids to the set, as many shards at
// once.
func (r *Reader) readAhead() {
	if !r.queued.read() {
		r.readGroup(&r.queued)
	}
	r.group, r.queued = r.queued, r.group
	r.queued.reset()
	r.pos = 0
	g := &r.group
	parts := min(r.parallel, (len(g.lines)+63)/64) // a goroutine for fewer lines costs more than it saves
	var wg sync.WaitGroup
	for k := range parts {
		lo, hi := k*len(g.lines)/parts, (k+1)*len(g.lines)/parts
		wg.Go(func() {
			for i := lo; i < hi; i++ {
				if p := &g.lines[i]; !p.tooLong {
					p.job, p.fe = r.parse(g.arena[p.start:p.end])
					if p.fe == nil {
						p.idHash = r.ids.hash(p.job.CustomID)
					}
				}
			}
		})
	}
	if g.end == nil {
		r.readGroup(&r.queued)
	}
	wg.Wait()

	parts = min(parts, idShards)
	at := (len(r.files) - 1) << fileShift
	for k := range parts {
		wg.Go(func() {
			for i := range g.lines {
				p := &g.lines[i]
				if s := shardOf(p.idHash); !p.tooLong && p.fe == nil && s%parts == k {
					p.first, p.dup = r.ids.shards[s].add(p.idHash, p.job.CustomID, at|p.line)
				}
			}
		})
	}
	wg.Wait()
}

// readGroup reads the next group of lines (see aheadLines) into g, with g.end set if the
// input ends or fails after them.
func (r *Reader) readGroup(g *lineGroup) {
	for len(g.lines) < aheadLines && len(g.arena) < aheadBytes {
		b, tooLong, err := r.nextText()
		if err != nil {
			g.end = err
			return
		}
		p := parsedLine{line: r.readLines, tooLong: tooLong, start: len(g.arena)}
		g.arena = append(g.arena, b...)
		p.end = len(g.arena)
		g.lines = append(g.lines, p)
	}
}

// lineText is a line as read without a byte order mark, which begins a file written on
// Windows (and a line of files joined with cat: nothing JSON-wise, it is no part of the
// line), and the spaces around it.
func lineText(raw []byte) []byte {
	return trimASCIISpace(bytes.TrimPrefix(raw, []byte("\xef\xbb\xbf")))
}

// parse parses and validates one non-blank line: its job, or what is wrong with it. It uses
// nothing of the Reader's state but its limits and check, so lines read ahead are parsed at
// once.
func (r *Reader) parse(b []byte) (Job, *FieldError) {
	j, names, fe := parseLine(b)
	if fe == nil {
		fe = j.validate(r.limits, &names)
	}
	if fe == nil && r.check != nil {
		fe = r.check(j)
	}
	return j, fe
}

// admit returns the job of line b, parsed with fe nil, unless fe says what is wrong with it or
// its custom_id was used before.
func (r *Reader) admit(b []byte, j Job, fe *FieldError) (Job, error) {
	if fe != nil {
		return Job{}, r.lineErr(fe)
	}
	if first, dup := r.ids.add(j.CustomID, (len(r.files)-1)<<fileShift|r.line); dup {
		return Job{}, r.duplicate(j.CustomID, first)
	}
	r.raw = b
	return j, nil
}

// duplicate is the error of a custom_id used before, at first (an input's index and a line:
// see fileShift).
func (r *Reader) duplicate(id string, first int) error {
	where := fmt.Sprintf("line %d", first&(1<<fileShift-1))
	if f := first >> fileShift; f != len(r.files)-1 {
		where = fmt.Sprintf("%s line %d", r.files[f], first&(1<<fileShift-1))
	}
	return r.lineErr(fieldErr("custom_id", fmt.Sprintf("duplicate %s (first used on %s)", strconv.Quote(id), where)))
}

// tooLong is the error of a line over MaxLineBytes, at the current line.
func (r *Reader) tooLong() error {
	return r.lineErr(fieldErr("", fmt.Sprintf("line is longer than the limit of %d bytes", r.limits.MaxLineBytes)))
}

// end ends the input with err, the reading's error: io.EOF (or ErrEmptyFile, the first time,
// for an input without a single non-blank line), or a failure of the underlying reader,
// returned again on every later call.
func (r *Reader) end(err error) error {
	if errors.Is(err, io.EOF) {
		r.err = io.EOF
		if r.nonBlank == 0 {
			return fmt.Errorf("%s: %w", r.name(), ErrEmptyFile)
		}
		return io.EOF
	}
	r.err = fmt.Errorf("read %s after line %d: %w", r.name(), r.line, err)
	return r.err
}

// Raw returns the line the last Next call returned a job for, as it was read (without its
// line end and the spaces around it), to write it out again unchanged. It is valid until the
// next call.
func (r *Reader) Raw() []byte { return r.raw }

// name is the file name for error messages.
func (r *Reader) name() string {
	if r.file == "" {
		return "input"
	}
	return r.file
}

// lineErr places a field error at the current line.
func (r *Reader) lineErr(fe *FieldError) *LineError {
	return &LineError{File: r.file, Line: r.line, Field: fe.Field, Msg: fe.Msg}
}

// readLine returns the next line without its line end. tooLong reports a line over
// MaxLineBytes, which has been skipped. err is io.EOF only when no line is left.
func (r *Reader) readLine() (line []byte, tooLong bool, err error) {
	line, err = r.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		line, err = r.readLong(line)
	}
	if err != nil {
		if !errors.Is(err, io.EOF) || len(line) == 0 {
			return nil, false, err
		}
		err = nil // a last line without a line end; the next call sees EOF
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) > r.limits.MaxLineBytes {
		return nil, true, nil
	}
	return line, false, nil
}

// readLong reads the rest of a line longer than the buffer, which began with head, into
// r.long. Of a line over MaxLineBytes it keeps only enough to tell that it is: MaxLineBytes
// plus a line end (2) plus one byte.
func (r *Reader) readLong(head []byte) ([]byte, error) {
	r.long = append(r.long[:0], head...)
	for {
		part, err := r.br.ReadSlice('\n')
		if room := r.limits.MaxLineBytes + 3 - len(r.long); room > 0 {
			r.long = append(r.long, part[:min(len(part), room)]...)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return r.long, err
		}
	}
}

// trimASCIISpace trims JSON whitespace from both ends.
func trimASCIISpace(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && isSpace(b[i]) {
		i++
	}
	for j > i && isSpace(b[j-1]) {
		j--
	}
	return b[i:j]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

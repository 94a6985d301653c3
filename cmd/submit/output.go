package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// outputFile is the results file of -o: JSONL, compressed with zstd or gzip when its name ends
// in .zst or .gz.
type outputFile struct {
	file    *os.File
	held    *os.File     // the descriptor that holds the file's lock, when not file (nil: file)
	w       io.Writer    // file, or the compressor writing to it
	flush   func() error // makes what the compressor holds readable in the file
	end     func() error // ends the compressed stream
	discard func() error // lets the compressor go without writing to the file
	written bool         // something was written
}

func (o *outputFile) Write(p []byte) (int, error) {
	o.written = o.written || len(p) > 0
	return o.w.Write(p)
}

// Flush makes what was written readable in the file: a compressor ends its block.
func (o *outputFile) Flush() error {
	if !o.written {
		return nil
	}
	return o.flush()
}

// Close ends the compressed stream, then syncs and closes the file. A stream nothing was
// written to is not ended either, so that it adds nothing to the file: a file the run created
// stays empty, for the caller to remove (removeIfEmpty). Only a regular file is synced: a pipe
// or a device (failed -o /dev/stdout) refuses fsync, and holds nothing to keep.
func (o *outputFile) Close() error {
	end := o.end
	if !o.written {
		end = o.discard
	}
	err := end()
	if fi, serr := o.file.Stat(); serr == nil && fi.Mode().IsRegular() {
		if serr := o.file.Sync(); err == nil {
			err = serr
		}
	}
	if cerr := o.file.Close(); err == nil {
		err = cerr
	}
	if o.held != nil {
		o.held.Close()
	}
	return err
}

// outputCompression is how an output file named path is compressed: "zstd", "gzip" or "".
func outputCompression(path string) string {
	switch {
	case strings.HasSuffix(path, ".zst"), strings.HasSuffix(path, ".zstd"):
		return "zstd"
	case strings.HasSuffix(path, ".gz"):
		return "gzip"
	}
	return ""
}

// decompressedAs is decompressed for an output file whose name says it is compressed as kind:
// one that is not (results appended compressed would follow other text) is an error.
func decompressedAs(path, kind string, br *bufio.Reader) (io.Reader, func(), error) {
	r, got, release, err := decompressed(path, br)
	if err == nil && got != kind {
		release()
		err = fmt.Errorf("%s is not compressed with %s, as its name says: give another -o file", path, kind)
	}
	return r, release, err
}

// newOutputFile writes to f through a compressor of kind ("" for none).
func newOutputFile(f *os.File, kind string) (*outputFile, error) {
	none := func() error { return nil }
	o := &outputFile{file: f, w: f, flush: none, end: none, discard: none}
	switch kind {
	case "zstd":
		zw, err := zstd.NewWriter(f)
		if err != nil {
			return nil, err
		}
		o.w, o.flush, o.end = zw, zw.Flush, zw.Close
		o.discard = func() error { zw.Reset(io.Discard); return zw.Close() }
	case "gzip":
		zw := gzip.NewWriter(f)
		o.w, o.flush, o.end = zw, zw.Flush, zw.Close
	}
	return o, nil
}

// openOutput opens the output file for appending, after reading the custom ids it already
// holds, so that an interrupted run resumes without writing any result twice. Lines may be
// tinkerfleet result lines or OpenAI Batch output lines (see outputLine.status), and must be
// results of batch: a file that holds another batch's results (the same prompts file once
// edited is another batch) is refused, or its stale lines would pass for this batch's. A last
// line cut short by the interruption is dropped.
//
// A compressed file resumes with a stream of its own appended (concatenated zstd frames and
// gzip members read as one). One that a crash cut short (its stream does not end, or ends in
// a line cut short) is written again with its whole lines first.
//
// The file must be a regular one (or a new one: created says the call made it): a pipe or a
// device cannot be read back, and reading a pipe this process holds open would never end.
//
// The file is locked until the output is closed: another process following it would take a
// compressed stream still being written for one a crash cut short, and write the file again
// without the lines to come, which the first process then wrote into a file no longer there.
func openOutput(path, batch string, seen map[queue.JobKey]bool, sum *summary) (out *outputFile, created bool, err error) {
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, false, fmt.Errorf("output %s is %s, not a regular file: results are appended to a file and read back to resume; name a file (-o), or print them with: submit results %s: %w",
			path, fileKind(fi.Mode()), batch, errUsage)
	}
	f, created, err := openLocked(path)
	if err != nil {
		return nil, false, err
	}
	out, err = readAndAppend(f, path, batch, seen, sum)
	return out, created, err
}

// openLocked opens (or creates: created) the output file at path and locks it.
func openLocked(path string) (f *os.File, created bool, err error) {
	if f, created, err = openPath(path); err != nil {
		return nil, false, err
	}
	return lockOpened(path, f, created)
}

// openPath opens the output file at path, creating it if there is none (created).
func openPath(path string) (f *os.File, created bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if created = err == nil; errors.Is(err, fs.ErrExist) {
		f, err = os.OpenFile(path, os.O_RDWR, 0)
	}
	if err != nil {
		return nil, false, fmt.Errorf("output: %w", err)
	}
	return f, created, nil
}

// lockOpened locks f, the output file opened at path. The lock must be on the file the path
// names: another process may have put a mended file in its place, or removed an empty one,
// between the open and the lock; then it opens the path again.
func lockOpened(path string, f *os.File, created bool) (*os.File, bool, error) {
	for try := 0; ; try++ {
		if !lockOutput(f) {
			f.Close()
			return nil, false, fmt.Errorf("output %s is being written by another submit: wait for it to end, or give another -o file: %w", path, errUsage)
		}
		if isPath(f, path) {
			return f, created, nil
		}
		f.Close()
		if try == 2 {
			return nil, false, fmt.Errorf("output %s keeps being replaced by another process: give another -o file: %w", path, errUsage)
		}
		var err error
		if f, created, err = openPath(path); err != nil {
			return nil, false, err
		}
	}
}

// isPath reports whether the open file f is the one path names now.
func isPath(f *os.File, path string) bool {
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	now, err := os.Stat(path)
	return err == nil && os.SameFile(fi, now)
}

// fileKind names the kind of file of a mode that is not a regular file's.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a pipe"
	case m&fs.ModeDevice != 0, m&fs.ModeCharDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return "not a file"
}

// readAndAppend is openOutput on the file f it opened.
func readAndAppend(f *os.File, path, batch string, seen map[queue.JobKey]bool, sum *summary) (*outputFile, error) {
	kind := outputCompression(path)
	var in io.Reader = f
	release := func() {}
	if kind != "" {
		if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
			in, release, err = decompressedAs(path, kind, bufio.NewReaderSize(f, 64<<10))
			if err != nil {
				f.Close()
				return nil, err
			}
		}
	}
	lines, keep, readErr := readOutput(in, path, batch, maxOutputLine, seen, sum)
	release()
	if readErr != nil && (kind == "" || errors.Is(readErr, errOtherBatch) || errors.Is(readErr, errNotResults)) {
		f.Close()
		return nil, readErr
	}
	if kind == "" {
		if err := f.Truncate(keep); err != nil {
			f.Close()
			return nil, fmt.Errorf("output: %w", err)
		}
		if _, err := f.Seek(keep, io.SeekStart); err != nil {
			f.Close()
			return nil, fmt.Errorf("output: %w", err)
		}
		return newOutputFile(f, "")
	}
	if readErr != nil && !errors.Is(readErr, io.ErrUnexpectedEOF) {
		f.Close()
		// Damage, not the unended tail a crash leaves: mending would drop whatever follows it,
		// results that may be gone from the server.
		return nil, fmt.Errorf("output %s cannot be read after its line %d (%v); move it aside and run again, and the results the server still keeps are written anew: %w",
			path, lines.whole, readErr, errUsage)
	}
	if readErr != nil || lines.cut {
		out, err := rewriteOutput(path, kind, lines.whole) // locks the file it puts in place
		f.Close()
		return out, err
	}
	a, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("output: %w", err)
	}
	out, err := newOutputFile(a, kind)
	if err != nil {
		a.Close()
		f.Close()
		return nil, err
	}
	out.held = f
	return out, nil
}

// resultStart reports whether b, the first bytes of a line, can begin a result line: every
// line tinkerfleet writes starts with one of these (jobs.Result.AppendJSON, the OpenAI form).
func resultStart(b []byte) bool {
	for _, p := range [...]string{`{"custom_id":`, `{"id":"batch_req_`} {
		if n := min(len(b), len(p)); string(b[:n]) == p[:n] { // either is the other's prefix
			return true
		}
	}
	return false
}

// outputRead is what readOutput found: how many whole lines, and whether a last line was
// cut short.
type outputRead struct {
	whole int
	cut   bool
}

// maxOutputLine bounds a line of an output file that is read again: 1 GiB, above any line
// submit writes (a result is at most 256 MiB as the worker stores it, queue.MaxResultBytes,
// before the OpenAI form's additions), so a file that only starts like results is refused,
// not read whole.
const maxOutputLine = 1 << 30

// readOutput reads the result lines of an output file (as text) from r, recording each custom
// id in seen and its status in sum; it returns the lines and the bytes of the whole lines. Its
// error is a line that is not a result, or longer than maxLine bytes (errNotResults), a
// result of another batch (errOtherBatch), or r's.
func readOutput(r io.Reader, path, batch string, maxLine int, seen map[queue.JobKey]bool, sum *summary) (outputRead, int64, error) {
	var lines outputRead
	var keep int64
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		if head, _ := br.Peek(len(`{"id":"batch_req_`)); len(head) > 0 && !resultStart(head) {
			// Not a result line, whole or cut: refused before it is read (it may be a large
			// file that is no results file at all, and has no line end to stop a read).
			return lines, keep, fmt.Errorf("%s holds a line that is not a result (line %d); give another -o file: %w", path, lines.whole+1, errNotResults)
		}
		line, err := readLine(br, maxLine)
		if errors.Is(err, errLineTooLong) {
			return lines, keep, fmt.Errorf("%s holds a line longer than %d bytes, which no result is (line %d); give another -o file: %w", path, maxLine, lines.whole+1, errNotResults)
		}
		if errors.Is(err, io.EOF) {
			// A result line cut short stops before its closing brace: a last line that is whole
			// JSON is another file's (a one-line file of prompts, or of another batch's result,
			// written without a final newline), which dropping it would empty.
			if len(line) > 0 && json.Valid(line) {
				if _, _, err := resultOf(line, path, batch, lines.whole+1); err != nil {
					return lines, keep, err
				}
			}
			lines.cut = len(line) > 0 // dropped by the caller
			return lines, keep, nil
		}
		if err != nil {
			return lines, keep, fmt.Errorf("read %s: %w", path, err)
		}
		r, status, err := resultOf(line, path, batch, lines.whole+1)
		if err != nil {
			return lines, keep, err
		}
		key := queue.JobKeyOf(r.CustomID)
		if !seen[key] {
			seen[key] = true
			sum.add(status, r.tokens(status))
		}
		keep += int64(len(line))
		lines.whole++
	}
}

// resultOf reads line n of the output file at path, which must be a result of batch: its error
// is errNotResults or errOtherBatch.
func resultOf(line []byte, path, batch string, n int) (outputLine, string, error) {
	r, status, ok := parseOutputLine(line)
	if !ok {
		return r, "", fmt.Errorf("%s holds a line that is not a result (line %d); give another -o file: %w", path, n, errNotResults)
	}
	if err := r.ofBatch(path, batch); err != nil {
		return r, "", err
	}
	return r, status, nil
}

// createTemp is os.CreateTemp for a file that is renamed into place as one the user named:
// it is made as os.Create makes files (0666 less the umask: 0644 as a rule), not 0600.
func createTemp(dir, pattern string) (*os.File, error) {
	for range 100 {
		name := filepath.Join(dir, strings.Replace(pattern, "*", randomHex(8), 1))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if !errors.Is(err, fs.ErrExist) {
			return f, err
		}
	}
	return nil, fmt.Errorf("create a file like %s in %s: every name tried exists", pattern, dir)
}

// errNotResults is the error of an output file that holds a line that is no result.
var errNotResults = errors.New("the output file holds other lines than results")

// rewriteOutput writes the first n lines of the compressed output file at path, which a crash
// cut short, into a new file compressed as kind, and puts it in its place: the returned output
// goes on after them.
func rewriteOutput(path, kind string, n int) (*outputFile, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("output: %w", err)
	}
	defer src.Close()
	in, release, err := decompressedAs(path, kind, bufio.NewReaderSize(src, 64<<10))
	if err != nil {
		return nil, err
	}
	defer release()
	// The new file takes the place of the file itself, not of a link to it: renamed over the
	// link, it left the linked file cut short, and the results to come went beside the link.
	target := throughLinks(path)
	tmp, err := createTemp(filepath.Dir(target), "."+filepath.Base(target)+"-*")
	if err == nil {
		if fi, serr := src.Stat(); serr == nil {
			err = tmp.Chmod(fi.Mode().Perm()) // it takes the place of the user's file
		}
	}
	if err != nil {
		if tmp != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
		return nil, fmt.Errorf("output: %w", err)
	}
	lockOutput(tmp) // before it takes the file's place: a new file, no one else holds it
	out, err := newOutputFile(tmp, kind)
	if err == nil {
		br := bufio.NewReaderSize(in, 1<<20)
		for i := 0; i < n && err == nil; i++ {
			var line []byte
			if line, err = readLine(br, maxOutputLine); err == nil {
				_, err = out.Write(line)
			}
		}
	}
	// The lines are in the file, and on disk, before it takes the old one's place: a crash
	// after the rename must find them there, not in a compressor's buffer.
	if err == nil {
		err = out.Flush()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if err == nil {
		err = os.Rename(tmp.Name(), target)
	}
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("output: write again the whole lines of %s, cut short: %w", path, err)
	}
	return out, nil
}

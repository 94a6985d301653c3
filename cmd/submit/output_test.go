package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// compressor writes a zstd or gzip stream to w.
type compressor interface {
	io.WriteCloser
	Flush() error
}

func newCompressor(t *testing.T, kind string, w io.Writer) compressor {
	t.Helper()
	if kind == "gzip" {
		return gzip.NewWriter(w)
	}
	zw, err := zstd.NewWriter(w)
	if err != nil {
		t.Fatal(err)
	}
	return zw
}

// decompress reads the whole compressed file at path, failing on a stream that does not end.
func decompress(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	} else {
		zr, err := zstd.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		defer zr.Close()
		r = zr
	}
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s does not decompress whole: %v", path, err)
	}
	return data
}

// TestCompressedOutputIsWrittenAndResumed: -o FILE.zst and FILE.gz write the results
// compressed; a file interrupted cleanly resumes with a stream appended, and one a crash cut
// short (its stream never ended, its last line half written) is written again with its whole
// lines first, keeping its mode. Either way the file ends with exactly one line per job, and
// decompresses whole.
// TestAMendedOutputHoldsItsLinesBeforeItTakesThePlace: the whole lines of a compressed -o a
// crash cut short are written again into a new file, which then takes its place; they must be
// readable there at once, not left in the compressor's buffer, or a crash right after the
// rename leaves a file without them.
func TestAMendedOutputHoldsItsLinesBeforeItTakesThePlace(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"zstd", "gzip"} {
		path := filepath.Join(t.TempDir(), "results.jsonl"+map[string]string{"zstd": ".zst", "gzip": ".gz"}[kind])
		var buf bytes.Buffer
		zw := newCompressor(t, kind, &buf)
		for i := range 20 {
			fmt.Fprintf(zw, "{\"custom_id\":\"c-%d\"}\n", i)
		}
		zw.Write([]byte(`{"custom_id":"c-2`)) // cut short
		zw.Flush()
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := rewriteOutput(path, kind, 20)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		r, _, release, err := decompressed(path, bufio.NewReader(f))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(r) // the stream is not ended yet: an unexpected EOF ends the read
		release()
		f.Close()
		if n := bytes.Count(data, []byte("\n")); n != 20 {
			t.Errorf("%s: the mended file holds %d whole lines before it is closed, want 20", kind, n)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAMendedOutputStaysWhereALinkPoints: -o naming a symbolic link to a compressed file
// that a crash cut short mends the file the link points to. The mended file took the link's
// place instead: the file the link pointed to stayed cut short, without the results written
// since, which went to a new file beside the link.
func TestAMendedOutputStaysWhereALinkPoints(t *testing.T) {
	t.Parallel()
	real := filepath.Join(t.TempDir(), "results.jsonl.zst")
	link := filepath.Join(t.TempDir(), "link.jsonl.zst")
	if err := os.Symlink(real, link); err != nil {
		t.Skipf("no symbolic links here: %v", err)
	}
	var buf bytes.Buffer
	zw := newCompressor(t, "zstd", &buf)
	for i := range 5 {
		fmt.Fprintf(zw, "{\"custom_id\":\"c-%d\",\"batch_id\":\"b-1\",\"status\":\"ok\"}\n", i)
	}
	zw.Write([]byte(`{"custom_id":"c-5`)) // cut short
	zw.Flush()
	if err := os.WriteFile(real, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	seen := map[queue.JobKey]bool{}
	out, _, err := openOutput(link, "b-1", seen, &summary{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := out.Write([]byte(`{"custom_id":"c-5","batch_id":"b-1","status":"ok"}` + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link is no longer a link (%v, %v)", fi.Mode(), err)
	}
	if got := outputLines(t, decompress(t, real)); len(got) != 6 {
		t.Errorf("the file the link points to holds %d results, want 6", len(got))
	}
}

func TestCompressedOutputIsWrittenAndResumed(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	f.startWorker(16)
	ctx := context.Background()
	lines := jobLines(60)
	in, dir := writeLines(t, lines), t.TempDir()
	plain := filepath.Join(dir, "results.jsonl")
	batch, stderr, err := f.submit(ctx, in, "-o", plain)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	batch = strings.TrimSpace(batch)
	data, err := os.ReadFile(plain)
	if err != nil {
		t.Fatal(err)
	}
	results := bytes.SplitAfter(data, []byte("\n"))[:60]

	for _, kind := range []string{"zstd", "gzip"} {
		ext := map[string]string{"zstd": ".zst", "gzip": ".gz"}[kind]
		// Written whole.
		whole := filepath.Join(dir, "whole.jsonl"+ext)
		if _, stderr, err := f.submit(ctx, "results", batch, "-o", whole); err != nil {
			t.Fatalf("%s: %v: %s", kind, err, stderr)
		}
		if got := outputLines(t, decompress(t, whole)); len(got) != 60 {
			t.Errorf("%s: %d results, want 60", kind, len(got))
		}

		// Interrupted cleanly after 20 results; then cut short by a crash after 20 more and
		// half a line.
		clean, crashed := filepath.Join(dir, "clean.jsonl"+ext), filepath.Join(dir, "crashed.jsonl"+ext)
		var buf bytes.Buffer
		zw := newCompressor(t, kind, &buf)
		zw.Write(bytes.Join(results[:20], nil))
		zw.Close()
		if err := os.WriteFile(clean, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		zw = newCompressor(t, kind, &buf) // a second stream, never ended
		zw.Write(bytes.Join(results[20:40], nil))
		zw.Write(results[40][:len(results[40])/2])
		zw.Flush()
		if err := os.WriteFile(crashed, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{clean, crashed} {
			if err := os.Chmod(path, 0o640); err != nil { // the user's choice, which stays
				t.Fatal(err)
			}
			if _, stderr, err := f.submit(ctx, "results", batch, "-o", path); err != nil {
				t.Fatalf("%s: resume %s: %v: %s", kind, filepath.Base(path), err, stderr)
			}
			if got := outputLines(t, decompress(t, path)); len(got) != 60 {
				t.Errorf("%s: resumed %s: %d results, want 60", kind, filepath.Base(path), len(got))
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
				t.Errorf("%s: resumed %s: mode %v, %v; want it left 0640", kind, filepath.Base(path), fi.Mode().Perm(), err)
			}
		}

		// Damaged in the middle, whole streams after the damage: mending would keep only the
		// lines before it, and drop results the server may no longer keep. It is refused, and
		// left as it is.
		var streams [3][]byte
		for i := range streams {
			var b bytes.Buffer
			zw := newCompressor(t, kind, &b)
			zw.Write(bytes.Join(results[20*i:20*(i+1)], nil))
			zw.Close()
			streams[i] = b.Bytes()
		}
		middle := streams[1]
		for i := len(middle) / 3; i < len(middle)/2; i++ {
			middle[i] ^= 0x5a
		}
		damaged := filepath.Join(dir, "damaged.jsonl"+ext)
		before := bytes.Join(streams[:], nil)
		if err := os.WriteFile(damaged, before, 0o644); err != nil {
			t.Fatal(err)
		}
		// The damage is found as bytes that do not decompress, or (gzip checks its sum only at
		// a member's end) as decompressed bytes that are no result line.
		_, _, err := f.submit(ctx, "results", batch, "-o", damaged)
		if !(errors.Is(err, errUsage) && strings.Contains(err.Error(), "cannot be read after its line ")) && !errors.Is(err, errNotResults) {
			t.Errorf("%s: a file damaged in the middle: %v, want it refused", kind, err)
		}
		if after, _ := os.ReadFile(damaged); !bytes.Equal(after, before) {
			t.Errorf("%s: the damaged file was changed", kind)
		}
	}

	// A file whose name says it is compressed, but is not, is refused: results appended
	// compressed would follow its text.
	notGzip := filepath.Join(dir, "plain.jsonl.gz")
	if err := os.WriteFile(notGzip, bytes.Join(results[:5], nil), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.submit(ctx, "results", batch, "-o", notGzip); err == nil || !strings.Contains(err.Error(), "is not compressed with gzip, as its name says") {
		t.Errorf("a plain file named .gz: %v", err)
	}
}

// TestAnOutputFileWithoutALineEndIsLeftAlone: -o naming an existing file that is no results
// file is refused, also when it has no line end: its whole content was taken for a result
// line a crash cut short, and the file was truncated to nothing (a 1 GiB one read whole
// first). A line that cannot begin a result is refused before it is read.
func TestAnOutputFileWithoutALineEndIsLeftAlone(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	const content = `{"important": "config written without a final newline"}`
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := openOutput(path, "b-1", map[queue.JobKey]bool{}, &summary{})
	if out != nil {
		out.Close()
	}
	got, _ := os.ReadFile(path)
	if string(got) != content {
		t.Fatalf("the file was changed to %q (err %v)", got, err)
	}
	if !errors.Is(err, errNotResults) {
		t.Fatalf("want errNotResults, got %v", err)
	}
}

// TestAWholeLastLineWithoutALineEndIsRead: a last line without its line end that is whole
// JSON is no result cut short by a crash (that one stops before its closing brace), and is
// read as a line: a one-line file of compact prompts, or of another batch's result, written
// without a final newline (Python's "\n".join), is refused and left as it is, not truncated
// to nothing as a cut line, plain or compressed.
func TestAWholeLastLineWithoutALineEndIsRead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, line string
		want       error
	}{
		{"a prompt", `{"custom_id":"q-1","model":"m","prompt":"p"}`, errNotResults},
		{"another batch's result", `{"custom_id":"q-1","batch_id":"b-other","status":"ok"}`, errOtherBatch},
	} {
		for _, ext := range []string{"", ".zst", ".gz"} {
			content := []byte(c.line)
			if ext != "" {
				var buf bytes.Buffer
				zw := newCompressor(t, map[string]string{".zst": "zstd", ".gz": "gzip"}[ext], &buf)
				zw.Write(content)
				zw.Close()
				content = buf.Bytes()
			}
			path := filepath.Join(t.TempDir(), "file.jsonl"+ext)
			if err := os.WriteFile(path, content, 0o644); err != nil {
				t.Fatal(err)
			}
			out, _, err := openOutput(path, "b-1", map[queue.JobKey]bool{}, &summary{})
			if out != nil {
				out.Close()
			}
			if !errors.Is(err, c.want) {
				t.Errorf("%s%s: err = %v, want %v", c.name, ext, err, c.want)
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, content) {
				t.Errorf("%s%s: the file was changed to %q", c.name, ext, got)
			}
		}
	}
}

// TestAnOutputLineIsReadNoFurtherThanItsBound: a line that starts like a result but goes on
// past the bound of a result line (a large file that only begins so, with no line end) is
// refused once the bound is passed, naming the line, rather than read whole into memory; a
// line of the bound exactly is read.
func TestAnOutputLineIsReadNoFurtherThanItsBound(t *testing.T) {
	t.Parallel()
	const bound = 1 << 20
	first := `{"custom_id":"q-1","batch_id":"b-1","status":"ok"}` + "\n"
	endless := &endlessLine{head: first + `{"custom_id":"q-2","batch_id":"b-1","status":"ok","x":"`}
	lines, _, err := readOutput(endless, "out.jsonl", "b-1", bound, map[queue.JobKey]bool{}, &summary{})
	if !errors.Is(err, errNotResults) || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "longer than 1048576 bytes") {
		t.Fatalf("err = %v, want the second line refused as longer than the bound", err)
	}
	if lines.whole != 1 {
		t.Errorf("%d whole lines read before it, want 1", lines.whole)
	}
	if endless.read > 2*bound {
		t.Errorf("%d bytes read of the endless line, want no more than the bound and a buffer", endless.read)
	}

	// A line of the bound exactly, its line end aside, is read.
	head := `{"custom_id":"q-2","batch_id":"b-1","status":"ok","x":"`
	line := head + strings.Repeat("a", bound-len(head)-2) + `"}`
	lines, _, err = readOutput(strings.NewReader(first+line+"\n"), "out.jsonl", "b-1", bound, map[queue.JobKey]bool{}, &summary{})
	if err != nil || lines.whole != 2 {
		t.Fatalf("a line of %d bytes: %d whole lines, %v", len(line), lines.whole, err)
	}
}

// TestResultStartTakesEveryBeginningOfAResultLine: a line is refused on its first bytes only
// when no result line begins so; a result line cut short after a few bytes is one.
func TestResultStartTakesEveryBeginningOfAResultLine(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		head string
		want bool
	}{
		{`{"custom_id":"a","batch_id"`, true}, {`{"id":"batch_req_0123456789`, true},
		{`{`, true}, {`{"cus`, true}, {`{"id":"ba`, true},
		{`{"important":`, false}, {`[`, false}, {"\n", false}, {`{"id":"x"`, false}, {`{"custom_id" :`, false},
	} {
		if got := resultStart([]byte(c.head)); got != c.want {
			t.Errorf("resultStart(%q) = %v, want %v", c.head, got, c.want)
		}
	}
}

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// compressed writes text to a file in a temporary directory, compressed as kind ("gzip" or
// "zstd"), under a name that does not say so.
func compressed(t *testing.T, kind, text string) string {
	t.Helper()
	var buf bytes.Buffer
	w := newCompressor(t, kind, &buf)
	w.Write([]byte(text))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "prompts.jsonl")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCompressedInputIsTheSameBatch: a gzip or zstd file is read as the JSONL it holds: its
// jobs run, its bad lines are named by their line, and it is the same batch as the plain file
// (the digest is the text's), so compressing a file does not sample it again.
func TestCompressedInputIsTheSameBatch(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{Capacity: 32})
	lines := jobLines(40)
	text := strings.Join(lines, "\n") + "\n"
	plain := writeLines(t, lines)
	ctx := context.Background()
	batch, _, err := f.submit(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}

	f.startWorker(16)
	for _, kind := range []string{"gzip", "zstd"} {
		out := filepath.Join(t.TempDir(), "results.jsonl")
		got, stderr, err := f.submit(ctx, compressed(t, kind, text), "-o", out)
		if err != nil {
			t.Fatalf("%s: %v\n%s", kind, err, stderr)
		}
		if got != batch || !strings.Contains(stderr, "already submitted") {
			t.Errorf("%s: batch %q (%s), want the plain file's %q, already submitted", kind, got, stderr, batch)
		}
		if res := readResults(t, out); len(res) != len(lines) {
			t.Errorf("%s: %d results, want %d", kind, len(res), len(lines))
		}
	}
	if got := f.sim.Stats().SamplesAccepted; got != int64(len(lines)) {
		t.Errorf("the simulator sampled %d times for %d jobs", got, len(lines))
	}

	// pzstd and seekable zstd files begin with a skippable frame.
	zst, err := os.ReadFile(compressed(t, "zstd", text))
	if err != nil {
		t.Fatal(err)
	}
	pz := filepath.Join(t.TempDir(), "prompts.jsonl")
	skippable := []byte{0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 0xff, 1, 0, 0}
	if err := os.WriteFile(pz, append(skippable, zst...), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, stderr, err := f.submit(ctx, pz); err != nil || got != batch {
		t.Errorf("a zstd file that begins with a skippable frame: batch %q, %v (%s); want the plain file's %q", got, err, stderr, batch)
	}

	bad := compressed(t, "zstd", jobLine(0)+"\n"+`{"custom_id":"x","model":"Qwen/Qwen3-8B","prompt":"a","colour":"red"}`+"\n")
	if _, stderr, err := f.submit(ctx, bad); !errors.Is(err, errInvalidInput) || !strings.Contains(stderr, bad+":2: field colour: unknown field") {
		t.Errorf("a bad line in a zstd file: %v, said %q; want it named by file, line and field", err, stderr)
	}
}

// TestTheBytesReadComeToTheInputsSize: the bytes a pass counts as read, from plain and
// compressed files alike, come to the size inputSize gives them (the files as stored), so
// that the validation's share read ends at the whole; a pipe's or a device's size is not
// known.
func TestTheBytesReadComeToTheInputsSize(t *testing.T) {
	text := strings.Join(jobLines(3000), "\n") + "\n"
	files := []string{writeLines(t, jobLines(2000)), compressed(t, "gzip", text), compressed(t, "zstd", text)}
	var read atomic.Int64
	lines := 0
	if err := eachJob(files, jobs.Limits{}, nil, &read, func(jobs.Job, []byte, lineAt, error) error {
		lines++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if size := inputSize(files); lines != 8000 || read.Load() != size || size == 0 {
		t.Fatalf("%d lines, %d bytes read, files of %d bytes: want 8000 lines, and every byte read", lines, read.Load(), size)
	}
	if size := inputSize(append(files, os.DevNull)); size != 0 {
		t.Errorf("with a device among the files: size %d, want 0 (not known)", size)
	}
}

// TestTruncatedCompressedInputPublishesNothing: a gzip file cut short is an error that names
// it, found while the input is validated, before any job is published.
func TestTruncatedCompressedInputPublishesNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	lines := jobLines(2000)
	in := compressed(t, "gzip", strings.Join(lines, "\n")+"\n")
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(in, data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := f.submit(context.Background(), in)
	if err == nil || !strings.Contains(err.Error(), "read "+in+" after line ") || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Fatalf("err = %v (said %q); want a read error naming the file", err, stderr)
	}
	if got := jobsIn(t, bind(t, f)); got != 0 {
		t.Errorf("%d jobs published from a truncated file", got)
	}
}

// TestInputCompressedAnotherWayIsNamed: an xz, bzip2 or zip file, a UTF-16 file, or a
// directory, is refused with what to do, not read as text (every line of it an invalid-UTF-8
// or malformed-JSON error, or "is a directory" after line 0).
func TestInputCompressedAnotherWayIsNamed(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	for kind, head := range map[string]string{"xz": "\xfd7zXZ\x00\x00\x04\xe6\xd6\xb4F", "bzip2": "BZh91AY&SY\x8a"} {
		in := writeLines(t, []string{head})
		_, stderr, err := f.submit(context.Background(), in)
		if err == nil || !strings.Contains(err.Error(), in+" is compressed with "+kind+": give it as JSONL, or compressed with zstd or gzip") {
			t.Errorf("%s: err = %v (said %q)", kind, err, stderr)
		}
	}
	in := writeLines(t, []string{"PK\x03\x04\x14\x00\x00\x00\x08\x00"})
	if _, _, err := f.submit(context.Background(), in); err == nil || !strings.Contains(err.Error(), in+" is a zip archive: give the JSONL file it holds") {
		t.Errorf("zip: err = %v", err)
	}

	line := jobLine(0) + "\n"
	utf16 := func(bigEndian, bom bool) string {
		var b []byte
		if bom {
			b = []byte{0xff, 0xfe}
			if bigEndian {
				b = []byte{0xfe, 0xff}
			}
		}
		for _, c := range []byte(line) { // ASCII
			if bigEndian {
				b = append(b, 0, c)
			} else {
				b = append(b, c, 0)
			}
		}
		return string(b)
	}
	for name, text := range map[string]string{
		"UTF-16LE with a byte order mark":    utf16(false, true),
		"UTF-16BE with a byte order mark":    utf16(true, true),
		"UTF-16LE without a byte order mark": utf16(false, false),
		"UTF-16BE without a byte order mark": utf16(true, false),
	} {
		in := filepath.Join(t.TempDir(), "prompts.jsonl")
		if err := os.WriteFile(in, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		_, stderr, err := f.submit(context.Background(), in)
		if err == nil || !strings.Contains(err.Error(), in+" is UTF-16 text, and JSONL is UTF-8: convert it first, as in 'iconv -f UTF-16 -t UTF-8 "+in) {
			t.Errorf("%s: err = %v (said %q)", name, err, stderr)
		}
	}
	dir := t.TempDir()
	if _, _, err := f.submit(context.Background(), dir); err == nil || !strings.Contains(err.Error(), dir+" is a directory: give the JSONL files in it") {
		t.Errorf("a directory: err = %v", err)
	}
}

// natsChild names the environment variable that makes this test binary a NATS server (an
// embedded one storing in the directory it names, its client URL on a line of standard
// output after natsChildSays) until its standard input closes: a test that reads its own
// heap then counts submit's alone, not the server's as well, which holds the messages it
// has read and not yet stored for as long as its cores let it fall behind.
const natsChild = "TINKERFLEET_TEST_NATS_DIR"

const natsChildSays = "nats-url: "

// serveNATSChild is the child process of natsInChild.
func serveNATSChild(t *testing.T, dir string) {
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: dir, Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Shutdown()
	fmt.Println(natsChildSays + emb.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// natsInChild runs this test binary's test named run as a NATS server in a child process
// (natsChild), and returns its client URL. The server ends with the test.
func natsInChild(t *testing.T, run string) string {
	t.Helper()
	child := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
	child.Env = append(os.Environ(), natsChild+"="+t.TempDir())
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := child.Wait(); err != nil {
			t.Errorf("the NATS server's process: %v", err)
		}
	})
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if url, ok := strings.CutPrefix(sc.Text(), natsChildSays); ok {
			go func() { _, _ = io.Copy(io.Discard, stdout) }() // the rest, until the child ends
			return url
		}
	}
	t.Fatalf("the NATS server's process said no URL: %v", sc.Err())
	return ""
}

// TestLongLinesArePublishedWithoutHoldingTheFileInMemory: the jobs published and not yet
// known stored are bounded in bytes as well as in number. Each one's future holds its job
// until it is settled, and 2048 of them at a time held a file of long prompts whole (2048
// lines of 1 MiB: 2 GiB, and up to 16 GiB at the line limit).
func TestLongLinesArePublishedWithoutHoldingTheFileInMemory(t *testing.T) {
	if dir := os.Getenv(natsChild); dir != "" {
		serveNATSChild(t, dir)
		return
	}
	// Not parallel: it reads the heap of the whole process.
	f := &fleet{t: t, nats: natsInChild(t, "TestLongLinesArePublishedWithoutHoldingTheFileInMemory")}
	in := filepath.Join(t.TempDir(), "long.jsonl")
	const lines, lineBytes = 240, 512 << 10 // a 120 MiB file
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", lineBytes/45)
	var text strings.Builder
	for i := range lines {
		fmt.Fprintf(&text, `{"custom_id":"long-%d","model":"Qwen/Qwen3-8B","prompt":%q,"sampling_params":{"max_tokens":4}}`+"\n", i, prompt)
	}
	if err := os.WriteFile(in, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	size := int64(text.Len())
	text, prompt = strings.Builder{}, ""

	// The live heap after each collection, its largest while the batch is published.
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	runtime.GC()
	metrics.Read(live)
	before := live[0].Value.Uint64()
	var peak atomic.Uint64
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			metrics.Read(s)
			peak.Store(max(peak.Load(), s[0].Value.Uint64()))
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	_, stderr, err := f.submit(context.Background(), in)
	close(done)
	<-watched
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if got := jobsIn(t, bind(t, f)); got != lines {
		t.Fatalf("%d jobs published, want %d", got, lines)
	}
	grew := int64(peak.Load()) - int64(before)
	t.Logf("publishing %d MiB of jobs: live heap grew by %d MiB at most", size>>20, grew>>20)
	if grew > settleBytes+size/4 { // the bound, and room for the rest of the process
		t.Fatalf("publishing a %d MiB file held %d MiB of live heap: the jobs waiting for their acks are held whole", size>>20, grew>>20)
	}
}

// TestAnInterruptWhileTheInputIsReadStopsThere: an interrupt (Ctrl-C) while the input is
// validated stops the reading at the next line and says that nothing was published. The
// interrupt is caught, so before it went unheeded until every line had been read (about a
// second per million lines, again for each further Ctrl-C), and then said nothing of it.
func TestAnInterruptWhileTheInputIsReadStopsThere(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	lines := jobLines(1000)
	lines[0], lines[1] = `{"custom_id":"bad-0","model":"Qwen/Qwen3-8B","prompt":"x","colour":"red"}`, `{"custom_id":"bad-1"}`
	in := writeLines(t, lines)
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	// The interrupt comes as the first bad line is said.
	stderr := &writeThen{then: interrupt}
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: io.Discard, stderr: stderr, tty: 0}
	err := run(ctx, []string{"--nats-url", f.nats, "--progress", "none", "--skip-invalid", "--rejects", filepath.Join(t.TempDir(), "rejects.jsonl"), in}, env)
	if !errors.Is(err, errInterrupted) || !strings.Contains(err.Error(), "nothing was published") {
		t.Errorf("err = %v; want it interrupted, saying that nothing was published", err)
	}
	if said := stderr.String(); strings.Contains(said, in+":2:") {
		t.Errorf("the input was read on after the interrupt:\n%.300s", said)
	}
	if got := jobsIn(t, bind(t, f)); got != 0 {
		t.Errorf("%d jobs published", got)
	}
}

// writeThen is a buffer that calls then once, after its first write.
type writeThen struct {
	bytes.Buffer
	then func()
}

func (w *writeThen) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if w.then != nil {
		w.then()
		w.then = nil
	}
	return n, err
}

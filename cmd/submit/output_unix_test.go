//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// writeLimitChild names the environment variable that makes this test binary a `submit` run
// whose files may not grow past 4 KiB (RLIMIT_FSIZE, as a disk that fills up): its value is
// the command's arguments, one per line.
const writeLimitChild = "TINKERFLEET_TEST_WRITE_LIMIT_ARGS"

// TestResultsThatCannotBeWrittenSayHowToGoOn: when the output file cannot take more (a full
// disk), submit says what failed and how to go on; run again with room, it writes the rest
// after the whole lines it kept, each result once.
func TestResultsThatCannotBeWrittenSayHowToGoOn(t *testing.T) {
	if args := os.Getenv(writeLimitChild); args != "" {
		runWithWriteLimit(strings.Split(args, "\n"))
		return
	}
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	f.startWorker(16)
	ctx := context.Background()
	const n = 40
	stdout, _, err := f.submit(ctx, writeLines(t, jobLines(n)), "--wait")
	if err != nil {
		t.Fatal(err)
	}
	batch := strings.TrimSpace(stdout)
	out := filepath.Join(t.TempDir(), "results.jsonl")

	child := exec.Command(os.Args[0], "-test.run=^TestResultsThatCannotBeWrittenSayHowToGoOn$")
	child.Env = append(os.Environ(), writeLimitChild+"=results\n--nats-url\n"+f.nats+"\n"+batch+"\n-o\n"+out)
	var stderr bytes.Buffer
	child.Stderr = &stderr
	err = child.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("results into a file that cannot grow: %v, want exit status 1; stderr:\n%s", err, stderr.String())
	}
	for _, want := range []string{"write results: ", "file too large", "once " + out + " can be written, run the same command again to write the rest"} {
		if !strings.Contains(stderr.String(), want) {
			t.Fatalf("stderr does not say %q:\n%s", want, stderr.String())
		}
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if whole := bytes.Count(data, []byte("\n")); whole == 0 || whole == n {
		t.Fatalf("%d of %d results in the file the limit stopped: the test needs some, not all", whole, n)
	}

	if _, _, err := f.submit(ctx, "results", batch, "-o", out); err != nil {
		t.Fatalf("the same command again, with room: %v", err)
	}
	if got := len(readResults(t, out)); got != n {
		t.Fatalf("%d results after going on, want %d", got, n)
	}
}

// runWithWriteLimit runs submit with args in this process, its files held to 4 KiB, and
// exits with its exit status.
func runWithWriteLimit(args []string) {
	// Go ignores SIGXFSZ, so a write past the limit fails with EFBIG.
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 4 << 10, Max: 4 << 10}); err != nil {
		os.Stderr.WriteString("setrlimit: " + err.Error() + "\n")
		os.Exit(2)
	}
	env := &environment{getenv: os.Getenv, stdin: strings.NewReader(""), stdout: os.Stdout, stderr: os.Stderr}
	if err := run(context.Background(), args, env); err != nil {
		os.Stderr.WriteString("submit: " + err.Error() + "\n")
		os.Exit(exitCode(err))
	}
	os.Exit(0)
}

// TestAPipeAsTheOutputIsRefused: an -o that is a pipe (a FIFO, or /dev/stdout piped into
// another command) is refused before a job is published. submit reads an -o file back to
// resume; reading a pipe it held open itself never ended, and no signal stopped it.
func TestAPipeAsTheOutputIsRefused(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	in := writeLines(t, jobLines(3))
	fifo := filepath.Join(t.TempDir(), "out.fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	refused := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { _, _, err := f.submit(ctx, args...); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "is a pipe, not a regular file") {
				t.Errorf("submit %s: %v; want a refusal of the pipe", strings.Join(args, " "), err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("submit %s still runs 10 s after it was interrupted", strings.Join(args, " "))
		}
	}
	refused(in, "-o", fifo)
	if n := jobsIn(t, bind(t, f)); n != 0 {
		t.Fatalf("%d jobs published for results that could not be written", n)
	}
	batch, _, err := f.submit(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	refused("results", strings.TrimSpace(batch), "-o", fifo)
}

// TestAnOutputFileFollowedElsewhereIsRefused: while one submit writes a compressed -o, its
// stream is not ended; a second process naming the same file took it for one a crash cut
// short and wrote it again, without the lines to come, which the first then wrote into a file
// no longer there (it reported 40 results in a file of 2). The second is now refused, and the
// first ends with every line.
func TestAnOutputFileFollowedElsewhereIsRefused(t *testing.T) {
	t.Parallel()
	f := newFleet(t, queue.Config{}, tinkersim.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := writeLines(t, jobLines(40))
	out := filepath.Join(t.TempDir(), "results.jsonl.zst")
	if _, stderr, err := f.submit(ctx, in, "--batch-id", "two"); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	// The results are stored here, half before the second process and half after it, as a
	// worker would store them: with a worker, a first submit slow to start (a busy machine)
	// read all 40 at once and ended before the second came, which then was not refused.
	q := bind(t, f)
	storeResults := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			res := jobs.Result{CustomID: fmt.Sprintf("job-%05d", i), BatchID: "two", Status: jobs.StatusOK, Model: "Qwen/Qwen3-8B"}
			data, err := res.AppendJSON(nil)
			if err != nil {
				t.Fatal(err)
			}
			storeResult(ctx, t, q, "two", res.CustomID, string(res.Status), data)
		}
	}
	storeResults(0, 20)
	first := make(chan error, 1)
	go func() {
		_, stderr, err := f.submit(ctx, in, "--batch-id", "two", "-o", out)
		if err != nil {
			err = errors.New(err.Error() + ": " + stderr)
		}
		first <- err
	}()
	for { // the first has written something
		if fi, err := os.Stat(out); err == nil && fi.Size() > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, err := f.submit(ctx, "results", "two", "-o", out); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "is being written by another submit") {
		t.Errorf("a second process on the same -o: %v, want it refused", err)
	}
	storeResults(20, 40)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := outputLines(t, decompress(t, out)); len(got) != 40 {
		t.Fatalf("%d results in the file, want 40", len(got))
	}
	// Once the first has ended, the file is free again.
	if _, stderr, err := f.submit(ctx, "results", "two", "-o", out); err != nil {
		t.Fatalf("after the first ended: %v: %s", err, stderr)
	}
}

// TestTheLockIsOnTheFileThePathNames: a process that opened the -o path just before another
// mended it (a new file renamed into place, the old one closed and its lock let go) got the
// old file's lock, took its cut stream for a crash's, and mended it over the other's file.
// The lock now counts only on the file the path names, and the second is refused.
func TestTheLockIsOnTheFileThePathNames(t *testing.T) {
	t.Parallel()
	const batch = "b-race"
	line := func(i int) []byte {
		return fmt.Appendf(nil, `{"custom_id":"r-%d","batch_id":%q,"status":"ok"}`+"\n", i, batch)
	}
	path := filepath.Join(t.TempDir(), "out.jsonl.zst")
	var buf bytes.Buffer
	zw := newCompressor(t, "zstd", &buf) // a stream a crash cut short: 2 lines, not ended
	zw.Write(line(0))
	zw.Write(line(1))
	zw.Flush()
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	early, err := os.OpenFile(path, os.O_RDWR, 0) // the second process, before its lock
	if err != nil {
		t.Fatal(err)
	}
	a, _, err := openOutput(path, batch, map[queue.JobKey]bool{}, &summary{}) // mends, writes on
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Write(line(2)); err != nil {
		t.Fatal(err)
	}
	if f, _, err := lockOpened(path, early, false); !errors.Is(err, errUsage) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("locking the file opened before the mend: %v, want it refused while the first writes", err)
	}
}

// TestAnEmptyOutputIsRemovedOnlyUnderItsLock: a run that created -o and ended before its
// first result removes it, but not once another process holds it: that one writes to it.
func TestAnEmptyOutputIsRemovedOnlyUnderItsLock(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "out.jsonl")
	a, created, err := openOutput(path, "b", map[queue.JobKey]bool{}, &summary{})
	if err != nil || !created {
		t.Fatal(err, created)
	}
	a.Close() // the first run let the file go
	b, _, err := openOutput(path, "b", map[queue.JobKey]bool{}, &summary{})
	if err != nil {
		t.Fatal(err)
	}
	removeIfEmpty(path) // the first run's clean-up
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("removed while another process held it: %v", err)
	}
	b.Close()
	removeIfEmpty(path)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an empty output nobody holds was kept: %v", err)
	}
}

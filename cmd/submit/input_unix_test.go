//go:build unix

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
)

// TestInputThatCannotBeReadTwiceIsRefused: standard input ("-") and a pipe (as from a shell's
// <(…)) are refused at once, saying to write a file, and not as a missing file or, after the
// validation pass emptied the pipe, as input that changed while it was published. A dry run,
// which reads its input once, takes the pipe.
func TestInputThatCannotBeReadTwiceIsRefused(t *testing.T) {
	t.Parallel()
	pipe := filepath.Join(t.TempDir(), "prompts")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	submit := func(args ...string) (string, error) {
		var stdout, stderr bytes.Buffer
		env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(jobLine(0) + "\n"), stdout: &stdout, stderr: &stderr}
		err := run(context.Background(), append([]string{"--nats-url", fleettest.ClosedURL(t)}, args...), env)
		return stdout.String(), err
	}
	for _, c := range []struct{ input, want string }{
		{"-", `input "-": standard input cannot be read: submit reads its input twice`},
		{pipe, "input " + pipe + " is a pipe, which cannot be read again: submit reads its input twice"},
	} {
		done := make(chan error, 1)
		go func() {
			_, err := submit(c.input, "-o", filepath.Join(t.TempDir(), "out.jsonl"))
			done <- err
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			// It opened the pipe, which waits for a writer: be one, and end the pipe.
			if f, werr := os.OpenFile(pipe, os.O_WRONLY|syscall.O_NONBLOCK, 0); werr == nil {
				f.Close()
			}
			err = <-done
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("submit %s: %v; want %q", c.input, err, c.want)
		}
	}

	written := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(pipe, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString(jobLine(0) + "\n" + jobLine(1) + "\n")
			f.Close()
		}
		written <- err
	}()
	out, err := submit("--dry-run", pipe)
	if err != nil { // the writer may still wait for a reader: be one
		if f, rerr := os.OpenFile(pipe, os.O_RDONLY|syscall.O_NONBLOCK, 0); rerr == nil {
			defer f.Close()
		}
	}
	if err != nil || !strings.Contains(out, "2 valid lines") {
		t.Errorf("a dry run of a pipe: %v\n%s", err, out)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}

	// A dry run of "-", as in 'cat … | submit --dry-run -', is not told that submit reads its
	// input twice (a dry run reads it once), but how to give it the pipe.
	if _, err := submit("--dry-run", "-"); err == nil || strings.Contains(err.Error(), "reads its input twice") || !strings.Contains(err.Error(), "/dev/stdin") {
		t.Errorf("a dry run of -: %v; want it told to name standard input /dev/stdin", err)
	}
}

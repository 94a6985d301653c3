//go:build unix

package interrupt_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/interrupt"
)

// childEnv marks the test binary run as a child that waits on interrupt.Context.
const childEnv = "INTERRUPT_TEST_CHILD"

// drainEnv makes the child go on for that long once stopped, as a worker finishing its jobs.
const drainEnv = "INTERRUPT_TEST_DRAIN"

// TestMain runs the child: it says "ready" once the signals are caught, and then what ended
// its context; then, with drainEnv, "drained" after that long.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		ctx, stop := interrupt.Context(context.Background())
		defer stop()
		fmt.Println("ready")
		select {
		case <-ctx.Done():
			fmt.Println("stopped by", context.Cause(ctx))
		case <-time.After(30 * time.Second):
			fmt.Println("never stopped")
		}
		if d, err := time.ParseDuration(os.Getenv(drainEnv)); err == nil {
			time.Sleep(d)
			fmt.Println("drained")
		}
		return
	}
	// A child inherits the signals this process was started ignoring (SIGHUP under
	// `nohup go test`; SIGINT too when the test binary runs as a script's background job),
	// and rightly keeps them ignored: the tests that send them would fail, a child "never
	// stopped". A signal this process catches is the default again in a child, so catch
	// those here, and drop them: nohup's choice still holds for the test run.
	for _, sig := range []os.Signal{syscall.SIGHUP, syscall.SIGINT} {
		if signal.Ignored(sig) {
			signal.Notify(make(chan os.Signal, 1), sig)
		}
	}
	os.Exit(m.Run())
}

// startChild starts the child through sh (script first, then exec) with env added to its
// environment, and returns it once it says it is ready, with the reader of its lines.
func startChild(t *testing.T, script string, env ...string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script+`; exec "$0" -test.run=^$`, os.Args[0])
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("child did not start: %q", lines.Text())
	}
	return cmd, lines
}

// stoppedBy starts the child (startChild), sends it signals in order, and returns what it
// says stopped it.
func stoppedBy(t *testing.T, script string, signals ...syscall.Signal) string {
	t.Helper()
	cmd, lines := startChild(t, script)
	for _, sig := range signals {
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}
	lines.Scan()
	said := lines.Text()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v (said %q)", err, said)
	}
	return strings.TrimPrefix(said, "stopped by ")
}

func TestTheCommonSignalsStopIt(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		if got := stoppedBy(t, "true", sig); got != sig.String()+" signal received" {
			t.Errorf("after %v: %q", sig, got)
		}
	}
}

// TestSignalsIgnoredAtStartStayIgnored: under nohup (SIGHUP ignored), or started in the
// background by a script (SIGINT ignored), the program goes on through those signals and
// still stops on SIGTERM.
func TestSignalsIgnoredAtStartStayIgnored(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP} {
		script := fmt.Sprintf(`trap "" %d`, sig)
		if got := stoppedBy(t, script, sig, syscall.SIGTERM); got != "terminated signal received" {
			t.Errorf("%v ignored at start, then %v and SIGTERM: %q", sig, sig, got)
		}
	}
}

// TestASecondCtrlCKillsAtOnce: while the process finishes what it has in hand after a first
// signal, a second Ctrl-C kills it, as it would a program that catches none; a second SIGTERM
// (a supervisor's) lets the stop go on.
func TestASecondCtrlCKillsAtOnce(t *testing.T) {
	t.Parallel()
	cmd, lines := startChild(t, "true", drainEnv+"=20s")
	cmd.Process.Signal(syscall.SIGINT)
	if !lines.Scan() || lines.Text() != "stopped by interrupt signal received" {
		t.Fatalf("after the first Ctrl-C: %q", lines.Text())
	}
	exited := make(chan error, 1)
	go func() {
		for lines.Scan() { // drains the pipe, so that Wait can return
			t.Errorf("after the second Ctrl-C the child said %q", lines.Text())
		}
		exited <- cmd.Wait()
	}()
	// The second Ctrl-C of a person comes some time after the first: sent until the child
	// ends, it is sure to find the first one's stop under way.
	var err error
wait:
	for deadline := time.After(10 * time.Second); ; {
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case err = <-exited:
			break wait
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			cmd.Process.Kill()
			t.Fatal("a second Ctrl-C did not stop the child")
		}
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Errorf("after a second Ctrl-C the child ended with %v, want killed by SIGINT", err)
	}

	cmd, lines = startChild(t, "true", drainEnv+"=500ms")
	cmd.Process.Signal(syscall.SIGTERM)
	lines.Scan()
	cmd.Process.Signal(syscall.SIGTERM)
	if !lines.Scan() || lines.Text() != "drained" {
		t.Errorf("after a second SIGTERM the child said %q, want it to finish its stop", lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after a second SIGTERM: %v", err)
	}
}

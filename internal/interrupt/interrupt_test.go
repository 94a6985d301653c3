//go:build unix

package interrupt_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/interrupt"
)

// childEnv marks the test binary run as a child that waits on interrupt.Context.
const childEnv = "INTERRUPT_TEST_CHILD"

// TestMain runs the child: it says "ready" once the signals are caught, and then what ended
// its context.
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
		return
	}
	os.Exit(m.Run())
}

// stoppedBy starts the child through sh (script first, then exec), sends it signals in order,
// and returns what it says stopped it.
func stoppedBy(t *testing.T, script string, signals ...syscall.Signal) string {
	t.Helper()
	cmd := exec.Command("sh", "-c", script+`; exec "$0" -test.run=^$`, os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1")
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

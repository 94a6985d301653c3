package interrupt

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Context returns a copy of parent that ends at the first SIGTERM, or SIGINT or SIGHUP unless
// the process was started ignoring it. context.Cause names the signal. stop releases the
// signals: after it, they take their default action again.
func Context(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	signals := []os.Signal{syscall.SIGTERM}
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGHUP} {
		if !signal.Ignored(sig) {
			signals = append(signals, sig)
		}
	}
	return signal.NotifyContext(parent, signals...)
}

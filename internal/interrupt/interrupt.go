package interrupt

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Context returns a copy of parent that ends at the first SIGTERM, or SIGINT or SIGHUP unless
// the process was started ignoring it. context.Cause names the signal. Once it has ended, a
// second Ctrl-C (SIGINT) kills the process at once, as it would have without Context: it is a
// person's, tired of waiting for the jobs in hand to finish (what is not finished is handed
// out again, as after kill -9). A second SIGTERM or SIGHUP changes nothing: the first one's
// stop goes on. stop releases the signals: after it, they take their default action again.
func Context(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	signals := []os.Signal{syscall.SIGTERM}
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGHUP} {
		if !signal.Ignored(sig) {
			signals = append(signals, sig)
		}
	}
	ctx, stop = signal.NotifyContext(parent, signals...)
	if !signal.Ignored(os.Interrupt) {
		context.AfterFunc(ctx, func() { signal.Reset(os.Interrupt) })
	}
	return ctx, stop
}

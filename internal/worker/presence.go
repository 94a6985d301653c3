package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// newWorkerID returns a fresh random id for a worker: its key in the backoff bucket, for
// its presence note and its capacity reports alike.
func newWorkerID() string {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

// hostName is the machine's (a pod's) name, or "" if the system does not say.
func hostName() string {
	host, _ := os.Hostname()
	return host
}

// attend notes the worker's presence now and every period until ctx is done, then removes
// the note: readers (submit) tell a fleet at work from one that is gone by these notes,
// which the jobs consumer cannot show (queue.Presence). A note that cannot be sent is left:
// the next one, or its absence, says what a reader should know. A worker attends once its
// session is open, so the service accepted its key: a note that a refused key stopped a
// worker is removed then.
func (w *Worker) attend(ctx context.Context, period time.Duration) {
	note := func() {
		p := queue.Presence{Host: w.host}
		if err := w.cfg.Queue.NotePresence(w.id, p); err != nil {
			w.log.Debug("note presence", "err", err)
		}
	}
	note()
	fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if err := w.cfg.Queue.ForgetKeyRefusal(fctx); err != nil {
		w.log.Debug("forget a refused key's note", "err", err)
	}
	cancel()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// The worker stops: say so at once rather than let the note age out. With the
			// connection down, a reconnect (ReconnectWait 250 ms and its jitter) still lands
			// the removal, and a server gone for longer holds the stop a second at most.
			budget := 2 * time.Second
			if w.natsDown() {
				budget = time.Second
			}
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
			defer cancel()
			if err := w.cfg.Queue.ForgetPresence(fctx, w.id); err != nil {
				w.log.Debug("forget presence", "err", err)
			}
			return
		case <-t.C:
			note()
		}
	}
}

// silent is told of another worker whose presence notes stopped without its leaving (a
// crash, a connection lost for good): if it reported in a share round within the ttl, a
// part of the capacity may be its and is free, as when a worker leaves; this worker forgets
// its limit and learns the capacity anew at the next 429, rather than run at its part until
// the limit expires (up to the ttl) with the fleet short of the silent worker's part.
func (w *Worker) silent(worker string) {
	if worker == w.id || !w.board.ReportedSince(worker, time.Now().Add(-w.cfg.CapacityTTL)) {
		return
	}
	w.log.Info("a worker of the capacity share rounds went silent; learning the capacity anew", "worker", worker)
	if w.gate.capacity.forget() {
		w.metrics.forgotLimit("silent")
	}
}

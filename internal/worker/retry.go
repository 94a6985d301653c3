package worker

import (
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// errBackingOff is why a job waits out a long pause of the fleet in the stream.
var errBackingOff = errors.New("the fleet is backing off")

// retryNoteEvery is how often at most this worker notes a retry of one batch.
const retryNoteEvery = time.Second

// retryNotes holds this worker's retry notes (queue.RetryNote) to one per batch a second: a
// burst of failures, such as every job of a batch meeting a tokenizer hub that is down, costs
// the NATS server a note a second.
type retryNotes struct {
	mu   sync.Mutex
	last map[string]time.Time // batch -> when this worker last noted a retry of it
}

// due reports whether a retry of batch at now is to be noted and, if it is, counts it as
// noted.
func (n *retryNotes) due(batch string, now time.Time) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t, ok := n.last[batch]; ok && now.Sub(t) < retryNoteEvery {
		return false
	}
	if n.last == nil {
		n.last = make(map[string]time.Time)
	}
	for b, t := range n.last { // forget the batches not noted lately
		if now.Sub(t) >= retryNoteEvery {
			delete(n.last, b)
		}
	}
	n.last[batch] = now
	return true
}

// thinnedEvery is how often at most a worker logs one kind of thinned event at info.
const thinnedEvery = 10 * time.Second

// thinned logs an event that can befall every job in hand at once, for one cause: a failure
// of the service that outlasts the Tinker client's own retries fails them all, a worker cut
// off from NATS past the ack wait finds them all delivered again or given up. A line each at
// info was hundreds of lines for one cause, which its own line names (the client's warning,
// "nats disconnected"). thinned logs at info at most once every thinnedEvery, with how many
// events befell since (under countKey), and at debug otherwise. Its zero value is ready.
type thinned struct {
	last  atomic.Int64 // when it last logged at info, in unix nanoseconds
	count atomic.Int64 // events since
}

// log logs one event: msg with args, at info or debug.
func (t *thinned) log(log *slog.Logger, msg, countKey string, args ...any) {
	t.count.Add(1)
	now := time.Now().UnixNano()
	last := t.last.Load()
	if last != 0 && now-last < int64(thinnedEvery) || !t.last.CompareAndSwap(last, now) {
		log.Debug(msg, args...)
		return
	}
	log.Info(msg, append(args, countKey, t.count.Swap(0))...)
}

// noteRetry tells whoever waits on batch's results, through its retry note, why a job of it
// waits delay for another delivery. A wait for a pause of the fleet is not noted: submit
// reads the pause itself.
func (w *Worker) noteRetry(batch, customID string, delivered uint64, delay time.Duration, why error) {
	if why == nil || errors.Is(why, errBackingOff) || !w.retryNotes.due(batch, time.Now()) {
		return
	}
	err := w.cfg.Queue.NoteRetry(batch, queue.RetryNote{
		CustomID: customID, Delivery: delivered, MaxDeliver: w.maxDeliver,
		RetryInMS: delay.Milliseconds(), Error: why.Error(),
	})
	if err != nil {
		w.jobLog(batch, customID, delivered).Debug("note the retry for submit", "err", err)
	}
}

// noteServiceRetry tells whoever waits on results, through the fleet's service note, that the
// Tinker client retries a request the service failed or that did not reach it, at most once
// a second (the client warns of them in the log itself). A 429 is left out: it pauses the
// fleet, which submit reads itself.
func (w *Worker) noteServiceRetry(e tinker.Event) {
	if e.Kind != tinker.EventRetry || e.Err == nil || e.StatusCode == http.StatusTooManyRequests {
		return
	}
	now := time.Now().UnixNano()
	last := w.serviceNoted.Load()
	if now-last < int64(retryNoteEvery) || !w.serviceNoted.CompareAndSwap(last, now) {
		return
	}
	err := w.cfg.Queue.NoteServiceRetry(queue.ServiceNote{
		Endpoint: e.Endpoint, Status: e.StatusCode, RetryInMS: e.Delay.Milliseconds(), Error: e.Err.Error(),
	})
	if err != nil {
		w.log.Debug("note the service's failure for submit", "err", err)
	}
}

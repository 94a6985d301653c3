package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// ErrCredentialRefused is why a worker cannot start, or stops (Run returns it, wrapped): the
// Tinker service refuses its credential (§7.1: 401 AuthenticationError, 403
// PermissionDeniedError), as after the key was revoked. No job is at fault, so none fails for
// it: a worker that stops hands its jobs back to the stream, where they wait for a worker
// whose credential the service accepts.
var ErrCredentialRefused = errors.New("the service refused the API key (check TINKER_API_KEY, TINKER_API_KEY_FILE or TINKER_CREDENTIAL_CMD)")

// credentialCheck runs one Client.CheckCredential for all the jobs that a refusal met at
// about the same time: a revoked key fails every job the worker holds at once.
type credentialCheck struct {
	mu    sync.Mutex
	began time.Time // when the last check began (zero: none yet)
	err   error     // its outcome
}

// since returns the outcome of a check that began no earlier than refusedAt, and runs one
// when there is none. A credential found refused stays so: the worker stops.
func (c *credentialCheck) since(ctx context.Context, refusedAt time.Time, check func(context.Context) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.began.IsZero() && (!c.began.Before(refusedAt) || tinker.CredentialRefused(c.err)) {
		return c.err
	}
	c.began, c.err = time.Now(), check(ctx)
	if ctx.Err() != nil {
		c.began = time.Time{} // cut short: no answer for the jobs that wait for it
	}
	return c.err
}

// refused decides the outcome of a job whose request the service refused with 401 or 403
// (err), by asking the service whether it still accepts the worker's credential:
//
//   - refused: the key is at fault, not the job, and every other job would meet the same
//     refusal. The worker stops (Run returns ErrCredentialRefused) and hands the job back;
//     nothing fails, and nothing is sampled while the key is refused.
//   - accepted, after a 403: the key may not have what this job asked for (a model path of
//     another account, say): the job ends with an api_error result.
//   - accepted, and the worker has taken a new key from the file since the job's request
//     began (keysTaken, when the job's sample began): the refusal was the old key's, and the
//     job goes back to the stream at once.
//   - accepted, after a 401 (a JWT the service stopped honouring, renewed by the check), or
//     no answer: the job is tried again later.
func (w *Worker) refused(ctx context.Context, job jobs.Job, batch string, keysTaken uint64, err error) outcome {
	cerr := w.credential.since(ctx, time.Now(), w.checkCredential)
	var status *tinker.StatusError
	errors.As(err, &status)
	switch {
	case tinker.CredentialRefused(cerr):
		cause := fmt.Errorf("%w: %w", ErrCredentialRefused, cerr)
		if w.stopRun(cause) {
			noteRefusal(w.cfg.Queue, cause, w.log)
		}
		return outcome{settle: settleNak}
	case cerr == nil && status.StatusCode == http.StatusForbidden:
		res := errorResult(job, batch, jobs.ResultError{
			Code: jobs.CodeAPIError, Message: err.Error(), Category: jobs.CategoryUser,
		})
		res.Attempts = tinker.AttemptsOf(err)
		return outcome{result: &res, settle: settleTerm}
	case cerr == nil && w.keysTaken.Load() != keysTaken:
		// Once per rotation for each job: a key the service refused in turn would stop
		// the worker above, not send its jobs round at once again.
		return outcome{settle: settleRetry, delay: time.Nanosecond, err: &renewedError{err}}
	case cerr == nil:
		return transient(&renewedError{err}) // a 401: a JWT the service stopped honouring, renewed by the check
	}
	return transient(err)
}

// renewedError marks a request refused for a credential that the service accepts again by
// the time the worker checked it (a key replaced since from its file, a JWT renewed): not
// the job's failure. On the job's last delivery, where a failure ends the job as a dead
// letter, the job is worked on again at once instead (handle).
type renewedError struct{ err error }

func (e *renewedError) Error() string { return e.err.Error() }
func (e *renewedError) Unwrap() error { return e.err }

// checkCredential asks the service whether it still accepts the worker's credential. A key it
// refuses that came from a file (Config.TinkerAPIKeyFile) is read from the file again: if the
// file now holds another key, the client takes it and the service is asked again.
func (w *Worker) checkCredential(ctx context.Context) error {
	err := w.client.CheckCredential(ctx)
	if !tinker.CredentialRefused(err) || w.cfg.TinkerAPIKeyFile == "" {
		return err
	}
	key, rerr := tinker.APIKeyFromFile(w.cfg.TinkerAPIKeyFile)
	if rerr != nil {
		w.log.Warn("the service refused the API key, and its file could not be read again", "err", rerr)
		return err
	}
	changed, serr := w.client.SetAPIKey(key)
	switch {
	case serr != nil:
		w.log.Warn("the service refused the API key, and the one its file holds now cannot replace it", "err", serr)
		return err
	case !changed:
		return err // the file still holds the refused key
	}
	w.keysTaken.Add(1)
	w.log.Info("the service refused the API key; its file holds another, which the worker uses from now on",
		"file", w.cfg.TinkerAPIKeyFile)
	if w.cfg.Account == "" && !w.cfg.LocalBackoff {
		w.log.Warn("the fleet backoff stays the old key's until this worker restarts, and workers started with the new key back off apart; " +
			"name the account (TINKERFLEET_ACCOUNT) to keep one fleet across rotations")
	}
	return w.client.CheckCredential(ctx)
}

// stopRun stops Run for cause: it stops pulling jobs, hands back those not yet sent to the
// service, and returns cause. It reports whether this call stopped Run (false: it did
// already, or Run has not begun).
func (w *Worker) stopRun(cause error) bool {
	if w.stop == nil || !w.stopCause.CompareAndSwap(nil, &cause) {
		return false
	}
	w.stop(cause)
	return true
}

// StoppedItself returns why Run stopped by itself (an error wrapping ErrCredentialRefused),
// or nil while it was not: it runs, or its context stopped it. From then on Run takes no
// more jobs and finishes those in hand within the shutdown grace before it returns the same
// error.
func (w *Worker) StoppedItself() error {
	if cause := w.stopCause.Load(); cause != nil {
		return *cause
	}
	return nil
}

// noteRefusal leaves on the NATS server why the worker stopped, or could not start: the
// service refuses its key (err). A user waiting on a batch then reads that, rather than that
// no worker takes jobs.
func noteRefusal(q *queue.Queue, err error, log *slog.Logger) {
	n := queue.ServiceNote{Error: err.Error(), Stopped: true}
	var se *tinker.StatusError
	if errors.As(err, &se) {
		n.Endpoint, n.Status = se.Endpoint, se.StatusCode
	}
	if nerr := q.NoteServiceRetry(n); nerr != nil {
		log.Debug("note the refused key for submit", "err", nerr)
	}
}

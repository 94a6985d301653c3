package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/dispatch"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tokenizer"
)

// outcome is what became of one delivery of a job.
type outcome struct {
	result *jobs.Result  // to publish before the message is settled; nil for none
	settle settleAction  // what to tell JetStream afterwards
	delay  time.Duration // for settleRetry
	err    error         // why, for settleRetry and the dead letter
	mem    charge        // the result's memory (see resultMemory); only with a result
	cells  int           // the numbers the result carries (replyCells), to size its encoding
}

type settleAction int

const (
	settleAck   settleAction = iota // done: result stored (or already there)
	settleTerm                      // permanent failure: error result stored
	settleRetry                     // transient: NakWithDelay, or dead-letter on the last delivery
	settleNak                       // shutting down: hand back at once
	settleLeave                     // given out again (errGivenOut): neither ack nor nak
)

// handle works one delivery of a job and settles its message. A job with an outcome to store
// or ack goes to the settler, which frees its slot once settled (handle reports true); other
// outcomes are settled here, and the caller frees the slot.
func (w *Worker) handle(ctx context.Context, d delivery) (handed bool) {
	msg, r := d.msg, d.r
	start := time.Now()
	names := w.cfg.Queue.Names
	batch := names.BatchFromJobSubject(msg.Subject())
	customID := queue.CustomID(msg.Headers())
	delivered := queue.NumDelivered(msg)
	log := func() *slog.Logger { return w.jobLog(batch, customID, delivered) }
	if batch == "" {
		log().Error("job on an unexpected subject: dropping it", "subject", msg.Subject())
		_ = msg.TermWithReason("not a job subject")
		return false
	}

	if delivered > 1 {
		if seq, ok := queue.StreamSeq(msg); ok {
			w.sentBack.forget(seq) // back from its delay, if this worker sent it back
		}
	}
	if delivered == 1 {
		w.alive.add(msg)
	} else if !w.alive.addAgain(msg) {
		// This worker still holds the job: its InProgress did not reach the server within the
		// ack wait (the process was stopped, or suspended, or its link to NATS was down), and
		// the server delivered the job again, here. Working this delivery too would sample the
		// job twice. The one held goes on and settles the job: the server takes its ack and
		// InProgress by the job's stream sequence. (It may ignore that delivery's nak, when
		// its delivery sequence is below the ack floor now; the job then comes back after the
		// ack wait instead of the nak's delay.)
		w.heldAgainLog.log(log(), "job delivered again while this worker still holds it: left to the delivery it holds", "held_again")
		w.metrics.redeliveredHeld()
		return false
	}
	out := w.work(ctx, msg, batch, customID, delivered, r)
	last := delivered >= uint64(w.maxDeliver)
	if out.settle == settleRetry && last && ctx.Err() == nil && errors.As(out.err, new(*renewedError)) {
		// Refused for a credential the service accepts again (a rotated key, a renewed
		// JWT), which is not the job's failure: on its last delivery, a nak would make the
		// job a dead letter. It is worked on again at once, once, in this delivery.
		out = w.work(ctx, msg, batch, customID, delivered, r)
	}
	if out.settle != settleNak && out.settle != settleLeave && w.cancelled.deleted(batch) {
		// The batch was deleted while its job was at work: its results are purged, and this
		// one, stored now, would stay until the results' max age with nobody to read it.
		out.mem.release()
		out = outcome{settle: settleAck}
	}

	if out.result != nil {
		out.result.LatencyMS = time.Since(start).Milliseconds()
	}
	if out.settle == settleRetry && ctx.Err() != nil {
		// The grace period is over: whatever failed may have failed for that (a tokenizer
		// load, a lookup cut off), and the job goes to another worker now, whatever its
		// delivery, rather than wait out a retry delay or end as a dead letter.
		out.settle = settleNak
	}
	if out.settle == settleRetry && last {
		// The last allowed delivery: end the job here rather than leave it without a result.
		out = w.deadLettered(ctx, msg, batch, customID, fmt.Sprintf("gave up after %s: %v", deliveries(int(delivered)), out.err), out.err.Error())
		out.result.LatencyMS = time.Since(start).Milliseconds()
	}
	if out.settle == settleRetry || out.settle == settleNak || out.settle == settleLeave {
		// Let go before the nak: an InProgress sent after it would put its delay off to the
		// ack wait. A job handed to the settler is held until it is settled (see settled).
		w.alive.remove(msg)
	}
	var err error
	switch out.settle {
	case settleAck, settleTerm:
		s := w.freeSettlement()
		s.msg, s.store, s.term = msg, out.result != nil, out.settle == settleTerm
		if s.store {
			if err := w.encodeResult(batch, out.result, out.cells, s); err != nil {
				out.mem.release()
				w.keep(s)
				w.alive.remove(msg)
				log().Error("encode result; the job will be delivered again", "err", err)
				_ = msg.NakWithDelay(time.Second)
				return false
			}
			// From here on the job holds only the stored message (and a kept buffer) in
			// memory; the result keeps what the metrics read.
			out.mem.resize(int64(len(s.result.Data) + cap(s.buf)))
			out.result.Samples, out.result.PromptLogprobs, out.result.TopKPromptLogprobs = nil, nil, nil
		}
		s.job = finishedJob{reservation: r, batch: batch, customID: customID, delivered: delivered, result: out.result, start: start, mem: out.mem}
		w.settler.hand(s)
		return true
	case settleRetry:
		delay := out.delay
		if delay == 0 {
			delay = w.retryDelay(delivered)
		}
		if errors.Is(out.err, errBackingOff) {
			// The fleet's pause, which its cause's own line says once (a paused queue, a
			// 402), not this job's failure: every job pulled meanwhile comes this way.
			log().Debug("job sent back to wait out the fleet's pause", "delay", delay)
		} else {
			w.retryLog.log(log(), "job will be retried", "sent_back", "delay", delay, "err", out.err)
		}
		w.noteRetry(batch, customID, delivered, delay, out.err)
		if err = msg.NakWithDelay(delay); err == nil {
			if seq, ok := queue.StreamSeq(msg); ok {
				// Ended on a cancel of its batch, rather than after the delay (sentBack).
				w.sentBack.add(seq, batch, customID, time.Now().Add(delay), w.cancelled.has(batch))
			}
		}
	case settleLeave:
		// Its InProgress and ack would count for the delivery the server gave out meanwhile,
		// if it did; a nak would even put that one off. If it did not, the job comes back
		// once its ack wait has passed.
		w.leftLog.log(log(), "job not sent: the NATS server has not heard of it from this worker for about its ack wait, and may have given it to another worker; left to the server", "left")
		w.metrics.leftToFleet()
	case settleNak:
		// Once the puller is closed: until then, the server could deliver the job again into
		// the request the puller gave up on.
		<-w.pullDone
		if delivered == uint64(w.maxDeliver) {
			// Its last delivery to be worked on. (Not the one kept for its dead letter, past
			// it: each worker before died with that job, which may be what killed them.)
			err = w.publishAgain(ctx, msg, log)
			break
		}
		// Waited for, so that a NATS server stopped right after this worker (submit --local's)
		// has taken the job back; past the grace period too, when ctx is done.
		err = queue.HandBack(context.WithoutCancel(ctx), msg)
	}
	if err != nil {
		log().Warn("settle job message", "err", err)
	}
	return false
}

// publishAgain hands back a job that did not fail on its last delivery to be worked on (the
// worker stops): a nak would leave the server only the delivery kept for its dead letter
// (queue.Config.MaxDeliver), and it would end as one. It is published again as a new job
// instead, or, if that fails, handed back all the same.
func (w *Worker) publishAgain(ctx context.Context, msg jetstream.Msg, log func() *slog.Logger) error {
	ctx = context.WithoutCancel(ctx) // past the grace period too
	err := w.cfg.Queue.PublishAgain(ctx, msg)
	if err == nil {
		log().Info("job handed back on its last delivery: published again, with every delivery ahead of it")
		return nil
	}
	log().Warn("publish the job again, handed back on its last delivery; it may end as a dead letter", "err", err)
	return queue.HandBack(ctx, msg)
}

// jobLog is the logger of one delivery of a job. Callers make it only when something is
// logged: most jobs log nothing.
func (w *Worker) jobLog(batch, customID string, delivered uint64) *slog.Logger {
	return w.log.With("batch", batch, "custom_id", customID, "delivery", delivered)
}

// finishedJob is what the worker needs of a job once the settler is through with it.
type finishedJob struct {
	reservation *dispatch.Reservation
	batch       string
	customID    string
	delivered   uint64
	result      *jobs.Result // nil: none stored (the job had one already)
	start       time.Time
	mem         charge // the memory of the result's message, until it is settled
}

// settled ends a job handed to the settler: a job whose result was not stored is handed back
// for another delivery; the job's slot and reservation are freed, and its settlement kept
// for a next job. It runs on the settler's goroutine.
func (w *Worker) settled(s *settlement) {
	j := s.job
	log := func() *slog.Logger { return w.jobLog(j.batch, j.customID, j.delivered) }
	w.alive.remove(s.msg) // held from its delivery (see handle), and before the nak below
	if s.publishErr != nil {
		if !s.heldSince.IsZero() && queue.StoreUnavailable(s.publishErr) {
			// Let go at shutdown: the settler said so for all it held.
			log().Debug("result not stored; the job will be delivered again", "held_for", time.Since(s.heldSince), "err", s.publishErr)
		} else {
			log().Warn("publish result; the job will be delivered again", "err", s.publishErr)
		}
		if j.delivered == uint64(w.maxDeliver) && w.stopping() && !w.natsDown() && !deadLetter(j.result) {
			// Its last delivery to be worked on, let go as the worker stops (the stream could
			// not store its result within the grace period): a nak would leave the server only
			// the delivery kept for its dead letter, though the job never failed. The puller
			// is closed by now, as handle waits for before a hand-back. (With the connection
			// down, the publish would only wait out its timeout, job after job.) A job that
			// ran out of deliveries goes back as it is: the delivery kept for its dead letter
			// stores that, where publishing it again would give it all its tries again.
			if err := w.publishAgain(context.Background(), s.msg, log); err != nil {
				log().Warn("settle job message", "err", err)
			}
		} else {
			_ = s.msg.NakWithDelay(time.Second)
		}
	} else {
		if s.settleErr != nil {
			log().Warn("settle job message", "err", s.settleErr)
		}
		if j.result != nil && !s.another {
			w.metrics.finished(j.result, time.Since(j.start))
		}
	}
	j.mem.release()
	w.free(j.reservation)
	w.keep(s)
}

// deadLetter reports whether res is a dead letter's result.
func deadLetter(res *jobs.Result) bool {
	return res != nil && res.Error != nil && res.Error.Code == jobs.CodeDeadLetter
}

// stopping reports whether Run has stopped pulling (and closed its puller): the worker is
// stopping. It runs on the settler's goroutine, for jobs pulled after pullDone was made.
func (w *Worker) stopping() bool {
	select {
	case <-w.pullDone:
		return true
	default:
		return false
	}
}

// holding counts the jobs whose results the settler holds, for the metrics and AskHeld. They
// are kept alive (InProgress) meanwhile, as every job is until it is settled.
func (w *Worker) holding(_ *settlement, held bool) {
	if held {
		w.resultsHeld.Add(1)
	} else {
		w.resultsHeld.Add(-1)
	}
}

// heldReport says what the worker holds because the results stream refuses it (AskHeld's
// answer), and false when it holds nothing.
func (w *Worker) heldReport() (queue.HeldReport, bool) {
	n, r := w.resultsHeld.Load(), w.settler.refusing.Load()
	if n <= 0 || r == nil {
		return queue.HeldReport{}, false
	}
	return queue.HeldReport{Host: w.host, Held: int(n), For: time.Since(r.since), Full: queue.StoreFull(r.err), Error: r.err.Error()}, true
}

// free gives back a job's dispatch reservation and its job slot.
func (w *Worker) free(r *dispatch.Reservation) {
	r.Release()
	<-w.slots
}

// freeSettlement returns a kept settlement, or a new one.
func (w *Worker) freeSettlement() *settlement {
	select {
	case s := <-w.settlements:
		return s
	default:
		return &settlement{}
	}
}

// keep holds on to s, and its buffers, for a next job. A settlement of every job slot is kept
// at most; a rare huge result's buffer is not.
func (w *Worker) keep(s *settlement) {
	s.msg, s.job = nil, finishedJob{}
	if s.result != nil {
		// A compressed result's data is a buffer of its own, which its memory charge, ended
		// now, counted: kept with up to Concurrency settlements, it would be held uncharged.
		s.result.Data = nil
	}
	if cap(s.buf) > maxKeptBuffer {
		s.buf = nil
	}
	select {
	case w.settlements <- s:
	default:
	}
}

// reclaimed says msg is a job that queue.Reclaim made deliverable again
// (Config.ReclaimedThrough): a first delivery again, whose result may be stored already.
func (w *Worker) reclaimed(msg jetstream.Msg) bool {
	if w.cfg.ReclaimedThrough == 0 {
		return false
	}
	seq, ok := queue.StreamSeq(msg)
	return !ok || seq <= w.cfg.ReclaimedThrough
}

// work decides the outcome of one delivery. A panic while working it (a tinkerfleet bug, met
// perhaps on this job's input only) ends the job with an internal error result instead of the
// worker: a crash would drop every job the worker holds, and the job, delivered again, would
// crash the next worker too, or, under submit --local, every run of the batch.
func (w *Worker) work(ctx context.Context, msg jetstream.Msg, batch, customID string, delivered uint64, r *dispatch.Reservation) (out outcome) {
	var job jobs.Job // as far as it is decoded, for the result of a panic
	defer func() {
		if p := recover(); p != nil {
			out = w.panicked(job, batch, customID, delivered, p)
		}
	}()
	if w.maxDeliver > 0 && delivered > uint64(w.maxDeliver) {
		return w.outOfDeliveries(ctx, msg, batch, customID)
	}
	job, err := decodeJob(msg.Headers(), msg.Data())
	if customID == "" {
		// A message without the custom id header (published by another client than submit):
		// its job is named by its line's custom_id. Named "", the results of all such jobs of
		// a batch had one subject, where the stream kept the first and refused the others.
		if customID = job.CustomID; customID == "" {
			w.jobLog(batch, customID, delivered).Error("job message with no custom id, in its header or a payload that decodes: dropping it", "err", err)
			return outcome{settle: settleTerm}
		}
	}
	invalid := jobs.Job{CustomID: customID, Format: job.Format}
	if err == nil {
		// A job that decoded but is invalid (for this worker's limits) keeps its format (OpenAI
		// lines get OpenAI results) and its metadata, which decoding checked is JSON.
		invalid.Metadata = job.Metadata
		err = job.Validate(w.cfg.Limits)
	}
	if err != nil {
		res := errorResult(invalid, batch, jobs.ResultError{
			Code: jobs.CodeInvalidJob, Message: err.Error(), Category: jobs.CategoryUser,
		})
		return outcome{result: &res, settle: settleTerm}
	}
	if job.CustomID != customID {
		// Named by the header, as the message is everywhere else: named by its line's
		// custom_id, the result took the subject of that job, whose own result the stream
		// then refused.
		invalid.Model, invalid.ModelPath = job.Model, job.ModelPath
		res := errorResult(invalid, batch, jobs.ResultError{
			Code: jobs.CodeInvalidJob, Message: "custom_id does not match the message header", Category: jobs.CategoryUser,
		})
		return outcome{result: &res, settle: settleTerm}
	}

	// A job delivered again, published again by a resumed submit, or reclaimed from a run
	// that stopped, may have a result already (its worker died between storing it and the
	// ack): never sample it twice. A first delivery of a first publish cannot, and skips the
	// lookup.
	if delivered > 1 || msg.Headers().Get(queue.HeaderRepublished) != "" || w.reclaimed(msg) {
		done, err := w.cfg.Queue.HasResult(ctx, batch, job.CustomID)
		if err != nil {
			return transient(err)
		}
		if done {
			return outcome{settle: settleAck}
		}
	}
	if w.cancelled.has(batch) {
		return cancelled(job, batch)
	}
	return w.sample(ctx, msg, job, batch, r)
}

// decodeJob decodes the payload of a job message, data, with its header h: the job's line as
// submit publishes it (queue.PublishJobAsync), never compressed. A payload that does not decode
// and is compressed (by another publisher, marked by a Content-Encoding header as large results
// are, or told by its first bytes) is refused for that: its error named the byte that is no
// UTF-8, which said nothing of the cause.
func decodeJob(h nats.Header, data []byte) (jobs.Job, error) {
	job, err := jobs.DecodeJob(data)
	if err == nil {
		return job, nil
	}
	enc := h.Get(queue.HeaderContentEncoding)
	kind := compressedAs(data)
	switch {
	case kind != "" && enc != "":
		return job, fmt.Errorf("decode job: the message is compressed with %s (Content-Encoding %q), and job messages are not compressed: publish the job line as it is", kind, enc)
	case kind != "":
		return job, fmt.Errorf("decode job: the message is compressed with %s, and job messages are not compressed: publish the job line as it is", kind)
	case enc != "":
		return job, fmt.Errorf("decode job: the message says Content-Encoding %q, and job messages are not compressed: publish the job line as it is (%w)", enc, err)
	}
	return job, err
}

// compressedAs is the compression that data begins like, by its magic number: "zstd" (a frame,
// or a skippable frame, as pzstd writes first), "gzip", or "" for neither. Neither can begin a
// JSON text.
func compressedAs(data []byte) string {
	switch {
	case len(data) >= 4 && (string(data[:4]) == "\x28\xb5\x2f\xfd" || data[0]&0xf0 == 0x50 && string(data[1:4]) == "\x2a\x4d\x18"):
		return "zstd"
	case len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b:
		return "gzip"
	}
	return ""
}

// panicked is the outcome of a job whose work panicked with p: an internal error result, and
// the stack in the log. Called from the deferred recover, while the stack still shows where.
// job is what work had decoded of the job (nothing, when decoding panicked), so that the
// result keeps its format and metadata: the job is not decoded again, which may panic again.
func (w *Worker) panicked(job jobs.Job, batch, customID string, delivered uint64, p any) outcome {
	w.jobLog(batch, customID, delivered).Error("job panicked: a tinkerfleet bug; the job ends with an internal error result and the worker goes on",
		"panic", p, "stack", string(debug.Stack()))
	w.metrics.panicked()
	if job.CustomID == "" {
		job.CustomID = customID
	}
	res := errorResult(job, batch, jobs.ResultError{
		Code:     jobs.CodeInternal,
		Message:  fmt.Sprintf("tinkerfleet bug: the worker panicked on this job (%s); the worker's log has the stack", panicText(p)),
		Category: jobs.CategoryUnknown,
	})
	return outcome{result: &res, settle: settleTerm}
}

// panicText is p as text for a result: at most maxPanicText bytes (a panic value may be any
// size), cut between characters (the bytes of one cut in two are dropped).
func panicText(p any) string {
	text := fmt.Sprint(p)
	if len(text) <= maxPanicText {
		return text
	}
	return strings.ToValidUTF8(text[:maxPanicText], "") + "…"
}

// maxPanicText bounds panicText.
const maxPanicText = 300

// cancelled is the outcome of a job of a cancelled batch: a cancelled result, not sampled.
func cancelled(job jobs.Job, batch string) outcome {
	res := errorResult(job, batch, jobs.ResultError{
		Code: jobs.CodeCancelled, Message: errBatchCancelled.Error(), Category: jobs.CategoryUser,
	})
	res.Status = jobs.StatusCancelled
	return outcome{result: &res, settle: settleAck}
}

// sample turns a valid job, delivered in msg, into a Tinker sample and its result.
func (w *Worker) sample(ctx context.Context, msg jetstream.Msg, job jobs.Job, batch string, r *dispatch.Reservation) outcome {
	keysTaken := w.keysTaken.Load() // to tell a refusal of a key replaced since (refused)
	spec := tinker.SamplerSpec{BaseModel: job.Model, ModelPath: job.ModelPath}
	sampler, baseModel, err := w.samplers.get(ctx, spec)
	if err != nil {
		return w.failure(ctx, job, batch, keysTaken, err)
	}
	prompt, stops, tok, err := w.prompt(ctx, job, baseModel)
	if err != nil {
		if transientTokenizerError(err) {
			return transient(err) // e.g. the hub is unreachable for a moment
		}
		res := errorResult(job, batch, jobs.ResultError{Code: jobs.CodeTokenize, Message: err.Error(), Category: jobs.CategoryUser})
		return outcome{result: &res, settle: settleTerm}
	}
	params := toTinkerParams(job.Params)
	stop := SampleStop(job.Params.Stop, stops, tok)
	params.Stop = tinker.Stop{Strings: stop.Strings, Tokens: stop.TokenIDs}
	if maxCtx, err := w.models.maxContext(ctx, baseModel); err == nil && maxCtx > 0 {
		want := len(prompt)
		if job.Params.MaxTokens != nil {
			want += *job.Params.MaxTokens
		}
		if want > maxCtx {
			res := errorResult(job, batch, jobs.ResultError{
				Code: jobs.CodeContextTooLong,
				Message: fmt.Sprintf("prompt of %d tokens plus max_tokens exceeds the context window of %s (%d tokens)",
					len(prompt), baseModel, maxCtx),
				Category: jobs.CategoryUser,
			})
			return outcome{result: &res, settle: settleTerm}
		}
	}
	if left := time.Until(w.backoff.Until()); left > w.cfg.NakAbove && queue.NumDelivered(msg) < uint64(w.maxDeliver) {
		// A long pause (billing, a paused queue): leave the job in the stream, not in memory,
		// but on its last delivery, which a nak would make a dead letter.
		return outcome{settle: settleRetry, delay: left, err: errBackingOff}
	}
	end := w.gate.batchEnd(batch)
	mem, err := w.memory.reserve(ctx, w.gate.capacity.stopping, &end, int64(certainCells(job, len(prompt)))*decodedCellBytes)
	end.release()
	if err != nil {
		switch {
		case errors.Is(err, errBatchCancelled):
			return cancelled(job, batch)
		case errors.Is(err, errStopping):
			return outcome{settle: settleNak} // to another worker, now
		}
		return w.failure(ctx, job, batch, keysTaken, err)
	}

	st := &sampleState{reservation: r, batch: batch, msg: msg}
	kept := false // the result, and its memory charge, go to the outcome
	defer func() {
		if !kept { // a failure, or a panic (see work): give back what the sample held
			w.gate.capacity.done(&st.sample)
			mem.release()
		}
	}()
	sctx := withSampleState(ctx, st)
	req := tinker.SampleRequest{
		Prompt:             tinker.EncodedText(prompt),
		NumSamples:         job.NumSamples,
		Params:             params,
		PromptLogprobs:     job.PromptLogprobs,
		TopKPromptLogprobs: job.TopKPromptLogprobs,
	}
	res, err := sampler.Sample(sctx, req)
	if samplerLost(err) {
		// The service no longer knows the sampling session (it restarted, or ended the
		// session): the job is not at fault. Once more, in a new one; the client makes a new
		// session too if it must.
		w.samplers.drop(spec, sampler)
		w.samplerStates.forget(sampler.ID())
		if sampler, _, err = w.samplers.get(sctx, spec); err == nil {
			res, err = sampler.Sample(sctx, req)
		}
	}
	if err == nil {
		w.samplerStates.sampled(sampler.ID())
		if w.sampled != nil {
			w.sampled(job)
		}
	}
	w.gate.capacity.done(&st.sample)
	if errors.Is(err, tinker.ErrFutureTimeout) {
		return transient(fmt.Errorf("no result %s after the service accepted the sample: it may have lost it (worker --sample-timeout)", w.cfg.SampleTimeout))
	}
	if samplerLost(err) && ctx.Err() == nil {
		return transient(err) // even a new sampling session was not known: try again later
	}
	if err != nil {
		switch {
		case errors.Is(err, errBatchCancelled):
			return cancelled(job, batch)
		case errors.Is(err, errStopping):
			return outcome{settle: settleNak} // to another worker, now
		case errors.Is(err, errGivenOut):
			return outcome{settle: settleLeave}
		}
		return w.failure(ctx, job, batch, keysTaken, err)
	}
	cells := replyCells(res.Response)
	// Back, the reply holds its numbers decoded while it waits to grow: charged meanwhile, or
	// every job slot's reply could wait so beside a full budget, uncharged.
	mem.resize(max(mem.n, int64(cells)*decodedCellBytes))
	if job.OpenAILogprobs {
		cells += sampledTokens(res.Response) // each token's bytes beside it (okResult)
	}
	if err := mem.grow(ctx, int64(cells)*resultCellBytes); err != nil {
		return w.failure(ctx, job, batch, keysTaken, err)
	}
	result := okResult(job, batch, res, len(prompt), tok, params.Stop)
	kept = true
	return outcome{result: &result, settle: settleAck, mem: mem, cells: cells}
}

// samplerLost reports whether err is an asample 404: the service does not know the sampling
// session (§3.6), which no job can cause.
func samplerLost(err error) bool {
	if err == nil {
		return false // the common case, without errors.As's allocation
	}
	var se *tinker.StatusError
	return errors.As(err, &se) && se.Endpoint == "asample" && se.StatusCode == http.StatusNotFound
}

// DefaultSampleTimeout is Config.SampleTimeout's default: far beyond the longest sample the
// service runs, so that only a future it lost reaches it.
const DefaultSampleTimeout = 30 * time.Minute

// failure classifies a sampling error into a permanent error result or a retry. keysTaken is
// Worker.keysTaken when the job's sample began.
func (w *Worker) failure(ctx context.Context, job jobs.Job, batch string, keysTaken uint64, err error) outcome {
	if ctx.Err() != nil {
		return outcome{settle: settleNak, err: err}
	}
	var failed *tinker.RequestFailedError
	if errors.As(err, &failed) {
		if failed.Category == tinker.CategoryUser {
			res := errorResult(job, batch, jobs.ResultError{
				Code: jobs.CodeFailedFuture, Message: failed.Message, Category: jobs.CategoryUser,
			})
			res.Attempts = tinker.AttemptsOf(err)
			return outcome{result: &res, settle: settleTerm}
		}
		return transient(err)
	}
	if tinker.CredentialRefused(err) {
		return w.refused(ctx, job, batch, keysTaken, err)
	}
	var status *tinker.StatusError
	if errors.As(err, &status) {
		switch status.StatusCode {
		case 400, 404, 422:
			res := errorResult(job, batch, jobs.ResultError{
				Code: jobs.CodeAPIError, Message: err.Error(), Category: jobs.CategoryUser,
			})
			res.Attempts = tinker.AttemptsOf(err)
			return outcome{result: &res, settle: settleTerm}
		}
	}
	return transient(err)
}

// retryDelay is how long a job waits before its next delivery after a transient failure on
// delivery n: RetryDelay doubled per delivery, at most 5 minutes.
func (w *Worker) retryDelay(n uint64) time.Duration {
	d := w.cfg.RetryDelay
	for i := uint64(1); i < n && d < 5*time.Minute; i++ {
		d *= 2
	}
	return min(d, 5*time.Minute)
}

// transientTokenizerError tells a tokenizer that could not be fetched right now (a network
// error, or a load cut off: the registry shares one load among the jobs that need it) from
// one that cannot be had (not found, unauthorized, not a tokenizer tinkerfleet can use, unknown
// chat format).
func transientTokenizerError(err error) bool {
	var tokErr *tokenizerError
	if !errors.As(err, &tokErr) {
		return false
	}
	return !errors.Is(err, tokenizer.ErrNotFound) && !errors.Is(err, tokenizer.ErrUnauthorized) &&
		!errors.Is(err, tokenizer.ErrUnsupported)
}

// tokenizerError marks a failure to obtain a tokenizer (as opposed to using one).
type tokenizerError struct{ err error }

func (e *tokenizerError) Error() string { return e.err.Error() }
func (e *tokenizerError) Unwrap() error { return e.err }

// transient is a failure worth another delivery, after the worker's growing retry delay.
func transient(err error) outcome {
	return outcome{settle: settleRetry, err: err}
}

// prompt returns the prompt tokens of job, the default stop tokens of its chat format (for
// messages jobs) and the tokenizer to decode samples with (nil when none is available).
func (w *Worker) prompt(ctx context.Context, job jobs.Job, baseModel string) ([]int, []int, *tokenizer.Tokenizer, error) {
	var tok *tokenizer.Tokenizer
	var tokErr error
	if w.cfg.Tokenizers == nil {
		tokErr = fmt.Errorf("no tokenizer registry configured: %w", tokenizer.ErrNotFound)
	} else {
		tok, tokErr = w.cfg.Tokenizers.ForModel(ctx, baseModel)
	}
	switch {
	case len(job.PromptTokens) > 0:
		return job.PromptTokens, nil, tok, nil // text of samples is best effort here
	case tokErr != nil:
		return nil, nil, nil, &tokenizerError{fmt.Errorf("tokenizer for %s: %w", baseModel, tokErr)}
	}
	ids, stops, err := PromptTokens(job, baseModel, tok)
	return ids, stops, tok, err
}

// PromptTokens returns the prompt tokens a worker samples job with on baseModel, whose
// tokenizer is tok: its token ids as given, its messages rendered with the model's chat
// template (with that template's stop tokens), or its text encoded as HF's encode(text) does
// by default, which Tinker's documentation samples with: with the special tokens the
// tokenizer adds around a text (a beginning-of-text token for some models, none for Qwen).
func PromptTokens(job jobs.Job, baseModel string, tok *tokenizer.Tokenizer) (ids, stops []int, err error) {
	switch {
	case len(job.PromptTokens) > 0:
		return job.PromptTokens, nil, nil
	case len(job.Messages) > 0:
		renderer, err := tokenizer.RendererFor(baseModel, tok, tokenizer.RenderOptions{
			Thinking: job.Thinking, ReasoningEffort: job.ReasoningEffort})
		if err != nil {
			return nil, nil, err
		}
		msgs := make([]tokenizer.Message, len(job.Messages))
		for i, m := range job.Messages {
			msgs[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
		}
		ids, err := renderer.Render(msgs)
		if err != nil {
			return nil, nil, fmt.Errorf("render chat for %s: %w", baseModel, err)
		}
		return ids, renderer.StopTokens(), nil
	default:
		return tok.EncodeAddingSpecialTokens(job.Prompt), nil, nil
	}
}

// SampleStop returns the stop condition a job is sampled with: its own stop strings or token
// ids, with the stop tokens of its chat template (templateStops, from PromptTokens) beside
// them. A chat's turn ends at its end-of-turn token whatever else the job stops at, as an
// OpenAI or vLLM stop adds to the end of the turn; a job's "stop": ["\n\n"] had replaced
// them, and the sample ran on past <|im_end|> into turns nobody asked for. The request takes
// strings or ids, not both (wire protocol T2), so beside strings the template's tokens go as
// their text, as §3.6's example sends "<|im_end|>".
func SampleStop(own jobs.Stop, templateStops []int, tok *tokenizer.Tokenizer) jobs.Stop {
	switch {
	case len(templateStops) == 0:
		return own
	case len(own.Strings) > 0:
		stop := jobs.Stop{Strings: slices.Clone(own.Strings)}
		for _, id := range templateStops {
			if text := tok.Decode([]int{id}); text != "" && !slices.Contains(stop.Strings, text) {
				stop.Strings = append(stop.Strings, text)
			}
		}
		return stop
	}
	stop := jobs.Stop{TokenIDs: slices.Clone(own.TokenIDs)}
	for _, id := range templateStops {
		if !slices.Contains(stop.TokenIDs, id) {
			stop.TokenIDs = append(stop.TokenIDs, id)
		}
	}
	return stop
}

// encodeResult encodes res into s.buf and fills s.result with the message that stores it;
// cells, the numbers res carries (0 when few or not counted), sizes the buffer once. A
// result too large for the server even compressed, or for its readers (queue.MaxResultBytes),
// is replaced by an error result saying so, so that the job still ends with exactly one
// result.
func (w *Worker) encodeResult(batch string, res *jobs.Result, cells int, s *settlement) error {
	buf := s.buf[:0]
	if size := cells * jsonCellBytes; size > cap(buf) {
		// A large result: grown by doubling, its buffer was allocated five times over (49 MB
		// for the 9 MB of JSON of 25,000 prompt tokens' top-20 logprobs; sized once, 9 MB).
		buf = make([]byte, 0, size+1024)
	}
	data, err := res.AppendJSON(buf)
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	s.buf = data
	var tokens queue.Tokens
	if u := res.Usage; u != nil {
		tokens = queue.Tokens{Prompt: u.PromptTokens, Completion: u.CompletionTokens, CacheHit: u.CacheHitTokens}
	}
	msg, err := w.cfg.Queue.ResultMsg(s.result, w.codec, batch, res.CustomID, string(res.Status), tokens, data, w.maxPayload)
	if !errors.Is(err, queue.ErrTooLarge) {
		s.result = msg
		if err == nil && cap(s.buf) > maxKeptBuffer && msg.Header.Get(queue.HeaderContentEncoding) != "" {
			s.buf = nil // compressed: the message holds its own copy, and the JSON need not wait
		}
		return err
	}
	why := fmt.Sprintf("does not fit the NATS max payload (%d bytes)", w.maxPayload)
	if len(data) > queue.MaxResultBytes {
		why = fmt.Sprintf("is over the %d bytes a reader of results decodes", queue.MaxResultBytes)
	}
	small := errorResult(jobs.Job{CustomID: res.CustomID, Model: res.Model, Format: res.Format, Metadata: res.Metadata}, batch, jobs.ResultError{
		Code:     jobs.CodeInternal,
		Message:  fmt.Sprintf("the result (%d bytes) %s", len(data), why),
		Category: jobs.CategoryUser,
	})
	small.Attempts, small.LatencyMS = res.Attempts, res.LatencyMS
	*res = small
	if data, err = res.AppendJSON(data[:0]); err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	s.buf = data
	s.result, err = w.cfg.Queue.ResultMsg(s.result, w.codec, batch, res.CustomID, string(res.Status), queue.Tokens{}, data, w.maxPayload)
	return err
}

// publish stores one result outside the settler's groups (the dead-letter advisory path)
// and waits for the stream's ack. first is false when the job had a result already.
func (w *Worker) publish(ctx context.Context, batch string, res *jobs.Result) (first bool, err error) {
	var s settlement
	if err := w.encodeResult(batch, res, 0, &s); err != nil {
		return false, err
	}
	return w.cfg.Queue.PublishResult(ctx, s.result)
}

// maxKeptBuffer is the largest encode buffer a job handler keeps for its next job.
const maxKeptBuffer = 64 << 10

func errorResult(job jobs.Job, batch string, e jobs.ResultError) jobs.Result {
	return jobs.Result{
		CustomID: job.CustomID,
		BatchID:  batch,
		Status:   jobs.StatusError,
		Model:    modelName(job),
		Format:   jobs.ResultFormat(job.Format),
		Error:    &e,
		Metadata: job.Metadata,
	}
}

func okResult(job jobs.Job, batch string, res *tinker.SampleResult, promptLen int, tok *tokenizer.Tokenizer, stop tinker.Stop) jobs.Result {
	out := jobs.Result{
		CustomID: job.CustomID,
		BatchID:  batch,
		Status:   jobs.StatusOK,
		Model:    modelName(job),
		Format:   jobs.ResultFormat(job.Format),
		Attempts: res.Attempts,
		Metadata: job.Metadata,
		Usage:    &jobs.Usage{PromptTokens: promptLen, CacheHitTokens: res.Response.PromptCacheHitTokens},
	}
	for _, seq := range res.Response.Sequences {
		s := jobs.Sample{Tokens: seq.Tokens, Logprobs: seq.Logprobs, StopReason: string(seq.StopReason)}
		if s.Tokens == nil {
			s.Tokens = []int{} // a sample of no tokens: [] as the result schema says, not null
		}
		if tok != nil {
			s.Text = completionText(tok, seq, stop)
			if job.OpenAILogprobs { // the one cost to jobs that did not ask: this test
				s.TokenBytes = tokenBytes(tok, s.Tokens)
			}
		}
		out.Usage.CompletionTokens += len(seq.Tokens)
		out.Samples = append(out.Samples, s)
	}
	out.OpenAILogprobs = job.OpenAILogprobs
	if job.PromptLogprobs {
		out.PromptLogprobs = res.Response.PromptLogprobs
	}
	if job.TopKPromptLogprobs > 0 {
		out.TopKPromptLogprobs = make([][]jobs.TokenLogprob, len(res.Response.TopKPromptLogprobs))
		for i, row := range res.Response.TopKPromptLogprobs {
			if row == nil {
				continue
			}
			cells := make([]jobs.TokenLogprob, len(row))
			for k, c := range row {
				cells[k] = jobs.TokenLogprob{Token: c.Token, Logprob: c.Logprob}
			}
			out.TopKPromptLogprobs[i] = cells
		}
	}
	return out
}

// tokenBytes returns the bytes of each of ids, which the OpenAI-format line of a job that
// asked for logprobs needs (jobs.Result.AppendOpenAI), in one buffer.
func tokenBytes(tok *tokenizer.Tokenizer, ids []int) jobs.TokenBytes {
	ends := make([]int, len(ids))
	buf := make([]byte, 0, 4*len(ids))
	for i, id := range ids {
		buf = tok.AppendTokenBytes(buf, id)
		ends[i] = len(buf)
	}
	out := make(jobs.TokenBytes, len(ids))
	start := 0
	for i, end := range ends {
		out[i] = buf[start:end:end]
		start = end
	}
	return out
}

// completionText decodes a sequence, leaving out the stop token or stop string that ended it
// (as the OpenAI API does); the tokens keep it.
func completionText(tok *tokenizer.Tokenizer, seq tinker.SampledSequence, stop tinker.Stop) string {
	ids := seq.Tokens
	if seq.StopReason == tinker.StopReasonStop && len(ids) > 0 {
		for _, s := range stop.Tokens {
			if ids[len(ids)-1] == s {
				ids = ids[:len(ids)-1]
				break
			}
		}
	}
	text := tok.Decode(ids)
	if seq.StopReason == tinker.StopReasonStop {
		for _, s := range stop.Strings {
			if cut, ok := strings.CutSuffix(text, s); ok {
				return cut
			}
		}
	}
	return text
}

func modelName(job jobs.Job) string {
	if job.ModelPath != "" {
		return job.ModelPath
	}
	return job.Model
}

func toTinkerParams(p jobs.SamplingParams) tinker.SamplingParams {
	return tinker.SamplingParams{
		MaxTokens:   p.MaxTokens,
		Seed:        p.Seed,
		Stop:        tinker.Stop{Strings: p.Stop.Strings, Tokens: p.Stop.TokenIDs},
		Temperature: p.Temperature,
		TopK:        p.TopK,
		TopP:        p.TopP,
	}
}

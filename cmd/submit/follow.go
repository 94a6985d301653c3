package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// progressOptions say how progress is shown.
type progressOptions struct {
	mode     string
	interval time.Duration
	// local, if not nil, is the worker of submit --local: progress names the results it
	// cannot store when results stop coming.
	local *inProcess
}

// inProcess is the worker that submit --local runs in its own process.
type inProcess struct {
	held    func() int  // results it cannot store now
	opening func() bool // it is still opening its Tinker session
	dataDir string      // the embedded server's data directory
}

func (o *progressOptions) register(s *envflag.Set) {
	s.String(&o.mode, "progress", "TINKERFLEET_PROGRESS", "auto", "auto (a bar on a terminal, lines otherwise), bar, lines or none")
	s.PositiveDuration(&o.interval, "progress-interval", "TINKERFLEET_PROGRESS_INTERVAL", 10*time.Second, "time between progress lines when not on a terminal, and without a result before progress says why")
}

// style says how progress in mode o shows on env's standard error: not at all (none), or
// as a line drawn in place (redraw: bar, or auto on a terminal) rather than lines printed.
func (o progressOptions) style(env *environment) (none, redraw bool) {
	switch o.mode {
	case "none":
		return true, false
	case "bar":
		return false, true
	case "lines":
		return false, false
	}
	return false, isTerminal(env)
}

// check reports a --progress value that is not one of the four.
func (o progressOptions) check() error {
	switch o.mode {
	case "auto", "bar", "lines", "none":
		return nil
	}
	return fmt.Errorf("--progress (or TINKERFLEET_PROGRESS) %q: must be auto, bar, lines or none: %w", o.mode, errUsage)
}

// resultFormat says in which format result lines are written (--result-format).
type resultFormat string

// The values of --result-format.
const (
	// resultAuto writes the results of jobs given as OpenAI Batch API lines as OpenAI Batch
	// output lines, and the others as tinkerfleet result lines.
	resultAuto resultFormat = "auto"
	// resultNative writes every result as a tinkerfleet result line (schemas/result.schema.json).
	resultNative resultFormat = "native"
	// resultOpenAI writes every result as an OpenAI Batch output line (jobs.Result.AppendOpenAI).
	resultOpenAI resultFormat = "openai"
)

// registerResultFormat defines --result-format; parseResultFormat checks its value.
func registerResultFormat(s *envflag.Set, p *string) {
	s.String(p, "result-format", "TINKERFLEET_RESULT_FORMAT", string(resultAuto),
		"format of the result lines: auto (OpenAI Batch output lines for the jobs given as OpenAI batch lines, tinkerfleet lines for the others), native (tinkerfleet lines only) or openai (OpenAI Batch output lines only)")
}

// parseResultFormat reads the value of --result-format.
func parseResultFormat(v string) (resultFormat, error) {
	switch f := resultFormat(v); f {
	case resultAuto, resultNative, resultOpenAI:
		return f, nil
	}
	return "", fmt.Errorf("--result-format (or TINKERFLEET_RESULT_FORMAT) %q: must be auto, native or openai: %w", v, errUsage)
}

// resultLine appends to dst the output line (without newline) of the stored result data of
// job key of batch, in format f; created is when the result was stored, the "created" of
// OpenAI lines, so that writing a result again gives the same line.
func resultLine(dst, data []byte, created time.Time, f resultFormat, batch string, key queue.JobKey) ([]byte, error) {
	if f == resultNative || (f == resultAuto && jobs.FormatOfResult(data) == "") {
		// Byte for byte, as the worker wrote it, and so only a line that a resume reads back
		// as this job's result: a stored payload of two lines, or with garbage after it (of
		// another client, or a bug) would make it refuse the file, or write a line twice.
		if id, b, ok := jobs.ResultLineIDs(data); !ok || b != batch || queue.JobKeyOf(id) != key {
			return nil, errNotResultLine
		}
		return append(dst, data...), nil
	}
	// Read in place (jobs.AppendOpenAIFromJSON): decoded whole, a result of queue.MaxResultBytes
	// took GiBs.
	out, id, b, err := jobs.AppendOpenAIFromJSON(dst, data, created)
	if err != nil {
		return nil, err
	}
	if b != batch || queue.JobKeyOf(id) != key {
		return nil, errNotResultLine // its line's id would be another batch's, or job's
	}
	return out, nil
}

// summary counts the results of a batch by status.
type summary struct {
	ok, failed, cancelled int
	tokens                queue.Tokens // of the ok results
}

func (s summary) total() int { return s.ok + s.failed + s.cancelled }

// add counts a result of status that used tokens.
func (s *summary) add(status string, tokens queue.Tokens) {
	s.tokens.Add(tokens)
	switch status {
	case "ok":
		s.ok++
	case "cancelled":
		s.cancelled++
	default:
		s.failed++
	}
}

// tokensPhrase says how many tokens t counts: "1200 prompt tokens (300 cached), 5000
// sampled".
func tokensPhrase(t queue.Tokens) string {
	cached := ""
	if t.CacheHit > 0 {
		cached = fmt.Sprintf(" (%d cached)", t.CacheHit)
	}
	return fmt.Sprintf("%d prompt tokens%s, %d sampled", t.Prompt, cached, t.Completion)
}

// tokensNote is tokensPhrase to end a summary line, or nothing when no token is counted (no
// ok result, or results of workers of an earlier version).
func tokensNote(t queue.Tokens) string {
	if t == (queue.Tokens{}) {
		return ""
	}
	return "; " + tokensPhrase(t)
}

// followToFile follows the results into the JSONL file at path, in format f. A result already
// in the file (in either format) is not written again, so an interrupted run resumes by
// appending what is missing.
func followToFile(ctx context.Context, q *queue.Queue, m queue.Manifest, path string, f resultFormat, wait bool, po progressOptions, env *environment) (summary, error) {
	seen := map[queue.JobKey]bool{}
	var sum summary
	out, created, err := openOutput(path, m.BatchID, seen, &sum)
	if err != nil {
		return sum, err
	}
	sum, err = followInto(ctx, q, m, path, out, f, seen, sum, wait, po, env)
	if created && err != nil { // stopped before its first result: no empty file left, as submit -o
		removeIfEmpty(path)
	}
	return sum, err
}

// followInto is followToFile on the file at path that openOutput opened as out, finding the
// results in seen, counted in sum. It closes out.
func followInto(ctx context.Context, q *queue.Queue, m queue.Manifest, path string, out *outputFile, f resultFormat, seen map[queue.JobKey]bool, sum summary, wait bool, po progressOptions, env *environment) (summary, error) {
	got, err := followFrom(ctx, q, m, out, f, seen, sum, wait, po, env)
	if cerr := out.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("%w: %s: %w", errWrite, path, cerr)
	}
	if errors.Is(err, errWrite) {
		err = fmt.Errorf("%w; the batch's results stay on the NATS server: once %s can be written, run the same command again to write the rest (the whole lines written so far are kept)", err, path)
	}
	return got, err
}

// errWrite marks a failure to write the results out (a full disk): the results themselves
// are still on the NATS server.
var errWrite = errors.New("write results")

// follow reads the results of a batch from the start of the results stream, writes each to
// out in format f (out nil: count them only, reading headers), shows progress, and returns once
// every job of m has a result, or, with wait false, once it has read what is stored now.
func follow(ctx context.Context, q *queue.Queue, m queue.Manifest, out io.Writer, f resultFormat, wait bool, po progressOptions, env *environment) (summary, error) {
	return followFrom(ctx, q, m, out, f, map[queue.JobKey]bool{}, summary{}, wait, po, env)
}

// idleWait is how long the reader waits for the next result before it flushes the output and
// shows progress.
const idleWait = time.Second

// goneLook is how often a reader that waits, and gets no result, asks whether the results it
// waits for are gone: its batch deleted (submit delete), or the results it lacks lost
// (lostResults). They would then never come.
const goneLook = 3 * time.Second

// flushEvery is how often the output is flushed while results come in, so that a reader of
// the file sees them within that.
const flushEvery = 100 * time.Millisecond

// followFrom is follow for a reader that already holds the results in seen (job keys),
// counted in sum.
func followFrom(ctx context.Context, q *queue.Queue, m queue.Manifest, w io.Writer, f resultFormat, seen map[queue.JobKey]bool, sum summary, wait bool, po progressOptions, env *environment) (_ summary, err error) {
	var out *bufio.Writer
	flush := func() error { // what out holds, readable in w
		if err := out.Flush(); err != nil {
			return err
		}
		if f, ok := w.(interface{ Flush() error }); ok {
			return f.Flush()
		}
		return nil
	}
	if w != nil {
		out = bufio.NewWriterSize(w, 256<<10)
		defer func() {
			// The last results written: a full disk must not pass for a complete file.
			if ferr := out.Flush(); err == nil && ferr != nil {
				err = fmt.Errorf("%w: %w", errWrite, ferr)
			}
		}()
	}
	codec, err := queue.NewCodec(0)
	if err != nil {
		return sum, err
	}
	defer codec.Close()

	// Reading what is stored now ends after as many results as the server counts now (results
	// are only ever added while a batch lives), or when none came for maxIdle waits in a row
	// (results that expired meanwhile; a loaded machine may take a second or two).
	const maxIdle = 5
	stored := -1
	if !wait {
		if stored, err = q.ResultsStored(ctx, m.BatchID); err != nil || stored == 0 {
			return sum, err
		}
	}
	it, err := q.ReadResults(ctx, m.BatchID, out == nil)
	if err != nil {
		return sum, err
	}
	defer it.Stop()
	stopOnCancel := context.AfterFunc(ctx, it.Stop) // Next then returns at once
	defer stopOnCancel()

	prog := newProgress(po, env, m.Jobs)
	defer prog.finish(&sum)
	var line []byte // reused for every output line
	lastFlush := time.Now()
	var lastLook time.Time     // when the server was last asked why no result comes
	var lastGoneLook time.Time // the first look is at the first wait: a batch run again may be gone
	caughtUp := prog.none      // the results stored when the reader began are read
	for read, idle := 0, 0; ; {
		if (wait && sum.total() >= m.Jobs) || (!wait && read >= stored) {
			prog.update(&sum)
			return sum, nil
		}
		msg, err := it.Next(jetstream.NextMaxWait(idleWait))
		switch {
		case ctx.Err() != nil:
			return sum, ctx.Err()
		case errors.Is(err, nats.ErrTimeout):
			if out != nil {
				if err := flush(); err != nil {
					return sum, fmt.Errorf("%w: %w", errWrite, err)
				}
			}
			if quiet := prog.quiet(); wait && !prog.none && quiet >= po.interval && time.Since(lastLook) >= po.interval {
				lastLook = time.Now()
				prog.stalled(explain(ctx, q, m, sum.total(), po.local, quiet))
			}
			if wait && time.Since(lastGoneLook) >= goneLook {
				lastGoneLook = time.Now()
				if err := resultsGone(ctx, q, m.BatchID, sum.total()); err != nil {
					return sum, err
				}
			}
			prog.update(&sum)
			if idle++; !wait && idle >= maxIdle {
				return sum, nil
			}
			continue
		case err != nil:
			return sum, fmt.Errorf("follow results: %w", err)
		}
		read, idle = read+1, 0
		prog.resumed()
		if !caughtUp {
			// The backlog is read, result by result, in the reader's first moments: the rate
			// counts from here.
			if meta, err := msg.Metadata(); err == nil && meta.NumPending == 0 {
				caughtUp = true
				prog.caughtUp()
			}
		}
		key, ok := queue.ParseJobToken(msg.Subject()[strings.LastIndexByte(msg.Subject(), '.')+1:])
		if !ok || seen[key] {
			continue // not a job's result (none but workers publish there), or one written already
		}
		seen[key] = true
		sum.add(msg.Headers().Get(queue.HeaderStatus), queue.ResultTokens(nats.Header(msg.Headers())))
		if out != nil {
			data, err := codec.Decode(nats.Header(msg.Headers()), msg.Data())
			var meta *jetstream.MsgMetadata
			if err == nil {
				meta, err = msg.Metadata()
			}
			if err == nil {
				line, err = resultLine(line[:0], data, meta.Timestamp, f, m.BatchID, key)
			}
			if err != nil {
				return sum, fmt.Errorf("result of batch %s, custom_id %s: %w", m.BatchID,
					jobs.Excerpt(queue.CustomID(nats.Header(msg.Headers()))), err)
			}
			out.Write(line)
			if err := out.WriteByte('\n'); err != nil {
				return sum, fmt.Errorf("%w: %w", errWrite, err)
			}
			if now := time.Now(); now.Sub(lastFlush) >= flushEvery {
				if err := flush(); err != nil {
					return sum, fmt.Errorf("%w: %w", errWrite, err)
				}
				lastFlush = now
			}
		}
		prog.update(&sum)
	}
}

// outputLine is what openOutput reads of a line of the output file: a tinkerfleet result line
// (custom_id, status) or an OpenAI Batch output line (id, custom_id, response, error).
type outputLine struct {
	ID       string        `json:"id"`
	CustomID string        `json:"custom_id"`
	BatchID  string        `json:"batch_id"`
	Status   string        `json:"status"`
	Usage    *queue.Tokens `json:"usage"` // tinkerfleet lines
	Response *struct {
		StatusCode int `json:"status_code"`
		Body       struct {
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				CompletionTokens    int `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		} `json:"body"`
	} `json:"response"`
	Error *struct {
		Code      string `json:"code"`
		Retryable bool   `json:"retryable"` // tinkerfleet lines only
	} `json:"error"`
}

// tokens counts the tokens of the line's result, as the worker's header did (ResultTokens):
// an ok result's usage.
func (l *outputLine) tokens(status string) queue.Tokens {
	switch {
	case status != string(jobs.StatusOK):
		return queue.Tokens{}
	case l.Usage != nil:
		return *l.Usage
	case l.Response != nil && l.Response.Body.Usage != nil:
		u := l.Response.Body.Usage
		return queue.Tokens{Prompt: u.PromptTokens, Completion: u.CompletionTokens, CacheHit: u.PromptTokensDetails.CachedTokens}
	}
	return queue.Tokens{}
}

// ofBatch returns an error unless the line is a result of batch: a tinkerfleet line by its
// batch_id, an OpenAI line by its id (jobs.OpenAIRequestID).
func (l *outputLine) ofBatch(path, batch string) error {
	switch {
	case l.Status != "" && l.BatchID == batch:
		return nil
	case l.Status == "" && l.ID == jobs.OpenAIRequestID(batch, l.CustomID):
		return nil
	}
	// The file's batch id and custom id may be anything, of any length: quoted and cut
	// unless the id is one a batch can have.
	other := "another batch"
	switch {
	case l.BatchID == "":
	case queue.ValidateBatchID(l.BatchID) == nil:
		other = "batch " + l.BatchID
	default:
		other = "batch " + jobs.Excerpt(l.BatchID)
	}
	return fmt.Errorf("%s holds results of %s (custom_id %s), not of batch %s: give this batch another -o file, or move that one away: %w",
		path, other, jobs.Excerpt(l.CustomID), batch, errOtherBatch)
}

// removeIfEmpty removes the file at path if it is empty: an output file that a run created
// and then ended before writing to (the run was refused, or stopped first).
func removeIfEmpty(path string) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer f.Close()
	// Under the output's lock: another process may have opened the file since this one let
	// it go, and writes to it now.
	if !lockOutput(f) || !isPath(f, path) {
		return
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && fi.Size() == 0 {
		_ = os.Remove(path)
	}
}

// errOtherBatch is the error of an output file that holds another batch's results.
var errOtherBatch = errors.New("the output file belongs to another batch")

// errNotResultLine is resultLine's error for a stored result that is not one line of one JSON
// object, starting with its custom_id, of its own job and batch (jobs.ResultLineIDs): not
// written, since the output file would not read back.
var errNotResultLine = errors.New("the stored result is not one JSON line of this job's result, as a worker writes one (another client's, or a bug's): not written, since the output file would not read back")

// parseOutputLine reads a line of an output file and its result status; ok is false when the
// line is not a result.
func parseOutputLine(line []byte) (r outputLine, status string, ok bool) {
	if json.Unmarshal(line, &r) != nil {
		return r, "", false
	}
	status, ok = r.status()
	return r, status, ok
}

// status is the line's result status; ok is false when the line is no result. An OpenAI line
// is ok when its response has status 200, cancelled when its error is batch_cancelled, and an
// error otherwise (jobs.Result.AppendOpenAI).
func (l *outputLine) status() (string, bool) {
	switch {
	case l.CustomID == "":
		return "", false
	case l.Status != "":
		return l.Status, true
	case !strings.HasPrefix(l.ID, "batch_req_"):
		return "", false
	case l.Response != nil && l.Response.StatusCode == 200:
		return string(jobs.StatusOK), true
	case l.Response == nil && l.Error != nil && l.Error.Code == jobs.OpenAICodeBatchCancelled:
		return string(jobs.StatusCancelled), true
	}
	return string(jobs.StatusError), true
}
